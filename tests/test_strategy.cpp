// Mirrored strategy: device specs, buckets, exact all-reduce for every op and replica count,
// N replicas against one replica on the same global batch, bit-identical replicas, divergence
// detection. CPU replicas always; CUDA (including four replicas on GPU 0) when a GPU is present.
#include <doctest/doctest.h>

#include <cmath>
#include <numeric>

#include "data/dataset.h"
#include "data/loader.h"
#include "base/error.h"
#include "kernels/nccl.h"
#include "kernels/ops/optimizer.h"
#include "kernels/ops/peer_sums.h"
#include "kernels/sim/sim.h"
#include "mirrored/config.h"
#include "mirrored/cross_device_ops.h"
#include "mirrored/strategy.h"
#include "tests/helpers.h"
#include "tests/layers.h"

using namespace mirrored;
using namespace mirrored::test;
using ShardMode = StrategyConfig::Shard;

namespace {

// Every replica's device and buffer for one device list, with the cross-device ops built once
// (communicators are expensive to create on real GPUs) and reused for every length.
// MIRRORED_CACHE_DIR at a fresh directory for the scope: no measured choice is read from the
// user's cache or left in it.
struct CacheDirScope {
    TempDir dir;
    bool had;
    std::string saved;
    CacheDirScope() {
        const char* old = std::getenv("MIRRORED_CACHE_DIR");
        had = old != nullptr;
        saved = old ? old : "";
        ::setenv("MIRRORED_CACHE_DIR", dir.path().c_str(), 1);
    }
    ~CacheDirScope() {
        if (had) ::setenv("MIRRORED_CACHE_DIR", saved.c_str(), 1);
        else ::unsetenv("MIRRORED_CACHE_DIR");
    }
};

struct AllReduceFixture {
    std::vector<std::unique_ptr<Device>> devs;
    std::vector<DeviceBuffer<float>> bufs;
    std::unique_ptr<ReplicaThreads> threads;
    std::unique_ptr<CrossDeviceOps> ops;
    size_t capacity;
    DType wire;

    AllReduceFixture(const std::string& op, DeviceType type, const std::vector<int>& ordinals, size_t max_len,
                     DType wire_type = DType::f32)
        : capacity(max_len + 10), wire(wire_type) {
        const int n = int(ordinals.size());
        backend_of(type).enable_peer_access(ordinals);
        std::vector<Device*> dp;
        std::vector<float*> bp;
        for (int r = 0; r < n; ++r) {
            devs.push_back(backend_of(type).make(type == DeviceType::cpu ? r : ordinals[r]));
            bufs.emplace_back(*devs.back(), capacity);
            dp.push_back(devs.back().get());
            bp.push_back(bufs.back().data());
        }
        threads = std::make_unique<ReplicaThreads>(n);
        ops = make_cross_device_ops(op, dp, bp, capacity, threads->barrier(), wire);
    }

    // Sums integer-valued floats and checks every element of every replica is the exact sum
    // (bf16 wire: within 2n roundings - n packs, n - 1 adds - of 2^-9 relative to the sum of magnitudes, every replica
    // still bit-identical), and that the guard elements around [guard, guard + len) are untouched.
    void check(size_t len, Rng& rng) {
        const int n = int(devs.size());
        const size_t guard = 5, total = len + 2 * guard;
        REQUIRE(total <= capacity);
        std::vector<std::vector<float>> host(n);
        for (int r = 0; r < n; ++r) {
            host[r].resize(total);
            for (auto& v : host[r]) v = float(rng.integer(-1000, 1000));
            devs[r]->copy_to_device(devs[r]->compute_stream(), bufs[r].data(), host[r].data(), total * sizeof(float));
            devs[r]->synchronize();
        }
        threads->run([&](int r) {
            ops->all_reduce(r, guard, len);
            devs[r]->synchronize();
        });
        std::vector<float> want(host[0]), bound(total, 0.0f);
        for (size_t i = guard; i < guard + len; ++i) {
            double s = 0, a = 0;
            for (int r = 0; r < n; ++r) s += host[r][i], a += std::fabs(host[r][i]);
            want[i] = float(s);
            bound[i] = wire == DType::f32 ? 0.0f : float(2 * n * a / 512.0);
        }
        bool exact = true, identical = true, untouched = true;
        std::vector<float> first;
        for (int r = 0; r < n; ++r) {
            std::vector<float> got(total);
            devs[r]->copy_to_host(devs[r]->compute_stream(), got.data(), bufs[r].data(), total * sizeof(float));
            devs[r]->synchronize();
            for (size_t i = guard; i < guard + len; ++i) exact = exact && std::fabs(got[i] - want[i]) <= bound[i];
            for (size_t i = 0; i < guard; ++i)
                untouched = untouched && got[i] == host[r][i] && got[total - 1 - i] == host[r][total - 1 - i];
            if (r == 0) first = got;
            else
                for (size_t i = guard; i < guard + len; ++i) identical = identical && got[i] == first[i];
        }
        CAPTURE(ops->name());
        CAPTURE(dtype_name(wire));
        CAPTURE(n);
        CAPTURE(len);
        CHECK(exact);
        CHECK(identical);
        CHECK(untouched);
    }
};

const size_t kLengths[] = {1, 3, 4, 7, 1009, 262147};

void all_reduce_matrix(const std::string& op, DeviceType type, int max_n, bool same_gpu, DType wire = DType::f32) {
    Rng rng(31 + max_n);
    for (int n = 1; n <= max_n; ++n) {
        std::vector<int> ordinals;
        for (int r = 0; r < n; ++r) ordinals.push_back(same_gpu ? 0 : r);
        AllReduceFixture f(op, type, ordinals, 262147, wire);
        for (size_t len : kLengths) f.check(len, rng);
    }
}

struct TrainResult {
    std::vector<float> params;
    std::vector<uint64_t> checksums;
    Metrics metrics;
    std::string ops, ops_choice;  // the cross-device ops used, and how `auto` chose them
    uint64_t graph_launches = 0;  // steps replayed from captured graphs
};

// The small synthetic problem the strategy tests train on: 12 features, 5 classes, 480 samples.
Dataset small_problem(uint64_t seed = SyntheticOptions{}.seed) {
    SyntheticOptions so;
    so.shape = {12};
    so.classes = 5;
    so.samples = 480;
    so.seed = seed;
    return make_synthetic(so);
}

// `steps` optimizer steps on a small synthetic problem, the learning rate falling each step;
// returns replica 0's parameters. op "shared": strategy.shared_parameters (the gradients need no
// op). graph: strategy.cuda_graph. fused: strategy.fused_epilogues. shard: strategy.shard
// optimizer; state (may be null): the optimizer state at the end, gathered. piece_floats: the
// model's gradient pieces (Model, gradient_piece_floats).
TrainResult train(const std::string& devices, int steps, double bucket_mb, int accumulation = 1,
                  const std::string& opt_type = "sgd", double clip = 0.0, const std::string& op = "ring",
                  bool graph = false, bool fused = false, ShardMode shard = ShardMode::none,
                  std::vector<std::pair<std::string, std::vector<float>>>* state = nullptr, size_t piece_floats = 0) {
    const Dataset ds = small_problem(7);
    const Model model(
        {12}, {dense(16, Activation::relu), dropout(0.2f), dense(16, Activation::gelu), dense(5, Activation::none)}, 3,
        false, piece_floats);
    OptimizerConfig oc;
    oc.type = opt_type;
    oc.lr = opt_type == "sgd" ? 0.1 : 0.01;
    oc.weight_decay = 1e-3;
    oc.grad_clip_norm = clip;
    StrategyConfig sc;
    sc.devices = devices;
    sc.bucket_mb = bucket_mb;
    sc.verify_every_steps = 5;
    sc.cross_device_ops = op == "shared" ? "ring" : op;
    sc.shared_parameters = op == "shared";
    sc.cuda_graph = graph;
    sc.fused_epilogues = fused;
    sc.shard = shard;
    const int global = 24;
    MirroredStrategy strategy(sc, model, oc, global, accumulation);
    LoaderOptions lo;
    lo.global_batch = global;
    lo.threads = 2;
    lo.consumers = strategy.replicas();
    lo.seed = 11;
    Loader loader(ds, lo, strategy.host_allocator());
    loader.start({});
    strategy.init_and_broadcast();
    for (int s = 0; s < steps; ++s)
        strategy.train_step(strategy.next_batch(loader), s, float(oc.lr * (1.0 - 0.02 * s)), 99, false);
    strategy.request_train_metrics();
    TrainResult out;
    out.graph_launches = strategy.host_work().all.graph_launches;
    out.metrics = strategy.take_train_metrics();
    out.params = strategy.download_params();
    for (int r = 0; r < strategy.replicas(); ++r) out.checksums.push_back(strategy.checksum(r));
    out.ops = strategy.cross_device_ops_name();
    out.ops_choice = strategy.cross_device_ops_choice();
    if (state) *state = strategy.download_optimizer_state();
    return out;
}

struct CnnResult {
    std::vector<float> params;  // replica 0's, running statistics included (after the first `trainable`)
    size_t trainable = 0;
    std::vector<uint64_t> checksums;
    Metrics metrics;
    float loss_scale = 1;
};

// A small CNN with batchnorm (synchronised or per replica) on images of a synthetic problem.
CnnResult train_cnn(const std::string& devices, int steps, bool sync, Precision precision = Precision::fp32,
                    int overflow_step = -1, int overflow_replica = 1, std::vector<float>* before_overflow = nullptr,
                    DType wire = DType::f32, bool shared = false, bool graph = false,
                    ShardMode shard = ShardMode::none) {
    SyntheticOptions so;
    so.shape = {6, 6, 2};
    so.classes = 3;
    so.samples = 360;
    so.seed = 8;
    const Dataset ds = make_synthetic(so);
    const Model model(
        {6, 6, 2},
        {conv(4, 3, 1, true, Activation::none), batchnorm(sync, Activation::relu), maxpool(2),
         residual({conv(4, 3, 1, true, Activation::none), batchnorm(sync, Activation::none)}, "", Activation::relu),
         flatten(), dense(3, Activation::none)},
        4);
    OptimizerConfig oc;
    oc.lr = 0.05;
    StrategyConfig sc;
    sc.devices = devices;
    sc.bucket_mb = 0.0002;
    sc.verify_every_steps = 3;
    sc.precision = precision;
    sc.allreduce_dtype = wire;
    sc.shared_parameters = shared;
    sc.cuda_graph = graph;
    sc.shard = shard;
    const int global = 24;
    MirroredStrategy strategy(sc, model, oc, global, 1);
    LoaderOptions lo;
    lo.global_batch = global;
    lo.consumers = strategy.replicas();
    lo.seed = 11;
    Loader loader(ds, lo, strategy.host_allocator());
    loader.start({});
    strategy.init_and_broadcast();
    for (int s = 0; s < steps; ++s) {
        if (s == overflow_step) {
            if (before_overflow) *before_overflow = strategy.download_params();
            strategy.test_inject_overflow(overflow_replica);
        }
        strategy.train_step(strategy.next_batch(loader), s, float(oc.lr), 99, false);
    }
    strategy.request_train_metrics();
    CnnResult out;
    out.metrics = strategy.take_train_metrics();
    out.params = strategy.download_params();
    out.loss_scale = strategy.loss_scale_state()[0];
    out.trainable = model.trainable_size();
    for (int r = 0; r < strategy.replicas(); ++r) out.checksums.push_back(strategy.checksum(r));
    return out;
}

// Steps [from, to) until a device error: its message, or "" when none came.
std::string steps_until_error(MirroredStrategy& st, Loader& loader, int from, int to) {
    try {
        for (int s = from; s < to; ++s) st.train_step(st.next_batch(loader), s, 0.1f, 1, false);
        st.synchronize();
    } catch (const DeviceError& e) {
        return e.what();
    }
    return "";
}

}  // namespace

TEST_CASE("device specs: auto, cpu:N, sim lists, and clear errors for malformed ones") {
    CHECK(parse_devices("cpu:3").ordinals == std::vector<int>{0, 1, 2});
    CHECK(parse_devices("cpu:3").backend->type == DeviceType::cpu);
    CHECK(parse_devices("cpu:3").describe() == "cpu:0,cpu:1,cpu:2");
    CHECK(!parse_devices("auto").ordinals.empty());
    CHECK(parse_devices("sim:0,0,1").ordinals == std::vector<int>{0, 0, 1});
    CHECK(parse_devices("sim:0,0,1").backend->type == DeviceType::sim);
    CHECK(parse_devices("sim:2").describe() == "sim:2");
    CHECK_THROWS_WITH_AS(parse_devices("gpu:0"), doctest::Contains("strategy.devices"), ConfigError);
    CHECK_THROWS_WITH_AS(parse_devices("cpu:0"), doctest::Contains("cpu:N"), ConfigError);
    CHECK_THROWS_WITH_AS(parse_devices("cpu:x"), doctest::Contains("like cpu:4"), ConfigError);
    CHECK_THROWS_WITH_AS(parse_devices("cpu:100000"), doctest::Contains("1 to 1024"), ConfigError);
    CHECK_THROWS_WITH_AS(parse_devices("sim:0,,1"), doctest::Contains("like sim:0,1"), ConfigError);
    CHECK_THROWS_WITH_AS(parse_devices("sim:64"), doctest::Contains("0 to 63"), ConfigError);
    CHECK_THROWS_WITH_AS(parse_devices(""), doctest::Contains("expected auto"), ConfigError);
    if (!have_cuda()) {
        CHECK_THROWS_AS(parse_devices("cuda:0"), DeviceError);
        CHECK(parse_devices("auto").backend->type == DeviceType::cpu);
    } else {
        CHECK(parse_devices("cuda:0,0,0,0").ordinals == std::vector<int>{0, 0, 0, 0});
        CHECK_THROWS_AS(parse_devices("cuda:99"), DeviceError);
    }
}

TEST_CASE("device specs: a driver that cannot run this build fails auto and cuda with exit 5; no driver means CPU") {
    CudaStatus broken;
    broken.state = CudaStatus::State::unusable;
    broken.reason =
        "the NVIDIA driver supports CUDA 12.2, but this build needs CUDA 13.0: install a newer NVIDIA driver";
    CHECK_THROWS_WITH_AS(parse_devices("auto", broken), doctest::Contains("install a newer NVIDIA driver"),
                         DeviceError);
    CHECK_THROWS_WITH_AS(parse_devices("cuda:0", broken), doctest::Contains("asks for GPUs"), DeviceError);
    CHECK(parse_devices("cpu:2", broken).backend->type == DeviceType::cpu);  // an explicit CPU run still works
    CudaStatus none;
    none.state = CudaStatus::State::no_driver;
    none.reason = "no NVIDIA driver is loaded";
    CHECK(parse_devices("auto", none).backend->type == DeviceType::cpu);
    CudaStatus cpu_build;
    CHECK(cpu_build.state == CudaStatus::State::not_compiled);
    CHECK(parse_devices("auto", cpu_build).backend->type == DeviceType::cpu);
    CudaStatus two;
    two.state = CudaStatus::State::ok;
    two.devices = 2;
    CHECK(parse_devices("auto", two).describe() == "cuda:0,cuda:1");
    CHECK_THROWS_WITH_AS(parse_devices("cuda:2", two), doctest::Contains("2 GPU(s) visible"), DeviceError);
}

TEST_CASE("buckets tile the gradient buffer in reverse layer order") {
    const Model m({100}, {dense(300, Activation::relu), dense(200, Activation::relu), dense(10, Activation::none)}, 1);
    for (double mb : {0.0, 0.01, 0.1, 1.0, 100.0}) {
        const auto b = make_buckets(m, mb);
        CAPTURE(mb);
        REQUIRE(!b.empty());
        CHECK(b.front().end == m.flat_size());
        CHECK(b.back().begin == 0);
        for (size_t i = 1; i < b.size(); ++i) {
            CHECK(b[i].end == b[i - 1].begin);
            CHECK(b[i].ready_after_unit <= b[i - 1].ready_after_unit);
        }
        if (mb == 0.0 || mb == 100.0) CHECK(b.size() == 1);
    }
    CHECK(make_buckets(m, 0.001).size() == 4);
}

TEST_CASE("cpu all-reduce (ring, direct, reduce_to_one) is exact and bit-identical for N = 1..8, any length") {
    all_reduce_matrix("ring", DeviceType::cpu, 8, false);
    all_reduce_matrix("direct", DeviceType::cpu, 8, false);
    all_reduce_matrix("reduce_to_one", DeviceType::cpu, 8, false);
}

namespace {

// sum_into on device d: in place into one buffer, its own value first, then the others in
// order; nothing else written.
void check_sum_into(Device& d) {
    test::Rng rng(21);
    for (int count : {2, 3, 5}) {
        for (size_t n : {size_t(1), size_t(1000), size_t(5000)}) {
            std::vector<std::vector<float>> before;
            std::vector<DeviceBuffer<float>> bufs;
            std::vector<float*> ptrs;
            for (int k = 0; k < count; ++k) {
                before.push_back(rng.normal(n + 8));
                bufs.push_back(upload(d, before.back()));
                ptrs.push_back(bufs.back().data());
            }
            const int into = count - 1;
            sum_into(d, d.compute_stream(), ptrs.data(), count, into, 3, n);
            const std::vector<float> got = download(d, bufs[size_t(into)]);
            bool exact = true;
            for (size_t i = 0; i < n + 8; ++i) {
                float want = before[size_t(into)][i];
                if (i >= 3 && i < 3 + n)
                    for (int k = 0; k < count; ++k)
                        if (k != into) want += before[size_t(k)][i];
                exact = exact && got[i] == want;  // the stated order, bit for bit; outside the range untouched
            }
            CAPTURE(d.name());
            CAPTURE(count);
            CAPTURE(n);
            CHECK(exact);
            for (int k = 0; k < into; ++k) CHECK(download(d, bufs[size_t(k)]) == before[size_t(k)]);
        }
    }
}

// summed_sgd_update / summed_adamw_update on device d against sum_into followed by the
// plain update, on copies: the same parameters and optimizer state bit for bit, for 1-3 buffers,
// either end's buffer as the own one, slices shorter than, equal to and spanning blocks.
void check_summed_update(Device& d) {
    test::Rng rng(22);
    const Stream s = d.compute_stream();
    enum class Opt { sgd, sgd_nesterov_decay, sgd_plain, adamw };
    for (Opt opt : {Opt::sgd, Opt::sgd_nesterov_decay, Opt::sgd_plain, Opt::adamw})
        for (int count : {1, 2, 3})
            for (int into : {0, count - 1})
                for (size_t n : {size_t(1), size_t(1024), size_t(2500)}) {
                    const size_t offset = 3, total = n + 8;
                    std::vector<std::vector<float>> g;
                    for (int k = 0; k < count; ++k) g.push_back(rng.normal(total, 0.1f));
                    const auto p0 = rng.normal(n), m0 = rng.normal(n, 0.1f), v0 = rng.uniform(n, 0.0f, 0.01f);
                    SgdArgs sa;
                    sa.lr = 0.05f;
                    sa.momentum = opt == Opt::sgd_plain ? 0.0f : 0.9f;
                    sa.nesterov = opt == Opt::sgd_nesterov_decay;
                    sa.weight_decay = opt == Opt::sgd_nesterov_decay ? 1e-2f : 0.0f;
                    AdamWArgs aa;
                    aa.lr = 1e-3f;
                    aa.weight_decay = 1e-2f;
                    aa.step = 7;
                    // fused: summed_*_update reads every buffer; separate: sum_into, then the update
                    auto run = [&](bool fused) {
                        std::vector<DeviceBuffer<float>> bufs;
                        std::vector<float*> ptrs;
                        for (int k = 0; k < count; ++k) {
                            bufs.push_back(upload(d, g[size_t(k)]));
                            ptrs.push_back(bufs.back().data());
                        }
                        auto p = upload(d, p0), m = upload(d, m0), v = upload(d, v0);
                        float* mom = opt == Opt::sgd_plain ? nullptr : m.data();
                        if (fused && opt == Opt::adamw)
                            summed_adamw_update(d, s, ptrs.data(), count, into, offset, n, p.data(), m.data(), v.data(),
                                                aa);
                        else if (fused) summed_sgd_update(d, s, ptrs.data(), count, into, offset, n, p.data(), mom, sa);
                        else {
                            sum_into(d, s, ptrs.data(), count, into, offset, n);
                            const float* sum = ptrs[size_t(into)] + offset;
                            if (opt == Opt::adamw) adamw_update(d, s, n, p.data(), sum, m.data(), v.data(), aa);
                            else sgd_update(d, s, n, p.data(), sum, mom, sa);
                        }
                        auto out = download(d, p);
                        for (auto* b : {&m, &v}) {
                            const auto h = download(d, *b);
                            out.insert(out.end(), h.begin(), h.end());
                        }
                        return out;
                    };
                    const auto fused = run(true), separate = run(false);
                    CAPTURE(d.name());
                    CAPTURE(int(opt));
                    CAPTURE(count);
                    CAPTURE(into);
                    CAPTURE(n);
                    CHECK(fused == separate);
                    CHECK(!std::equal(p0.begin(), p0.end(), fused.begin()));  // an update happened
                }
}

}  // namespace

TEST_CASE(
    "sum_into (cpu, sim): in place into one buffer, its own value first, then the others in order; nothing else "
    "written") {
    SimScope sim(30);
    check_sum_into(*make_cpu_device(0));
    check_sum_into(*make_sim_device(0));
}

TEST_CASE("summed optimizer updates (cpu; sim's default: the two calls) equal sum_into then the update, bit for bit") {
    SimScope sim(31);
    check_summed_update(*make_cpu_device(0));
    check_summed_update(*make_sim_device(0));
}

TEST_CASE("cuda sum_into equals the CPU's order bit for bit" * doctest::test_suite("cuda")) {
    SKIP_WITHOUT_CUDA();
    check_sum_into(*make_cuda_device(0));
}

TEST_CASE(
    "shared parameters (CPU replicas): N = 2, 3, 4 match one replica; N = 2 equals the ring bit for bit; one copy") {
    const TrainResult one = train("cpu:1", 6, 0.0);
    for (const char* devices : {"cpu:2", "cpu:3", "cpu:4"}) {
        CAPTURE(devices);
        const TrainResult shared = train(devices, 6, 0.0005, 1, "sgd", 0.0, "shared");
        CHECK(shared.ops == std::string("shared"));
        CHECK(rel_error(shared.params, one.params) < 1e-5);
        CHECK(shared.metrics.count == one.metrics.count);
        for (uint64_t c : shared.checksums) CHECK(c == shared.checksums[0]);
    }
    // two replicas: a + b in either order, the update elementwise: the ring's bits exactly
    CHECK(train("cpu:2", 6, 0.0005, 1, "sgd", 0.0, "shared").params == train("cpu:2", 6, 0.0005).params);
    // AdamW with clipping (the norm summed over the slices) and accumulation
    const TrainResult adam_one = train("cpu:1", 6, 0.0, 2, "adamw", 0.5);
    for (const char* devices : {"cpu:2", "cpu:3"}) {
        CAPTURE(devices);
        const TrainResult adam = train(devices, 6, 0.0, 2, "adamw", 0.5, "shared");
        CHECK(rel_error(adam.params, adam_one.params) < 1e-5);
    }
    // the memory plan counts the one copy in shares
    const Model model({12}, {dense(16, Activation::relu), dense(5, Activation::none)}, 3);
    OptimizerConfig oc;  // sgd, momentum 0.9
    StrategyConfig sc;
    const MemoryPlan own = plan_memory(model, oc, sc, backend_of(DeviceType::cpu), 4, 6, 6);
    CHECK_FALSE(parameters_shared(sc, parse_devices("cpu:4")));
    sc.shared_parameters = true;
    const MemoryPlan part =
        plan_memory(model, oc, sc, backend_of(DeviceType::cpu), 4, 6, 6, parameters_shared(sc, parse_devices("cpu:4")));
    CHECK(part.params == (own.params + 3) / 4);
    CHECK(part.optimizer == (own.optimizer + 3) / 4);
    CHECK(part.grads == own.grads);
    // replicas of one GPU share; distinct GPUs, one replica, or several nodes keep their copies
    CHECK(parameters_shared(sc, parse_devices("sim:0,0,0,0")));
    CHECK_FALSE(parameters_shared(sc, parse_devices("sim:0,1,2,3")));
    CHECK_FALSE(parameters_shared(sc, parse_devices("sim:0,0,0,0"), true));
    CHECK_FALSE(parameters_shared(sc, parse_devices("cpu:1")));
    CHECK(parameters_shared(sc, parse_devices("cpu:2"), true));  // CPU replicas sum between nodes on the host
}

TEST_CASE(
    "shared parameters on one simulated GPU: equal to CPU replicas bit for bit, to one replica within 1e-5; with "
    "graphs too") {
    SimScope sim(30);
    const TrainResult one = train("cpu:1", 8, 0.0, 2, "adamw", 0.5);
    for (const char* devices : {"sim:0,0", "sim:0,0,0,0"}) {
        CAPTURE(devices);
        const std::string cpu = "cpu:" + std::to_string(parse_devices(devices).ordinals.size());
        const TrainResult shared = train(devices, 8, 0.0005, 2, "adamw", 0.5, "shared");
        CHECK(shared.ops == std::string("shared"));
        CHECK(rel_error(shared.params, one.params) < 1e-5);
        // the same ops in the same order per element: the CPU replicas' bits exactly
        CHECK(shared.params == train(cpu, 8, 0.0005, 2, "adamw", 0.5, "shared").params);
        const TrainResult graph = train(devices, 8, 0.0005, 2, "adamw", 0.5, "shared", true);
        CHECK(graph.graph_launches == 6);
        CHECK(graph.params == shared.params);
        for (uint64_t c : graph.checksums) CHECK(c == graph.checksums[0]);
    }
    // distinct GPUs keep their copies (the ring runs)
    CHECK(train("sim:0,1", 2, 0.0, 1, "sgd", 0.0, "shared").ops == std::string("ring"));
    // synchronised batchnorm and fp16 loss scaling by slices on one GPU: as on CPU replicas (their
    // convolutions in the GPU's column order, for the same bits)
    const CnnResult cpu_cnn = [] {
        struct ChannelMajor {
            ChannelMajor() { ::setenv("MIRRORED_PIXEL_MAJOR_COLUMNS", "0", 1); }
            ~ChannelMajor() { ::unsetenv("MIRRORED_PIXEL_MAJOR_COLUMNS"); }
        } scope;
        return train_cnn("cpu:3", 6, true, Precision::fp16, -1, 1, nullptr, DType::f32, true);
    }();
    const CnnResult sim_cnn = train_cnn("sim:0,0,0", 6, true, Precision::fp16, -1, 1, nullptr, DType::f32, true);
    const CnnResult sim_graph =
        train_cnn("sim:0,0,0", 6, true, Precision::fp16, -1, 1, nullptr, DType::f32, true, true);
    CHECK(sim_cnn.params == cpu_cnn.params);
    CHECK(sim_graph.params == cpu_cnn.params);
}

TEST_CASE("shared parameters: synchronised batchnorm, running statistics and fp16 loss scaling by slices") {
    const CnnResult one = train_cnn("cpu:1", 8, true);
    const CnnResult shared = train_cnn("cpu:3", 8, true, Precision::fp32, -1, 1, nullptr, DType::f32, true);
    CHECK(rel_error(shared.params, one.params) < 1e-4);  // running statistics included
    for (uint64_t c : shared.checksums) CHECK(c == shared.checksums[0]);
    // an overflow in one replica's gradients skips the step everywhere, as without sharing
    std::vector<float> before;
    const CnnResult skipped = train_cnn("cpu:2", 6, true, Precision::fp16, 5, 1, &before, DType::f32, true);
    const CnnResult unshared = train_cnn("cpu:2", 6, true, Precision::fp16, 5, 1, nullptr);
    CHECK(skipped.loss_scale == unshared.loss_scale);
    CHECK(skipped.loss_scale < MirroredStrategy::kInitialLossScale);
    CHECK(std::equal(before.begin(), before.begin() + long(skipped.trainable), skipped.params.begin()));
    CHECK(rel_error(skipped.params, unshared.params) < 1e-4);
}

TEST_CASE("cpu all-reduce with a bf16 wire: close to the f32 sum, bit-identical on every replica") {
    all_reduce_matrix("ring", DeviceType::cpu, 5, false, DType::bf16);
    all_reduce_matrix("reduce_to_one", DeviceType::cpu, 3, false, DType::bf16);
    all_reduce_matrix("direct", DeviceType::cpu, 4, false, DType::bf16);
}

TEST_CASE("sim all-reduce with a bf16 wire: ring (direct and staged), reduce_to_one, nccl") {
    SimScope sim(30);
    all_reduce_matrix("ring", DeviceType::sim, 4, false, DType::bf16);
    all_reduce_matrix("reduce_to_one", DeviceType::sim, 3, true, DType::bf16);
    all_reduce_matrix("nccl", DeviceType::sim, 3, false, DType::bf16);
    all_reduce_matrix("direct", DeviceType::sim, 3, true, DType::bf16);
    set_peer_transport(PeerTransport::staged);
    Rng rng(79);
    AllReduceFixture f("ring", DeviceType::sim, {0, 1, 2}, size_t(5) << 20, DType::bf16);
    for (size_t len : {size_t(1009), size_t(5) << 20}) f.check(len, rng);  // 2-byte elements: several slices
    set_peer_transport(PeerTransport::automatic);
}

TEST_CASE("sim all-reduce with random stream delays: ring, reduce_to_one, nccl; shared, direct and staged") {
    SimScope sim(30);
    all_reduce_matrix("ring", DeviceType::sim, 5, true);  // replicas sharing one GPU
    all_reduce_matrix("reduce_to_one", DeviceType::sim, 4, true);
    all_reduce_matrix("ring", DeviceType::sim, 5, false);    // distinct GPUs, direct peer loads
    all_reduce_matrix("nccl", DeviceType::sim, 4, false);    // the rendezvous
    all_reduce_matrix("direct", DeviceType::sim, 6, true);   // one op per replica and bucket
    all_reduce_matrix("direct", DeviceType::sim, 4, false);  // peer loads and stores
    set_peer_transport(PeerTransport::staged);               // forced staging, peer access on
    Rng rng(78);
    for (int n : {2, 3}) {
        std::vector<int> ord;
        for (int r = 0; r < n; ++r) ord.push_back(r);
        AllReduceFixture f("ring", DeviceType::sim, ord, size_t(5) << 20);
        for (size_t len : {size_t(1), size_t(1009), size_t(3) << 20}) f.check(len, rng);  // several slices
    }
    set_peer_transport(PeerTransport::automatic);
}

TEST_CASE("sim: without peer access distinct GPUs take the staged path, and the topology report says why") {
    SimScope sim(20, /*peer_access=*/false);
    const auto staged = backend_of(DeviceType::sim).enable_peer_access({0, 1, 2});
    CHECK(staged.size() == 6);
    Rng rng(79);
    AllReduceFixture f("ring", DeviceType::sim, {0, 1, 2}, size_t(3) << 20);
    for (size_t len : {size_t(5), size_t(3) << 20}) f.check(len, rng);
    set_peer_transport(PeerTransport::direct);  // direct loads without peer access are refused
    CHECK_THROWS_WITH_AS(f.devs[0]->reduce_from_peer(f.devs[0]->comm_stream(), f.bufs[0].data(), *f.devs[1],
                                                     f.bufs[1].data(), DType::f32, 4),
                         doctest::Contains("need peer access"), DeviceError);
    set_peer_transport(PeerTransport::automatic);
    const Model model({6}, {dense(3, Activation::none)}, 1);
    StrategyConfig sc;
    sc.devices = "sim:0,1";
    MirroredStrategy st(sc, model, OptimizerConfig{}, 6, 1);
    CHECK(st.topology_report().find("sim:0 -> sim:1: staged peer copies (peer access unsupported") !=
          std::string::npos);
    // direct needs every replica to load every other's memory, and says so rather than stage
    CHECK_THROWS_WITH_AS(AllReduceFixture("direct", DeviceType::sim, {0, 1}, 16),
                         doctest::Contains("sim:0 cannot load sim:1's (no peer access)"), ConfigError);
    CHECK_NOTHROW(AllReduceFixture("direct", DeviceType::sim, {1, 1}, 16));  // one GPU always can
}

TEST_CASE(
    "replica threads: each job runs once on every replica, back to back; a failure is rethrown and frees the others") {
    for (int n : {1, 2, 3, 8}) {  // 2 spins between jobs on this machine's 2 cores; 8 sleeps at once
        CAPTURE(n);
        ReplicaThreads threads(n);
        std::vector<std::atomic<int>> runs(static_cast<size_t>(n));
        std::atomic<int> crossed{0}, early{0};
        for (int job = 0; job < 300; ++job) {
            threads.run([&](int r) {
                runs[size_t(r)].fetch_add(1);
                threads.barrier().arrive_and_wait();
                // every replica has run this job before any leaves the barrier
                for (auto& c : runs) early.fetch_add(c.load() != job + 1);
                crossed.fetch_add(1);
            });
            REQUIRE(crossed.load() == n * (job + 1));  // run() returns only after every replica
        }
        CHECK(early.load() == 0);
        if (n == 1) continue;
        // replica n-1 throws while the others wait at the barrier: the others are freed, run()
        // rethrows the failure, and the threads take the next job normally
        CHECK_THROWS_WITH(threads.run([&](int r) {
            if (r == n - 1) throw std::runtime_error("replica failed");
            threads.barrier().arrive_and_wait();
        }),
                          "replica failed");
        std::atomic<int> after{0};
        threads.run([&](int) {
            threads.barrier().arrive_and_wait();
            after.fetch_add(1);
        });
        CHECK(after.load() == n);
    }
}

TEST_CASE("nccl refuses CPU replicas and repeated GPUs; unknown ops list the known ones") {
    SimScope sim(0);
    auto d = make_cpu_device(0);
    DeviceBuffer<float> b(*d, 4);
    ReplicaBarrier barrier(1);
    CHECK_THROWS_AS(make_cross_device_ops("nccl", {d.get()}, {b.data()}, 4, barrier), ConfigError);
    CHECK_THROWS_WITH_AS(make_cross_device_ops("tree", {d.get()}, {b.data()}, 4, barrier),
                         doctest::Contains("ring, direct, nccl, reduce_to_one"), ConfigError);
    auto s0 = make_sim_device(0), s1 = make_sim_device(0);
    DeviceBuffer<float> x(*s0, 4), y(*s1, 4);
    ReplicaBarrier two(2);
    CHECK_THROWS_WITH_AS(make_cross_device_ops("nccl", {s0.get(), s1.get()}, {x.data(), y.data()}, 4, two),
                         doctest::Contains("cannot place two replicas"), ConfigError);
}

TEST_CASE("nccl: one group of communicators per device list while it is held, shared by the run's ops") {
    SimScope sim(0);
    auto a = make_sim_device(0), b = make_sim_device(1);
    const std::vector<Device*> ab{a.get(), b.get()}, ba{b.get(), a.get()};
    std::shared_ptr<NcclGroup> g = shared_nccl_group(ab);
    CHECK(shared_nccl_group(ab) == g);
    CHECK(shared_nccl_group(ba) != g);  // other ranks: other communicators
    DeviceBuffer<float> x(*a, 8), y(*b, 8);
    ReplicaBarrier barrier(2);
    {
        auto ops = make_cross_device_ops("nccl", ab, {x.data(), y.data()}, 8, barrier);
        CHECK(g.use_count() == 2);  // the op holds the same group
    }
    CHECK(g.use_count() == 1);
    const std::weak_ptr<NcclGroup> gone = g;
    g.reset();
    CHECK(gone.expired());  // released with its last holder: its communicators are finalized
}

TEST_CASE("N cpu replicas match one replica on the same global batch (N = 2, 3, 4; buckets on and off)") {
    const TrainResult one = train("cpu:1", 6, 0.0);
    for (const char* devices : {"cpu:2", "cpu:3", "cpu:4"})
        for (double mb : {0.0, 0.0005}) {
            CAPTURE(devices);
            CAPTURE(mb);
            const TrainResult many = train(devices, 6, mb);
            CHECK(rel_error(many.params, one.params) < 1e-5);
            CHECK(many.metrics.count == one.metrics.count);
            CHECK(many.metrics.loss_sum == doctest::Approx(one.metrics.loss_sum).epsilon(1e-5));
        }
}

TEST_CASE("simulated GPUs with random delays: one replica equals the CPU run bit for bit; N replicas match one") {
    SimScope sim(40);
    const TrainResult cpu = train("cpu:1", 6, 0.0);
    const TrainResult one = train("sim:0", 6, 0.0);
    CHECK(one.params == cpu.params);  // the same reference ops in the same order
    CHECK(one.metrics.loss_sum == cpu.metrics.loss_sum);
    for (const char* devices : {"sim:0,0", "sim:0,0,0,0", "sim:0,1,2"})
        for (double mb : {0.0, 0.0005}) {
            CAPTURE(devices);
            CAPTURE(mb);
            const TrainResult many = train(devices, 6, mb);
            CHECK(rel_error(many.params, one.params) < 1e-5);
            CHECK(many.params ==
                  train(std::string("cpu:") + std::to_string(parse_devices(devices).ordinals.size()), 6, mb).params);
            CHECK(many.metrics.count == one.metrics.count);
            for (uint64_t c : many.checksums) CHECK(c == many.checksums[0]);
        }
}

TEST_CASE("simulated GPUs: direct, nccl and reduce_to_one train like the ring; accumulation and AdamW with clipping") {
    SimScope sim(30);
    const TrainResult one = train("cpu:1", 5, 0.0, 1, "adamw", 0.5);
    for (const char* devices : {"sim:0,1,2", "sim:0,0,0"})
        for (const char* op : {"ring", "direct", "nccl", "reduce_to_one"}) {
            if (std::string(devices) == "sim:0,0,0" && std::string(op) == "nccl") continue;  // one rank per GPU
            CAPTURE(devices);
            CAPTURE(op);
            const TrainResult many = train(devices, 5, 0.0005, 2, "adamw", 0.5, op);
            CHECK(rel_error(many.params, one.params) < 1e-5);
            for (uint64_t c : many.checksums) CHECK(c == many.checksums[0]);
        }
    // direct sums every element in replica order on every backend: sim equals CPU bit for bit
    const TrainResult sim3 = train("sim:0,0,0", 5, 0.0005, 2, "adamw", 0.5, "direct");
    const TrainResult cpu3 = train("cpu:3", 5, 0.0005, 2, "adamw", 0.5, "direct");
    CHECK(sim3.params == cpu3.params);
}

TEST_CASE("cross_device_ops auto: times what the devices can run, caches the choice, trains exactly as the chosen op") {
    SimScope sim(0);
    CacheDirScope cache;
    for (const char* devices : {"cpu:3", "sim:0,0,0", "sim:0,1,2"}) {
        CAPTURE(devices);
        const TrainResult first = train(devices, 4, 0.0005, 1, "sgd", 0.0, "auto");
        CHECK(first.ops_choice.find("auto, measured: ring ") == 0);
        CHECK(first.ops_choice.find("direct ") != std::string::npos);  // every replica can load every buffer
        const bool gpus = std::string(devices) == "sim:0,1,2";
        CHECK((first.ops_choice.find("nccl ") != std::string::npos) == gpus);  // one rank per GPU only
        const TrainResult again = train(devices, 4, 0.0005, 1, "sgd", 0.0, "auto");
        CHECK(again.ops == first.ops);
        CHECK(again.ops_choice.find("auto, cached: ") == 0);
        // measuring leaves nothing behind: the run equals one that named the op
        const TrainResult named = train(devices, 4, 0.0005, 1, "sgd", 0.0, first.ops);
        CHECK(named.ops_choice.empty());
        CHECK(first.params == named.params);
    }
    // another bucket layout is another measurement
    CHECK(train("cpu:3", 1, 0.0, 1, "sgd", 0.0, "auto").ops_choice.find("measured") != std::string::npos);
    // distinct GPUs without peer access: direct is not a candidate
    sim_reset();
    sim_set_peer_access(false);
    const TrainResult staged = train("sim:0,1", 2, 0.0, 1, "sgd", 0.0, "auto");
    CHECK(staged.ops_choice.find("direct") == std::string::npos);
    CHECK(staged.ops != "direct");
}

TEST_CASE(
    "cross_device_ops auto, resuming: the checkpoint's op is kept when the devices run it, else measured and said") {
    CacheDirScope cache;
    std::vector<std::unique_ptr<Device>> owned;
    std::vector<DeviceBuffer<float>> bufs;
    std::vector<Device*> devices;
    std::vector<float*> buffers;
    for (int r = 0; r < 3; ++r) owned.push_back(make_cpu_device(r));
    for (auto& d : owned) {
        devices.push_back(d.get());
        bufs.emplace_back(*d, 1000);
        buffers.push_back(bufs.back().data());
    }
    ReplicaThreads threads(3);
    const std::vector<std::pair<size_t, size_t>> ranges{{0, 600}, {600, 400}};
    for (const char* op : {"ring", "direct"}) {  // both run on CPU replicas: kept, nothing measured
        CAPTURE(op);
        const OpsChoice kept = choose_cross_device_ops(devices, buffers, 1000, ranges, threads, DType::f32, op);
        CHECK(kept.name == op);
        CHECK(kept.how.find("the op of the checkpoint resumed from") == 0);
        CHECK(std::filesystem::is_empty(cache.dir.path()));  // no measurement was made or stored
    }
    // nccl needs one GPU per replica; "shared" is no op: measured, and a foreign op is named
    const OpsChoice foreign = choose_cross_device_ops(devices, buffers, 1000, ranges, threads, DType::f32, "nccl");
    CHECK(foreign.how.find("the checkpoint's nccl is not among the ops auto chooses from here; measured: ring ") == 0);
    CHECK(foreign.name != "nccl");
    const OpsChoice none = choose_cross_device_ops(devices, buffers, 1000, ranges, threads, DType::f32, "shared");
    CHECK(none.how.find("cached: ") == 0);
}

TEST_CASE("gradient accumulation and AdamW with clipping: N replicas still match one") {
    const TrainResult one = train("cpu:1", 5, 0.0, 1, "adamw", 0.5);
    const TrainResult acc = train("cpu:2", 5, 0.0005, 3, "adamw", 0.5);
    CHECK(rel_error(acc.params, one.params) < 1e-5);
}

TEST_CASE("replicas stay bit-identical over many steps; verify_every_steps checks it") {
    const TrainResult r = train("cpu:3", 40, 0.0005);  // verify runs every 5 steps inside
    for (uint64_t c : r.checksums) CHECK(c == r.checksums[0]);
}

TEST_CASE("verify_replicas names the tensor and replica of a deliberately corrupted copy") {
    SimScope sim(0);
    for (const char* devices : {"cpu:3", "sim:0,0,1"}) {
        CAPTURE(devices);
        const Model model({6}, {dense(8, Activation::relu), dense(3, Activation::none)}, 1);
        StrategyConfig sc;
        sc.devices = devices;
        MirroredStrategy s(sc, model, OptimizerConfig{}, 6, 1);
        s.init_and_broadcast();
        s.verify_replicas();
        Replica& R = s.replica(2);
        const TensorInfo* t = model.find("layers.1.weight");
        const float bad = 123.0f;
        R.device->copy_to_device(R.device->compute_stream(), R.params.data() + t->offset + 2, &bad, sizeof bad);
        CHECK_THROWS_WITH_AS(s.verify_replicas(), doctest::Contains("layers.1.weight on replica 2"), DeviceError);
        CHECK(s.checksum(2) != s.checksum(1));
    }
}

TEST_CASE("global batch must divide into replicas x accumulation steps") {
    const Model model({6}, {dense(3, Activation::none)}, 1);
    StrategyConfig sc;
    sc.devices = "cpu:3";
    CHECK_THROWS_WITH_AS(MirroredStrategy(sc, model, OptimizerConfig{}, 10, 1),
                         doctest::Contains("does not divide into 3 replicas"), ConfigError);
    CHECK_THROWS_AS(MirroredStrategy(sc, model, OptimizerConfig{}, 12, 5), ConfigError);
}

TEST_CASE(
    "sim: a sticky device fault mid-training surfaces as its own error, never a hang; the strategy refuses further "
    "use") {
    SimScope sim(20);
    for (const char* op : {"ring", "nccl"}) {
        CAPTURE(op);
        const Dataset ds = small_problem();
        const Model model({12}, {dense(16, Activation::relu), dense(5, Activation::none)}, 3);
        StrategyConfig sc;
        sc.devices = "sim:0,1,2";
        sc.cross_device_ops = op;
        sc.bucket_mb = 0.0005;
        auto st = std::make_unique<MirroredStrategy>(sc, model, OptimizerConfig{}, 24, 1);
        LoaderOptions lo;
        lo.global_batch = 24;
        lo.consumers = st->replicas();
        auto loader = std::make_unique<Loader>(ds, lo, st->host_allocator());
        loader->start({});
        st->init_and_broadcast();
        sim_inject_fault(1, 25);  // GPU 1's 25th launch from now: inside the second step
        const std::string what = steps_until_error(*st, *loader, 0, 50);
        CHECK(what.find("sim:1: ") == 0);
        CHECK(what.find("illegal memory access") != std::string::npos);
        CHECK(what.find("sim_device.cpp:") != std::string::npos);  // statement, file and line
        CHECK(st->failed());
        CHECK_THROWS_AS(st->next_batch(*loader), StrategyFailed);
        CHECK_FALSE(st->shutdown());
        loader->stop_workers();
        (void)loader.release();  // a failed device's release callbacks may never run: leak, as Session does
        st.reset();              // no hang: the devices were abandoned
        sim_reset();
        sim_set_delays(20);
    }
}

TEST_CASE("sim: after an aborted all-reduce the ops refuse further use instead of pairing the wrong events") {
    SimScope sim(30);
    Rng rng(80);
    AllReduceFixture f("ring", DeviceType::sim, {0, 1, 2}, 4096);
    f.check(1000, rng);
    sim_inject_api_error(1, 3);  // replica 1's third host call fails (not sticky), mid-ring
    CHECK_THROWS_AS(f.threads->run([&](int r) { f.ops->all_reduce(r, 0, 4000); }), DeviceError);
    CHECK(f.ops->broken());
    for (auto& d : f.devs) d->synchronize();
    CHECK_THROWS_WITH_AS(f.threads->run([&](int r) { f.ops->all_reduce(r, 0, 4000); }),
                         doctest::Contains("unusable after an aborted all-reduce"), DeviceError);
}

// The host work of `steps` training steps after the first ones, on simulated GPUs, one bucket
// unless bucket_mb says otherwise.
struct MeasuredWork {
    HostWork device;    // replica 0's calls over the steps
    HostWork all;       // every replica's
    uint64_t barriers;  // per step
};
MeasuredWork step_work(const std::string& devices, const std::string& op, int steps, bool graph = false,
                       double bucket_mb = 0, bool fused = false) {
    const Dataset ds = small_problem();
    const Model model({12}, {dense(16, Activation::relu), dense(16, Activation::relu), dense(5, Activation::none)}, 3);
    StrategyConfig sc;
    sc.devices = devices;
    sc.bucket_mb = bucket_mb;
    sc.cross_device_ops = op;
    sc.cuda_graph = graph;
    sc.fused_epilogues = fused;
    MirroredStrategy st(sc, model, OptimizerConfig{}, 24, 1);
    LoaderOptions lo;
    lo.global_batch = 24;
    lo.consumers = st.replicas();
    Loader loader(ds, lo, st.host_allocator());
    loader.start({});
    st.init_and_broadcast();
    const int first = 4;  // graphs: each input buffer's shape warms up once and is captured once
    for (int s = 0; s < first; ++s) st.train_step(loader.next(), s, 0.1f, 1, false);
    st.synchronize();
    const StepWork before = st.host_work();
    for (int s = first; s < first + steps; ++s) st.train_step(loader.next(), s, 0.1f, 1, false);
    st.synchronize();
    const StepWork after = st.host_work();
    return {after.device - before.device, after.all - before.all, (after.barriers - before.barriers) / uint64_t(steps)};
}

TEST_CASE("sim: the host work a training step issues is counted and bounded") {
    SimScope sim(0);
    const int steps = 5;
    for (int n : {2, 4}) {
        const MeasuredWork m = step_work("sim:" + std::string(n == 2 ? "0,1" : "0,1,2,3"), "ring", steps);
        const HostWork& w = m.device;
        CAPTURE(n);
        // One bucket: the ring crosses 2(n-1)+1 barriers per step, each with one event record and
        // two waits on the comm stream; staging is 2 copies, 1 callback, 2 records, 3 waits; the
        // inputs' end is marked twice (the buffer's event, the hang trail: ReplicaSet::lagging_device).
        CHECK(m.barriers == uint64_t(2 * (n - 1) + 1));
        CHECK(w.copies / steps == 2 + uint64_t(n - 1));  // inputs, labels, the all-gather copies
        CHECK(w.callbacks / steps == 1);
        CHECK(w.event_records / steps == uint64_t(2 + 2 + 2 * (n - 1) + 1 + 1));
        CHECK(w.host_syncs == 0);  // nothing in a step waits for a device
        CHECK(w.launches / steps < 40);
    }
    // direct: two joins per bucket whatever the replica count, one sum op per replica, no copies
    for (int n : {2, 4}) {
        const MeasuredWork m = step_work(n == 2 ? "sim:0,0" : "sim:0,0,0,0", "direct", steps);
        CAPTURE(n);
        CHECK(m.barriers == 2);
        CHECK(m.device.copies / steps == 2);  // inputs and labels only
        CHECK(m.device.host_syncs == 0);
    }
}

TEST_CASE("cuda_graph (sim): replayed steps equal uncaptured steps bit for bit on 1 and N replicas, whatever the op") {
    SimScope sim(30);
    struct Case {
        const char* devices;
        const char* op;
        double bucket_mb;
        int accumulation;
        std::string opt;
        double clip;
    };
    const Case cases[] = {
        {"sim:0", "ring", 0.0, 1, "sgd", 0.0},
        {"sim:0,1", "ring", 0.0005, 1, "sgd", 0.0},
        {"sim:0,1,2", "ring", 0.0005, 2, "adamw", 0.5},
        {"sim:0,0,0,0", "direct", 0.0005, 1, "adamw", 0.0},
        {"sim:0,1", "reduce_to_one", 0.0, 2, "sgd", 0.5},
    };
    for (const Case& c : cases) {
        CAPTURE(c.devices);
        CAPTURE(c.op);
        // 12 steps: each input buffer's shape runs once uncaptured, once captured, then replays
        const TrainResult plain = train(c.devices, 12, c.bucket_mb, c.accumulation, c.opt, c.clip, c.op, false);
        const TrainResult graph = train(c.devices, 12, c.bucket_mb, c.accumulation, c.opt, c.clip, c.op, true);
        CHECK(plain.graph_launches == 0);
        CHECK(graph.graph_launches == 10);    // one launch per step for all replicas, after 2 warm-up steps
        CHECK(graph.params == plain.params);  // dropout, learning rate and AdamW's step from device memory
        CHECK(graph.metrics.loss_sum == plain.metrics.loss_sum);
        CHECK(graph.metrics.count == plain.metrics.count);
        for (uint64_t ck : graph.checksums) CHECK(ck == graph.checksums[0]);
    }
    // without peer access: the staged copies' own streams and events are captured too
    sim_reset();
    sim_set_delays(30);
    sim_set_peer_access(false);
    const TrainResult plain = train("sim:0,1,2", 12, 0.0005, 1, "sgd", 0.0, "ring", false);
    const TrainResult graph = train("sim:0,1,2", 12, 0.0005, 1, "sgd", 0.0, "ring", true);
    CHECK(graph.graph_launches == 10);
    CHECK(graph.params == plain.params);
}

TEST_CASE("cuda_graph (sim): synchronised batchnorm and fp16 loss scaling with an overflow replay exactly too") {
    SimScope sim(20);
    for (const char* devices : {"sim:0,1", "sim:0,0,0"}) {
        CAPTURE(devices);
        const CnnResult plain = train_cnn(devices, 9, true, Precision::fp16);
        const CnnResult graph = train_cnn(devices, 9, true, Precision::fp16, -1, 1, nullptr, DType::f32, false, true);
        CHECK(graph.params == plain.params);
        CHECK(graph.loss_scale == plain.loss_scale);
        // a test's overflow runs that step uncaptured; the replays around it still match
        const CnnResult hit = train_cnn(devices, 9, true, Precision::fp16, 6, 1);
        const CnnResult hit_graph =
            train_cnn(devices, 9, true, Precision::fp16, 6, 1, nullptr, DType::f32, false, true);
        CHECK(hit_graph.params == hit.params);
        CHECK(hit_graph.loss_scale == MirroredStrategy::kInitialLossScale / 2);
    }
}

TEST_CASE(
    "cuda_graph (sim): host calls per step are a few per replica, whatever the buckets and replicas; no barriers") {
    SimScope sim(0);
    const int steps = 6;
    std::vector<double> per_replica;
    for (const char* devices : {"sim:0,1", "sim:0,1,2,3", "sim:0,0,0,0"})
        for (double mb : {0.0, 0.0002}) {  // one bucket, or one per layer's tensors
            CAPTURE(devices);
            CAPTURE(mb);
            const int n = int(parse_devices(devices).ordinals.size());
            const MeasuredWork plain = step_work(devices, "ring", steps, false, mb);
            const MeasuredWork graph = step_work(devices, "ring", steps, true, mb);
            CHECK(graph.barriers == 0);
            CHECK(graph.all.host_syncs == 0);
            CHECK(graph.all.graph_launches == uint64_t(steps));
            // every kernel of the step is in the graph; outside it, per replica: 2 copies (inputs,
            // labels), the step values (a kernel whose argument carries them), 4 event records, 3 or
            // 4 waits, 1 callback (the loader's release); replica 0 adds the launch and waits for the others
            CHECK(graph.all.launches == uint64_t(n * steps));
            const HostWork& w = graph.all;
            CHECK(w.copies == uint64_t(2 * n * steps));
            CHECK(w.callbacks == uint64_t(n * steps));
            CHECK(w.event_records == uint64_t((4 * n - 1 + 1) * steps));
            CHECK(w.stream_waits == uint64_t((2 * n + 2 * (n - 1)) * steps));
            per_replica.push_back(double(w.total()) / double(n * steps));
            CHECK(plain.all.total() > 2 * w.total());
        }
    for (double p : per_replica) CHECK(p <= 12.0);
    CHECK(per_replica[0] == per_replica[1]);  // the number of buckets changes nothing
    CHECK(per_replica[2] == per_replica[3]);
}

// The model of step_work: dense relu, dense relu, dense none, all with bias: three forward
// products and three weight gradients fusable, so 6 launches fewer per replica and step.
TEST_CASE("fused_epilogues (sim): one launch per fused product, bit-identical training, captured too") {
    SimScope sim(20);
    const int steps = 5;
    for (const char* devices : {"sim:0", "sim:0,1", "sim:0,0,0"}) {
        CAPTURE(devices);
        const int n = int(parse_devices(devices).ordinals.size());
        const MeasuredWork plain = step_work(devices, "ring", steps);
        const MeasuredWork fused = step_work(devices, "ring", steps, false, 0, true);
        CHECK(plain.all.launches - fused.all.launches == uint64_t(6 * n * steps));
        CHECK((plain.all - fused.all).total() == plain.all.launches - fused.all.launches);  // nothing else changes
        // dropout and GELU (not fused) in the model, accumulation (the second micro-batch's weight
        // gradients accumulate: not fused), AdamW with clipping; with and without graphs
        const TrainResult want = train(devices, 12, 0.0005, 2, "adamw", 0.5, "ring");
        const TrainResult got = train(devices, 12, 0.0005, 2, "adamw", 0.5, "ring", false, true);
        const TrainResult graph = train(devices, 12, 0.0005, 2, "adamw", 0.5, "ring", true, true);
        CHECK(got.params == want.params);
        CHECK(got.metrics.loss_sum == want.metrics.loss_sum);
        CHECK(graph.graph_launches == 10);
        CHECK(graph.params == want.params);
    }
    // the memory plan counts cuBLASLt's own workspace on CUDA only
    const Model model({12}, {dense(16, Activation::relu), dense(5, Activation::none)}, 3);
    StrategyConfig sc;
    const MemoryPlan cuda = plan_memory(model, OptimizerConfig{}, sc, backend_of(DeviceType::cuda), 1, 8, 8);
    const MemoryPlan simulated = plan_memory(model, OptimizerConfig{}, sc, backend_of(DeviceType::sim), 1, 8, 8);
    sc.fused_epilogues = true;
    CHECK(plan_memory(model, OptimizerConfig{}, sc, backend_of(DeviceType::cuda), 1, 8, 8).workspace ==
          cuda.workspace + (32u << 20));
    CHECK(plan_memory(model, OptimizerConfig{}, sc, backend_of(DeviceType::sim), 1, 8, 8).workspace ==
          simulated.workspace);
    // On CPUs the scratches are per thread and reused layer after layer: the workspace follows the
    // widest layer and the rows, not the depth (it had counted twice the activations: 529 MiB
    // planned for ResNet-20 where a few MiB were used).
    const Model shallow({12}, {dense(256, Activation::relu), dense(5, Activation::none)}, 3);
    const Model deep({12},
                     {dense(256, Activation::relu), dense(256, Activation::relu), dense(256, Activation::relu),
                      dense(5, Activation::none)},
                     3);
    const uint64_t ws = plan_memory(shallow, OptimizerConfig{}, sc, backend_of(DeviceType::cpu), 1, 64, 64).workspace;
    CHECK(plan_memory(deep, OptimizerConfig{}, sc, backend_of(DeviceType::cpu), 1, 64, 64).workspace ==
          ws + (deep.tensors().size() - shallow.tensors().size()) * sizeof(uint64_t));  // a checksum each
    CHECK(ws >= 3 * 64 * 256 * sizeof(float));  // a transposed operand and two products of 64 rows by 256
    CHECK(plan_memory(shallow, OptimizerConfig{}, sc, backend_of(DeviceType::cpu), 1, 32, 32).workspace < ws);
    // the rows each replica's micro-batches have, for the CPU kernels' scratch: a full batch of
    // 256 and evaluation's last of 16 on two replicas; uneven shards; replicas left without rows
    CHECK(micro_batch_rows({256, 16}, 2, 1) == std::vector<int>{8, 128});
    CHECK(micro_batch_rows({12, 10}, 4, 2) == std::vector<int>{1, 2});
    CHECK(micro_batch_rows({2}, 4, 1) == std::vector<int>{1});
}

TEST_CASE(
    "cuda_graph: ignored with a reason on CPU replicas and with the simulated NCCL; a fault in a replay surfaces") {
    SimScope sim(10);
    const Dataset ds = small_problem();
    const Model model({12}, {dense(16, Activation::relu), dense(5, Activation::none)}, 3);
    StrategyConfig sc;
    sc.cuda_graph = true;
    sc.devices = "cpu:2";
    {
        MirroredStrategy st(sc, model, OptimizerConfig{}, 24, 1);
        CHECK_FALSE(st.cuda_graph());
        CHECK(st.cuda_graph_note().find("CPU replicas") != std::string::npos);
    }
    sc.devices = "sim:0,1";
    sc.cross_device_ops = "nccl";
    {
        MirroredStrategy st(sc, model, OptimizerConfig{}, 24, 1);
        CHECK_FALSE(st.cuda_graph());
        CHECK(st.cuda_graph_note() == "NCCL on simulated-GPU replicas cannot be captured; use ring or direct");
    }
    sc.cross_device_ops = "ring";
    auto st = std::make_unique<MirroredStrategy>(sc, model, OptimizerConfig{}, 24, 1);
    CHECK(st->cuda_graph());
    LoaderOptions lo;
    lo.global_batch = 24;
    lo.consumers = st->replicas();
    auto loader = std::make_unique<Loader>(ds, lo, st->host_allocator());
    loader->start({});
    st->init_and_broadcast();
    for (int s = 0; s < 5; ++s) st->train_step(st->next_batch(*loader), s, 0.1f, 1, false);
    st->synchronize();
    sim_inject_fault(1, 12);  // inside a replayed step's part on GPU 1
    std::string what = steps_until_error(*st, *loader, 5, 40);
    CHECK(what.find("sim:1: ") == 0);
    CHECK(what.find("illegal memory access") != std::string::npos);
    CHECK(st->failed());
    loader->stop_workers();
    (void)loader.release();  // a failed device's release callbacks may never run
    st.reset();              // no hang: the devices were abandoned

    // a host call failing while a step is being captured: the error, no hang, nothing half-captured used
    sim_reset();
    st = std::make_unique<MirroredStrategy>(sc, model, OptimizerConfig{}, 24, 1);
    loader = std::make_unique<Loader>(ds, lo, st->host_allocator());
    loader->start({});
    st->init_and_broadcast();
    for (int s = 0; s < 2; ++s) st->train_step(st->next_batch(*loader), s, 0.1f, 1, false);  // warm-up, uncaptured
    st->synchronize();
    sim_inject_api_error(1, 12);  // GPU 1's 12th host call from now: inside the capture of step 2
    what = steps_until_error(*st, *loader, 2, 6);
    CHECK(what.find("simulated error at host call") != std::string::npos);
    CHECK(what.find("strategy.cuda_graph: capturing step 2 failed: ") == 0);  // and how to go on without graphs
    CHECK(st->failed());
    CHECK(st->host_work().all.graph_launches == 0);
    loader->stop_workers();
    (void)loader.release();
    st.reset();
}

TEST_CASE("cuda all-reduce: ring, direct and reduce_to_one on replicas sharing GPU 0 (N = 1..8)" *
          doctest::test_suite("cuda")) {
    SKIP_WITHOUT_CUDA();
    all_reduce_matrix("ring", DeviceType::cuda, 8, true);
    all_reduce_matrix("direct", DeviceType::cuda, 8, true);
    all_reduce_matrix("direct", DeviceType::cuda, 4, true, DType::bf16);
    all_reduce_matrix("reduce_to_one", DeviceType::cuda, 4, true);
}

TEST_CASE("cuda all-reduce with a bf16 wire matches the bound and is bit-identical (GPU 0, direct and staged)" *
          doctest::test_suite("cuda")) {
    SKIP_WITHOUT_CUDA();
    all_reduce_matrix("ring", DeviceType::cuda, 4, true, DType::bf16);
    all_reduce_matrix("reduce_to_one", DeviceType::cuda, 3, true, DType::bf16);
    set_peer_transport(PeerTransport::staged);
    Rng rng(82);
    AllReduceFixture f("ring", DeviceType::cuda, {0, 0, 0}, size_t(5) << 20, DType::bf16);
    f.check(size_t(5) << 20, rng);
    set_peer_transport(PeerTransport::automatic);
}

TEST_CASE("cuda all-reduce through staged peer copies (copy and add pipelined) is exact too" *
          doctest::test_suite("cuda")) {
    SKIP_WITHOUT_CUDA();
    set_peer_transport(PeerTransport::staged);
    Rng rng(77);
    for (int n : {2, 3}) {
        AllReduceFixture f("ring", DeviceType::cuda, std::vector<int>(size_t(n), 0), size_t(3) << 20);
        for (size_t len : {size_t(1), size_t(1009), size_t(3) << 20})
            f.check(len, rng);  // the last spans several slices
    }
    AllReduceFixture f("reduce_to_one", DeviceType::cuda, {0, 0, 0}, size_t(5) << 20);
    f.check(size_t(5) << 20, rng);
    set_peer_transport(PeerTransport::automatic);
}

TEST_CASE("cuda all-reduce across distinct GPUs: direct peer loads and staged copies, ring, reduce_to_one, nccl" *
          doctest::test_suite("cuda")) {
    SKIP_WITHOUT_CUDA();
    const int gpus = cuda_device_count();
    if (gpus < 2) {
        mark_runs_elsewhere("needs 2 or more GPUs, " + std::to_string(gpus) + " visible");
        return;
    }
    std::vector<int> all;
    for (int g = 0; g < gpus; ++g) all.push_back(g);
    const auto staged = backend_of(DeviceType::cuda).enable_peer_access(all);
    for (const auto& p : staged) MESSAGE("cuda:" << p.from << " -> cuda:" << p.to << " staged: " << p.why);
    Rng rng(81);
    for (PeerTransport t : {PeerTransport::direct, PeerTransport::staged}) {
        if (t == PeerTransport::direct && !staged.empty()) continue;  // some pair cannot load directly
        set_peer_transport(t);
        AllReduceFixture f("ring", DeviceType::cuda, all, size_t(3) << 20);
        for (size_t len : {size_t(1), size_t(1009), size_t(3) << 20}) f.check(len, rng);
    }
    set_peer_transport(PeerTransport::automatic);
    for (const char* op : {"ring", "reduce_to_one", "nccl", "direct"}) {
        if (std::string(op) == "nccl" && !nccl_compiled()) continue;
        if (std::string(op) == "direct" && !staged.empty()) continue;  // needs all-to-all peer access
        all_reduce_matrix(op, DeviceType::cuda, gpus, false);
    }
}

TEST_CASE("nccl refuses a device list that repeats a GPU" * doctest::test_suite("cuda")) {
    SKIP_WITHOUT_CUDA();
    auto a = make_cuda_device(0), b = make_cuda_device(0);
    DeviceBuffer<float> x(*a, 4), y(*b, 4);
    ReplicaBarrier barrier(2);
    CHECK_THROWS_WITH_AS(make_cross_device_ops("nccl", {a.get(), b.get()}, {x.data(), y.data()}, 4, barrier),
                         doctest::Contains("cannot place two replicas"), ConfigError);
}

TEST_CASE("cuda: N replicas on GPU 0 match one replica, and match the CPU run" * doctest::test_suite("cuda")) {
    SKIP_WITHOUT_CUDA();
    const TrainResult cpu = train("cpu:1", 6, 0.0);
    const TrainResult one = train("cuda:0", 6, 0.0);
    CHECK(rel_error(one.params, cpu.params) < 1e-4);
    for (const char* devices : {"cuda:0,0", "cuda:0,0,0", "cuda:0,0,0,0"})
        for (double mb : {0.0, 0.0005}) {
            CAPTURE(devices);
            const TrainResult many = train(devices, 6, mb);
            CHECK(rel_error(many.params, one.params) < 1e-5);
            for (uint64_t c : many.checksums) CHECK(c == many.checksums[0]);
        }
}

TEST_CASE("cuda: sharded optimizer state and gradients train as unsharded, captured too" *
          doctest::test_suite("cuda")) {
    SKIP_WITHOUT_CUDA();
    std::vector<std::string> lists{"cuda:0,0,0"};
    if (cuda_device_count() >= 2) lists.push_back("cuda:0,1");
    for (const std::string& devices : lists) {
        CAPTURE(devices);
        std::vector<std::pair<std::string, std::vector<float>>> whole, sharded;
        const TrainResult plain =
            train(devices, 6, 0.0005, 2, "adamw", 0.0, "ring", false, false, ShardMode::none, &whole);
        const TrainResult shard =
            train(devices, 6, 0.0005, 2, "adamw", 0.0, "ring", false, false, ShardMode::optimizer, &sharded);
        CHECK(shard.params == plain.params);
        for (uint64_t c : shard.checksums) CHECK(c == plain.checksums[0]);
        CHECK(sharded == whole);
        const TrainResult graph = train(devices, 6, 0.0005, 2, "adamw", 0.0, "ring", true, false, ShardMode::optimizer);
        CHECK(graph.graph_launches > 0);
        CHECK(graph.params == plain.params);
        // gradients staged too: one micro-batch adds as the all-reduce does; with two, each
        // micro-batch's chunk is added after the replicas' sum (within rounding)
        const TrainResult plain1 = train(devices, 6, 0.0005, 1, "adamw", 0.0, "ring");
        CHECK(train(devices, 6, 0.0005, 1, "adamw", 0.0, "ring", false, false, ShardMode::gradients).params ==
              plain1.params);
        const TrainResult staged =
            train(devices, 6, 0.0005, 2, "adamw", 0.0, "ring", true, false, ShardMode::gradients);
        CHECK(staged.graph_launches > 0);
        CHECK(rel_error(staged.params, plain.params) < 1e-5);
        // dense weights written in blocks of 8 rows (shard: gradients' pieces of 26 floats): each
        // block's product reads dz's columns at its full width; captured, staged, the same sums
        const TrainResult blocks =
            train(devices, 6, 0.0001, 1, "adamw", 0.0, "ring", false, false, ShardMode::none, nullptr, 26);
        const TrainResult blocks_staged =
            train(devices, 6, 0.0001, 1, "adamw", 0.0, "ring", true, false, ShardMode::gradients, nullptr, 26);
        CHECK(blocks_staged.graph_launches > 0);
        CHECK(blocks_staged.params == blocks.params);
        CHECK(rel_error(blocks.params, plain1.params) < 1e-5);
    }
    if (cuda_device_count() < 2 || !nccl_compiled()) return;
    // nccl's halves (ncclReduce and ncclBroadcast per chunk): with two ranks every element is
    // a + b, in NCCL's reduce as in its all-reduce (float addition commutes), so bit for bit
    std::vector<std::pair<std::string, std::vector<float>>> whole, sharded;
    const TrainResult plain =
        train("cuda:0,1", 6, 0.0005, 2, "adamw", 0.0, "nccl", false, false, ShardMode::none, &whole);
    const TrainResult shard =
        train("cuda:0,1", 6, 0.0005, 2, "adamw", 0.0, "nccl", false, false, ShardMode::optimizer, &sharded);
    CHECK(shard.ops == std::string("nccl"));
    CHECK(shard.params == plain.params);
    for (uint64_t c : shard.checksums) CHECK(c == plain.checksums[0]);
    CHECK(sharded == whole);
    const TrainResult graph = train("cuda:0,1", 6, 0.0005, 2, "adamw", 0.0, "nccl", true, false, ShardMode::optimizer);
    CHECK(graph.graph_launches > 0);
    CHECK(graph.params == shard.params);
    CHECK(train("cuda:0,1", 6, 0.0005, 1, "adamw", 0.0, "nccl", false, false, ShardMode::gradients).params ==
          train("cuda:0,1", 6, 0.0005, 1, "adamw", 0.0, "nccl").params);
}

TEST_CASE("cuda: shared parameters on GPU 0 match one replica, with and without graphs" * doctest::test_suite("cuda")) {
    SKIP_WITHOUT_CUDA();
    const TrainResult one = train("cuda:0", 8, 0.0, 2, "adamw", 0.5);
    for (const char* devices : {"cuda:0,0", "cuda:0,0,0,0"}) {
        CAPTURE(devices);
        const TrainResult shared = train(devices, 8, 0.0005, 2, "adamw", 0.5, "shared");
        CHECK(shared.ops == std::string("shared"));
        CHECK(rel_error(shared.params, one.params) < 1e-5);
        const TrainResult graph = train(devices, 8, 0.0005, 2, "adamw", 0.5, "shared", true);
        CHECK(graph.params == shared.params);
    }
}

TEST_CASE("cuda_graph on CUDA: one multi-replica graph per step shape replays exactly like uncaptured steps" *
          doctest::test_suite("cuda")) {
    SKIP_WITHOUT_CUDA();
    std::vector<std::pair<std::string, std::string>> cases{
        {"cuda:0", "ring"}, {"cuda:0,0,0,0", "ring"}, {"cuda:0,0,0,0", "direct"}};
    if (cuda_device_count() >= 2) cases.push_back({"cuda:0,1", "ring"});  // events across devices in one capture
    if (cuda_device_count() >= 2 && nccl_compiled()) cases.push_back({"cuda:0,1", "nccl"});  // NCCL in the capture
    for (const auto& [devices, op] : cases) {
        CAPTURE(devices);
        CAPTURE(op);
        const TrainResult plain = train(devices, 12, 0.0005, 2, "adamw", 0.5, op, false);
        const TrainResult graph = train(devices, 12, 0.0005, 2, "adamw", 0.5, op, true);
        CHECK(graph.graph_launches == 10);
        CHECK(graph.params == plain.params);  // the same kernels, in an order the captured edges allow
        for (uint64_t c : graph.checksums) CHECK(c == graph.checksums[0]);
    }
}

TEST_CASE("cuda: fused epilogues train like the unfused ops on 1 and N replicas, and replay exactly from graphs" *
          doctest::test_suite("cuda")) {
    SKIP_WITHOUT_CUDA();
    for (const char* devices : {"cuda:0", "cuda:0,0,0"}) {
        CAPTURE(devices);
        const TrainResult plain = train(devices, 12, 0.0005, 2, "adamw", 0.5, "ring");
        const TrainResult fused = train(devices, 12, 0.0005, 2, "adamw", 0.5, "ring", false, true);
        const TrainResult graph = train(devices, 12, 0.0005, 2, "adamw", 0.5, "ring", true, true);
        CHECK(rel_error(fused.params, plain.params) < 1e-5);
        for (uint64_t c : fused.checksums) CHECK(c == fused.checksums[0]);
        CHECK(graph.graph_launches == 10);
        CHECK(graph.params == fused.params);
    }
}

TEST_CASE("a CNN with synchronised batchnorm: N = 1, 2, 3 replicas equal one replica on the global batch") {
    SimScope sim(20);
    const CnnResult one = train_cnn("cpu:1", 6, true);
    for (const char* devices : {"cpu:2", "cpu:3", "sim:0,1", "sim:0,0,0"}) {
        CAPTURE(devices);
        const CnnResult many = train_cnn(devices, 6, true);
        CHECK(rel_error(many.params, one.params) < 1e-4);  // running statistics included
        CHECK(many.metrics.loss_sum == doctest::Approx(one.metrics.loss_sum).epsilon(1e-4));
        for (uint64_t c : many.checksums) CHECK(c == many.checksums[0]);
    }
}

TEST_CASE("per-replica batchnorm (the default): replicas stay identical, but differ from one replica as documented") {
    const CnnResult one = train_cnn("cpu:1", 6, false);
    const CnnResult two = train_cnn("cpu:2", 6, false);
    for (uint64_t c : two.checksums) CHECK(c == two.checksums[0]);  // mirrored: the same update everywhere
    CHECK(rel_error(two.params, one.params) > 1e-4);                // each replica normalised by its own shard
    CHECK(two.metrics.count == one.metrics.count);
}

TEST_CASE("fp16 loss scaling: an overflow in one replica skips the step on every replica and halves the scale") {
    SimScope sim(20);
    for (const char* devices : {"cpu:2", "sim:0,1"}) {
        CAPTURE(devices);
        std::vector<float> before;
        const CnnResult clean = train_cnn(devices, 4, false, Precision::fp16);
        const CnnResult hit = train_cnn(devices, 4, false, Precision::fp16, 3, 1, &before);
        CHECK(clean.loss_scale == MirroredStrategy::kInitialLossScale);
        CHECK(hit.loss_scale == MirroredStrategy::kInitialLossScale / 2);
        for (uint64_t c : hit.checksums) CHECK(c == hit.checksums[0]);  // replicas identical
        // the skipped step moved no trainable parameter (the running statistics did: they come
        // from the forward pass, as in PyTorch), and the clean run's last step did
        REQUIRE(before.size() == hit.params.size());
        size_t moved = 0;
        for (size_t i = 0; i < before.size(); ++i) moved += before[i] != hit.params[i];
        CHECK(moved > 0);
        CHECK(moved < 64);  // only the few running statistics
        CHECK(rel_error(hit.params, clean.params) > 1e-6);
    }
}

TEST_CASE(
    "bf16 and fp16 on CPU replicas emulate the GPU's storage: training works, results differ from fp32 slightly") {
    const CnnResult f32 = train_cnn("cpu:2", 6, true);
    for (Precision p : {Precision::bf16, Precision::fp16}) {
        CAPTURE(precision_name(p));
        const CnnResult lp = train_cnn("cpu:2", 6, true, p);
        CHECK(rel_error(lp.params, f32.params) > 0.0);
        CHECK(rel_error(lp.params, f32.params) < 0.05);
        CHECK(lp.metrics.loss_sum == doctest::Approx(f32.metrics.loss_sum).epsilon(0.05));
        for (uint64_t c : lp.checksums) CHECK(c == lp.checksums[0]);
    }
}

TEST_CASE("allreduce_dtype bf16: replicas stay identical, close to the f32 wire; running statistics reduced in f32") {
    SimScope sim(20);
    for (bool sync : {true, false})
        for (const char* devices : {"cpu:3", "sim:0,1"}) {
            CAPTURE(devices);
            CAPTURE(sync);
            const CnnResult f32 = train_cnn(devices, 6, sync);
            const CnnResult bf = train_cnn(devices, 6, sync, Precision::fp32, -1, 1, nullptr, DType::bf16);
            for (uint64_t c : bf.checksums) CHECK(c == bf.checksums[0]);
            CHECK(rel_error(bf.params, f32.params) > 0.0);  // the gradients were rounded
            CHECK(rel_error(bf.params, f32.params) < 0.02);
            CHECK(bf.metrics.loss_sum == doctest::Approx(f32.metrics.loss_sum).epsilon(0.02));
        }
    // After one step the running statistics come from the same initial weights: exact in both runs
    // (reduced in f32), while the trainable parameters already differ.
    const CnnResult a = train_cnn("cpu:3", 1, false),
                    b = train_cnn("cpu:3", 1, false, Precision::fp32, -1, 1, nullptr, DType::bf16);
    REQUIRE(a.trainable < a.params.size());
    CHECK(std::equal(a.params.begin() + long(a.trainable), a.params.end(), b.params.begin() + long(b.trainable)));
    CHECK(!std::equal(a.params.begin(), a.params.begin() + long(a.trainable), b.params.begin()));
    // one replica sends nothing: the wire type changes nothing
    const CnnResult one = train_cnn("cpu:1", 4, true),
                    one_bf = train_cnn("cpu:1", 4, true, Precision::fp32, -1, 1, nullptr, DType::bf16);
    CHECK(one.params == one_bf.params);
}

TEST_CASE(
    "ring and nccl halves: reduce-scatter leaves each replica its owned chunk summed; with all-gather, the "
    "all-reduce") {
    Rng rng(base_seed() + 5);
    struct Case {
        const char* op;
        DeviceType type;
        int first_n;
    };
    for (const Case& c : {Case{"ring", DeviceType::cpu, 1}, Case{"nccl", DeviceType::sim, 2}})
        for (int n = c.first_n; n <= 5; ++n)
            for (size_t len : {size_t(1), size_t(7), size_t(1009)}) {
                CAPTURE(c.op);
                CAPTURE(n);
                CAPTURE(len);
                std::vector<int> ordinals(size_t(n), 0);
                if (c.type == DeviceType::sim) std::iota(ordinals.begin(), ordinals.end(), 0);  // a GPU per rank
                AllReduceFixture whole(c.op, c.type, ordinals, len), halves(c.op, c.type, ordinals, len);
                const size_t at = 3;  // an offset, as a bucket has
                auto upload = [&](AllReduceFixture& f, int r, const std::vector<float>& h) {
                    Device& d = *f.devs[size_t(r)];
                    d.copy_to_device(d.compute_stream(), f.bufs[size_t(r)].data(), h.data(), h.size() * sizeof(float));
                    d.synchronize();
                };
                auto download = [&](AllReduceFixture& f, int r) {
                    Device& d = *f.devs[size_t(r)];
                    std::vector<float> h(len + at);
                    d.copy_to_host(d.compute_stream(), h.data(), f.bufs[size_t(r)].data(), h.size() * sizeof(float));
                    d.synchronize();
                    return h;
                };
                for (int r = 0; r < n; ++r) {
                    const std::vector<float> h = rng.uniform(len + at, -1.0f, 1.0f);
                    upload(whole, r, h);
                    upload(halves, r, h);
                }
                auto run = [](AllReduceFixture& f, auto&& call) {
                    f.threads->run([&](int r) {
                        call(r);
                        f.devs[size_t(r)]->synchronize();
                    });
                };
                run(whole, [&](int r) { whole.ops->all_reduce(r, at, len); });
                run(halves, [&](int r) { halves.ops->reduce_scatter(r, at, len); });
                bool owned_exact = true;
                for (int r = 0; r < n; ++r) {
                    const auto [b, e] = CrossDeviceOps::owned(r, n, at, len);
                    const std::vector<float> w = download(whole, r), h = download(halves, r);
                    owned_exact =
                        owned_exact && std::equal(w.begin() + long(b), w.begin() + long(e), h.begin() + long(b));
                }
                CHECK(owned_exact);  // the same additions in the same order
                run(halves, [&](int r) { halves.ops->all_gather(r, at, len); });
                for (int r = 0; r < n; ++r) CHECK(download(whole, r) == download(halves, r));
            }
    // the owned chunks tile a range
    for (int n : {1, 3, 8}) {
        size_t at = 10;
        for (int r = 0; r < n; ++r) {
            const auto [b, e] = CrossDeviceOps::owned(r, n, 10, 1001);
            CHECK(b == at);
            at = e;
        }
        CHECK(at == 1011);
    }
}

namespace {

// On the ring, CPU and simulated replicas, SGD and AdamW: `mode` trains bit for bit as unsharded -
// the ring's additions, the same update per element - and its optimizer state gathers whole.
void expect_sharded_bits(ShardMode mode, int accumulation) {
    for (const char* devices : {"cpu:2", "cpu:3", "cpu:4", "sim:0,1,2"})
        for (const char* opt : {"sgd", "adamw"}) {
            CAPTURE(devices);
            CAPTURE(opt);
            std::vector<std::pair<std::string, std::vector<float>>> whole, sharded;
            const TrainResult plain =
                train(devices, 6, 0.0005, accumulation, opt, 0.0, "ring", false, false, ShardMode::none, &whole);
            const TrainResult shard =
                train(devices, 6, 0.0005, accumulation, opt, 0.0, "ring", false, false, mode, &sharded);
            CHECK(shard.params == plain.params);
            for (uint64_t c : shard.checksums) CHECK(c == plain.checksums[0]);
            CHECK(sharded == whole);
        }
}

// Captured once and replayed on simulated GPUs, with clipping: the same bits as uncaptured.
void expect_replayed_bits(ShardMode mode, int accumulation) {
    const TrainResult uncaptured =
        train("sim:0,1,2", 6, 0.0005, accumulation, "adamw", 0.5, "ring", false, false, mode);
    const TrainResult replayed = train("sim:0,1,2", 6, 0.0005, accumulation, "adamw", 0.5, "ring", true, false, mode);
    CHECK(replayed.graph_launches > 0);
    CHECK(replayed.params == uncaptured.params);
}

}  // namespace

TEST_CASE("strategy.shard optimizer: N replicas train bit for bit as unsharded, each keeping 1/N of the state") {
    SimScope sim(30);
    expect_sharded_bits(ShardMode::optimizer, 2);
    // nccl's halves (the chunks' ncclReduce and ncclBroadcast) on simulated GPUs: its all-reduce's bits
    for (const char* devices : {"sim:0,1", "sim:0,1,2,3"}) {
        CAPTURE(devices);
        std::vector<std::pair<std::string, std::vector<float>>> whole, sharded;
        const TrainResult plain =
            train(devices, 6, 0.0005, 2, "adamw", 0.0, "nccl", false, false, ShardMode::none, &whole);
        const TrainResult shard =
            train(devices, 6, 0.0005, 2, "adamw", 0.0, "nccl", false, false, ShardMode::optimizer, &sharded);
        CHECK(shard.ops == std::string("nccl"));
        CHECK(shard.params == plain.params);
        for (uint64_t c : shard.checksums) CHECK(c == plain.checksums[0]);
        CHECK(sharded == whole);
    }
    expect_replayed_bits(ShardMode::optimizer, 1);
    // clipping: the norm from per-chunk partial sums, so within rounding of the unsharded run
    const TrainResult one = train("cpu:1", 6, 0.0, 2, "adamw", 0.5);
    const TrainResult clipped = train("cpu:3", 6, 0.0005, 2, "adamw", 0.5, "ring", false, false, ShardMode::optimizer);
    CHECK(rel_error(clipped.params, one.params) < 1e-5);
    for (uint64_t c : clipped.checksums) CHECK(c == clipped.checksums[0]);
    // one bucket, one replica: nothing to split
    CHECK(train("cpu:1", 4, 0.0, 1, "adamw", 0.0, "ring", false, false, ShardMode::optimizer).params ==
          train("cpu:1", 4, 0.0, 1, "adamw").params);
    // the state each replica holds: its own chunks, about 1/N, together every parameter once
    const Model model({12}, {dense(16, Activation::relu), dense(16, Activation::gelu), dense(5, Activation::none)}, 3);
    StrategyConfig sc;
    sc.devices = "cpu:4";
    sc.bucket_mb = 0.0005;
    sc.shard = StrategyConfig::Shard::optimizer;
    MirroredStrategy st(sc, model, make_optimizer_config("adamw"), 24, 1);
    size_t total = 0, most = 0;
    for (int r = 0; r < 4; ++r) {
        const Optimizer& o = *st.replica(r).optimizer;
        total += o.state_size();
        most = std::max(most, o.state_size());
        CHECK(st.replica(r).optimizer->state()[0].second->size() == o.state_size());
    }
    CHECK(total == model.trainable_size());
    CHECK(most <= model.trainable_size() / 4 + 4 * st.buckets().size());  // rounding to 16 bytes per bucket
    CHECK(st.memory_plan().optimizer == most * 2 * sizeof(float));
    sc.shard = StrategyConfig::Shard::none;
    MirroredStrategy whole(sc, model, make_optimizer_config("adamw"), 24, 1);
    CHECK(whole.memory_plan().optimizer == model.trainable_size() * 2 * sizeof(float));
    // measured: the replica that allocates most holds the planned difference less, but for the
    // two floats of one range's gradient statistics a sharded replica adds
    CHECK(whole.peak_memory_bytes() - st.peak_memory_bytes() ==
          whole.memory_plan().optimizer - st.memory_plan().optimizer - 2 * sizeof(float));
}

TEST_CASE("strategy.shard gradients: N replicas train as unsharded, each keeping its own chunks' gradients only") {
    SimScope sim(30);
    // one micro-batch: every chunk reduce-scattered as the all-reduce sums it, kept, updated: the same bits
    expect_sharded_bits(ShardMode::gradients, 1);
    for (const char* devices : {"sim:0,1", "sim:0,1,2,3"}) {
        CAPTURE(devices);
        const TrainResult plain = train(devices, 6, 0.0005, 1, "adamw", 0.0, "nccl");
        const TrainResult shard =
            train(devices, 6, 0.0005, 1, "adamw", 0.0, "nccl", false, false, ShardMode::gradients);
        CHECK(shard.ops == std::string("nccl"));
        CHECK(shard.params == plain.params);
    }
    // accumulation: each micro-batch is reduce-scattered and its chunk added to the kept sum, so
    // the micro-batches are summed after the replicas, not before: within rounding
    const TrainResult one = train("cpu:1", 6, 0.0, 2, "adamw", 0.5);
    for (const char* devices : {"cpu:3", "sim:0,1,2"}) {
        CAPTURE(devices);
        const TrainResult accumulated =
            train(devices, 6, 0.0005, 2, "adamw", 0.5, "ring", false, false, ShardMode::gradients);
        CHECK(rel_error(accumulated.params, one.params) < 1e-5);
        for (uint64_t c : accumulated.checksums) CHECK(c == accumulated.checksums[0]);
    }
    expect_replayed_bits(ShardMode::gradients, 2);
}

TEST_CASE("strategy.shard gradients with dense weights in blocks of rows: the same training") {
    SimScope sim(30);
    StrategyConfig sc;
    sc.bucket_mb = 0.0001;
    sc.shard = ShardMode::gradients;
    const size_t piece = gradient_piece_floats(sc, 2, false);  // 26 floats: both 16-row weights in blocks of 8
    REQUIRE(piece == 26);
    const Model split({12}, {dense(16, Activation::relu), dense(16, Activation::gelu), dense(5, Activation::none)}, 3,
                      false, piece);
    REQUIRE(split.gradient_units() == 5);
    for (const char* devices : {"cpu:2", "cpu:3", "cpu:4", "sim:0,1,2"}) {
        CAPTURE(devices);
        // the same buckets: the same sums in the same order
        const TrainResult plain =
            train(devices, 6, 0.0001, 1, "adamw", 0.0, "ring", false, false, ShardMode::none, nullptr, piece);
        const TrainResult shard =
            train(devices, 6, 0.0001, 1, "adamw", 0.0, "ring", false, false, ShardMode::gradients, nullptr, piece);
        CHECK(shard.params == plain.params);
        for (uint64_t c : shard.checksums) CHECK(c == plain.checksums[0]);
        // whole tensors make other buckets, so the ring's chunks sum in another order: within rounding
        const TrainResult whole = train(devices, 6, 0.0001, 1, "adamw");
        CHECK(rel_error(shard.params, whole.params) < 1e-5);
    }
    // accumulated and clipped: within rounding of one replica
    const TrainResult one = train("cpu:1", 6, 0.0, 2, "adamw", 0.5);
    const TrainResult accumulated =
        train("cpu:3", 6, 0.0001, 2, "adamw", 0.5, "ring", false, false, ShardMode::gradients, nullptr, piece);
    CHECK(rel_error(accumulated.params, one.params) < 1e-5);
}

TEST_CASE("strategy.shard gradients: dense weights in blocks of rows keep 1/N of the gradients and small slots") {
    const std::vector<LayerSpec> layers = {dense(1024, Activation::relu), dense(1024, Activation::relu),
                                           dense(10, Activation::none)};
    StrategyConfig sc;
    sc.bucket_mb = 0.03125;  // 8 rows of the 1024-wide weights
    sc.shard = ShardMode::gradients;
    const size_t piece = gradient_piece_floats(sc, 2, false);
    const Model whole({64}, layers, 3), pieced({64}, layers, 3, false, piece);
    const OptimizerConfig adamw = make_optimizer_config("adamw");
    const uint64_t unsharded = uint64_t(pieced.flat_size()) * sizeof(float);
    for (int n : {2, 4, 8}) {
        CAPTURE(n);
        sc.devices = "cpu:" + std::to_string(n);
        MirroredStrategy st(sc, pieced, adamw, 48, 1);
        REQUIRE(st.sharded_gradients());
        // the slots: a few buckets, each a block of rows or a bias and a block, beside the own
        // chunks' 1/N
        CHECK(st.gradient_slots() <= 3);
        CHECK(st.gradient_slot_floats() <= size_t(st.gradient_slots()) * (2 * piece + Model::kTensorAlign));
        size_t most = 0;
        for (int r = 0; r < n; ++r) most = std::max(most, st.replica(r).owned_grads.size());
        CHECK(st.memory_plan().grads == (st.gradient_slot_floats() + most) * sizeof(float));
        CHECK(st.memory_plan().grads < unsharded / uint64_t(n) + unsharded / 25);
        // whole tensors: the slot holding a 1024 x 1024 weight's bucket holds it whole
        MirroredStrategy tensors(sc, whole, adamw, 48, 1);
        CHECK(tensors.gradient_slot_floats() >= 1024 * 1024);
        CHECK(tensors.memory_plan().grads > unsharded / uint64_t(n) + unsharded / 4);
        // measured: the difference to shard: optimizer is the plan's
        StrategyConfig zero1 = sc;
        zero1.shard = ShardMode::optimizer;
        MirroredStrategy optimizer(zero1, pieced, adamw, 48, 1);
        CHECK(optimizer.memory_plan().grads == unsharded);
        CHECK(optimizer.peak_memory_bytes() - st.peak_memory_bytes() ==
              optimizer.memory_plan().grads - st.memory_plan().grads);
    }
}

TEST_CASE("strategy.shard gradients: a few reused slots and the own chunks hold what every gradient held") {
    // ten layers in about one bucket each, staged in a few slots
    std::vector<LayerSpec> layers(10, dense(64, Activation::relu));
    layers.push_back(dense(5, Activation::none));
    const Model model({64}, layers, 3);
    StrategyConfig sc;
    sc.devices = "cpu:4";
    sc.bucket_mb = 0.015;
    sc.shard = ShardMode::gradients;
    MirroredStrategy st(sc, model, make_optimizer_config("adamw"), 24, 1);
    REQUIRE(st.sharded_gradients());
    const GradientStaging g = plan_gradient_staging(model, make_buckets(model, sc.bucket_mb));
    CHECK(st.gradient_slots() == g.slots);
    CHECK(g.slots < 8);
    // every slot's buckets are written one after another: a bucket takes its slot only once the one before is reduced
    for (size_t a = 0; a < st.buckets().size(); ++a)
        for (size_t b = 0; b < st.buckets().size(); ++b)
            if (a != b && g.slot_of[a] == g.slot_of[b] && st.buckets()[a].begin > st.buckets()[b].begin)
                CHECK((g.claim_after[b] >= 0 && g.claim_after[b] <= st.buckets()[a].ready_after_unit));
    size_t largest = 0;
    for (const Bucket& b : st.buckets()) largest = std::max(largest, b.end - b.begin);
    CHECK(g.buffer <= size_t(g.slots) * (largest + Model::kTensorAlign));
    // the plan: slots, then each replica's own chunks (the largest share), in place of the whole buffer
    size_t most = 0;
    for (int r = 0; r < 4; ++r) most = std::max(most, st.replica(r).owned_grads.size());
    CHECK(st.memory_plan().grads == (g.buffer + most) * sizeof(float));
    CHECK(st.memory_plan().grads < model.flat_size() * sizeof(float));
    sc.shard = ShardMode::optimizer;
    MirroredStrategy zero1(sc, model, make_optimizer_config("adamw"), 24, 1);
    CHECK(zero1.memory_plan().grads == model.flat_size() * sizeof(float));
    // measured: the difference is the plan's
    CHECK(zero1.peak_memory_bytes() - st.peak_memory_bytes() == zero1.memory_plan().grads - st.memory_plan().grads);
    // a run that does not fit is told the first sharding that would
    StrategyConfig none = sc;
    none.shard = ShardMode::none;
    const OptimizerConfig adamw = make_optimizer_config("adamw");
    const Backend& cuda = backend_of(DeviceType::cuda);
    const auto need = [&](ShardMode mode) {
        StrategyConfig s = sc;
        s.shard = mode;
        return plan_memory(model, adamw, s, cuda, 4, 6, 6).total();
    };
    REQUIRE(need(ShardMode::gradients) < need(ShardMode::optimizer));
    REQUIRE(need(ShardMode::optimizer) < need(ShardMode::none));
    const auto fitting = [&](const StrategyConfig& s, uint64_t capacity, bool shared = false, int replicas = 4) {
        return fitting_shard(model, adamw, s, cuda, replicas, 6, 6, shared, sizeof(int32_t), capacity);
    };
    CHECK(fitting(none, need(ShardMode::optimizer)).rfind("strategy.shard: optimizer (", 0) == 0);
    CHECK(fitting(none, need(ShardMode::optimizer) - 1).rfind("strategy.shard: gradients (", 0) == 0);
    StrategyConfig zero1_cfg = sc, zero2_cfg = sc;
    zero1_cfg.shard = ShardMode::optimizer;
    zero2_cfg.shard = ShardMode::gradients;
    CHECK(fitting(zero1_cfg, need(ShardMode::gradients)).rfind("strategy.shard: gradients (", 0) == 0);
    CHECK(fitting(zero2_cfg, need(ShardMode::optimizer)) == "");  // configured already: nothing more to shard
    CHECK(fitting(none, need(ShardMode::gradients) - 1) == "");
    CHECK(fitting(none, need(ShardMode::optimizer), true) == "");      // one shared copy
    CHECK(fitting(none, need(ShardMode::optimizer), false, 1) == "");  // one replica
}

TEST_CASE("strategy.shard: batchnorm statistics, fp16 loss scaling and an overflow agree with unsharded") {
    const CnnResult plain = train_cnn("cpu:3", 6, true, Precision::fp16, 3, 2);
    const CnnResult shard =
        train_cnn("cpu:3", 6, true, Precision::fp16, 3, 2, nullptr, DType::f32, false, false, ShardMode::optimizer);
    CHECK(shard.loss_scale == plain.loss_scale);
    CHECK(shard.loss_scale < MirroredStrategy::kInitialLossScale);  // the overflow halved it everywhere
    CHECK(shard.params == plain.params);                            // running statistics included
    for (uint64_t c : shard.checksums) CHECK(c == plain.checksums[0]);
    // gradients staged too: the running statistics stay whole after the slots
    const CnnResult staged =
        train_cnn("cpu:3", 6, true, Precision::fp16, 3, 2, nullptr, DType::f32, false, false, ShardMode::gradients);
    CHECK(staged.loss_scale == plain.loss_scale);
    CHECK(staged.params == plain.params);
    for (uint64_t c : staged.checksums) CHECK(c == plain.checksums[0]);
    SimScope sim(25);  // on simulated GPUs with delays, the order of the streams holds
    const CnnResult sim_plain = train_cnn("sim:0,1,2", 6, true);
    for (ShardMode mode : {ShardMode::optimizer, ShardMode::gradients}) {
        const CnnResult sim_shard =
            train_cnn("sim:0,1,2", 6, true, Precision::fp32, -1, 1, nullptr, DType::f32, false, false, mode);
        CHECK(sim_shard.params == sim_plain.params);
    }
}

TEST_CASE("strategy.shard optimizer: a checkpoint's state is whole and resumes with another mode and replica count") {
    std::vector<std::pair<std::string, std::vector<float>>> from4;
    const TrainResult four =
        train("cpu:4", 5, 0.0005, 1, "adamw", 0.0, "ring", false, false, ShardMode::optimizer, &from4);
    const Model model(
        {12}, {dense(16, Activation::relu), dropout(0.2f), dense(16, Activation::gelu), dense(5, Activation::none)}, 3);
    for (bool shard : {true, false}) {
        CAPTURE(shard);
        StrategyConfig sc;
        sc.devices = "cpu:2";
        sc.bucket_mb = 0.0003;
        sc.shard = shard ? StrategyConfig::Shard::optimizer : StrategyConfig::Shard::none;
        OptimizerConfig oc = make_optimizer_config("adamw");
        oc.weight_decay = 1e-3;
        MirroredStrategy st(sc, model, oc, 24, 1);
        st.upload_state(four.params, from4);
        CHECK(st.download_params() == four.params);
        const auto back = st.download_optimizer_state();
        REQUIRE(back.size() == from4.size());
        for (size_t i = 0; i < back.size(); ++i) CHECK(back[i] == from4[i]);
        for (int r = 0; r < 2; ++r) CHECK(st.checksum(r) == four.checksums[0]);
    }
    // a state that does not fit is refused before anything is copied
    StrategyConfig sc;
    sc.devices = "cpu:2";
    sc.shard = StrategyConfig::Shard::optimizer;
    MirroredStrategy st(sc, model, make_optimizer_config("adamw"), 24, 1);
    auto wrong = from4;
    wrong[1].second.pop_back();
    CHECK_THROWS_AS(st.upload_state(four.params, wrong), CheckpointError);
}

TEST_CASE(
    "strategy.shard: refused with ops that cannot split and a bf16 wire, naming the key; auto times those that "
    "split") {
    const std::string base = "model: {layers: [{type: dense, units: 3}]}\nstrategy: {shard: optimizer, ";
    for (const char* op : {"direct", "reduce_to_one"}) {
        CAPTURE(op);
        const std::string text = base + "cross_device_ops: " + op + "}\n";
        CHECK_THROWS_WITH_AS(load_config_text(text, "s.yaml", {}),
                             doctest::Contains("strategy.shard: optimizer needs an op that splits"), ConfigError);
        for (const char* can : {"ops that do: ", "ring", "nccl"})
            CHECK_THROWS_WITH_AS(load_config_text(text, "s.yaml", {}), doctest::Contains(can), ConfigError);
    }
    for (const char* op : {"ring", "nccl"}) {
        CAPTURE(op);
        CHECK(load_config_text(base + "cross_device_ops: " + op + "}\n", "s.yaml", {}).strategy.shard ==
              StrategyConfig::Shard::optimizer);
    }
    CHECK_THROWS_WITH_AS(load_config_text(base + "allreduce_dtype: bf16}\n", "s.yaml", {}),
                         doctest::Contains("strategy.shard: optimizer exchanges fp32 gradients"), ConfigError);
    CHECK_THROWS_WITH_AS(load_config_text(base + "cross_device_ops: ring}\n", "s.yaml", {"strategy.shard=all"}),
                         doctest::Contains("strategy.shard"), ConfigError);
    const Config ok = load_config_text(base + "cross_device_ops: auto}\n", "s.yaml", {});
    CHECK(ok.strategy.shard == StrategyConfig::Shard::optimizer);
    // auto with sharding: on CPU replicas the ring alone splits (direct does not): nothing timed
    const TrainResult chosen = train("cpu:2", 2, 0.0005, 1, "sgd", 0.0, "auto", false, false, ShardMode::optimizer);
    CHECK(chosen.ops == std::string("ring"));
    CHECK(chosen.ops_choice.find("the one op here that splits") != std::string::npos);
    // on simulated GPUs, one per replica, the ring and nccl split: both timed as reduce-scatter and
    // all-gather, and the choice trains as that op set by name
    SimScope sim(0);
    CacheDirScope cache;
    const TrainResult timed = train("sim:0,1", 4, 0.0005, 1, "adamw", 0.0, "auto", false, false, ShardMode::optimizer);
    CHECK(timed.ops_choice.find("measured: ring ") != std::string::npos);
    CHECK(timed.ops_choice.find(", nccl ") != std::string::npos);
    CHECK(timed.ops_choice.find("direct") == std::string::npos);
    CHECK(train("sim:0,1", 4, 0.0005, 1, "adamw", 0.0, timed.ops, false, false, ShardMode::optimizer).params ==
          timed.params);
    // gradients: the same rules, named as such; auto times the ops on the staging slots
    const std::string staged = "model: {layers: [{type: dense, units: 3}]}\nstrategy: {shard: gradients, ";
    CHECK_THROWS_WITH_AS(load_config_text(staged + "cross_device_ops: direct}\n", "s.yaml", {}),
                         doctest::Contains("strategy.shard: gradients needs an op that splits"), ConfigError);
    CHECK_THROWS_WITH_AS(load_config_text(staged + "allreduce_dtype: bf16}\n", "s.yaml", {}),
                         doctest::Contains("strategy.shard: gradients exchanges fp32 gradients"), ConfigError);
    CHECK(load_config_text(staged + "cross_device_ops: ring}\n", "s.yaml", {}).strategy.shard == ShardMode::gradients);
    const TrainResult staged_auto =
        train("sim:0,1", 4, 0.0005, 1, "adamw", 0.0, "auto", false, false, ShardMode::gradients);
    CHECK(staged_auto.ops_choice.find("measured: ring ") != std::string::npos);
    CHECK(train("sim:0,1", 4, 0.0005, 1, "adamw", 0.0, staged_auto.ops, false, false, ShardMode::gradients).params ==
          staged_auto.params);
}
