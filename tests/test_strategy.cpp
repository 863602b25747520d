// Mirrored strategy: device specs, buckets, exact all-reduce for every op and replica count,
// N replicas against one replica on the same global batch, bit-identical replicas, divergence
// detection. CPU replicas always; CUDA (including four replicas on GPU 0) when a GPU is present.
#include <doctest/doctest.h>

#include <cmath>

#include "data/dataset.h"
#include "data/loader.h"
#include "kernels/error.h"
#include "mirrored/cross_device_ops.h"
#include "mirrored/strategy.h"
#include "tests/helpers.h"

using namespace mirrored;
using namespace mirrored::test;

namespace {

// Sums integer-valued floats across n replicas and checks every element of every replica is
// the exact sum, and that elements outside [offset, offset+len) are untouched.
void check_all_reduce(const std::string& op, DeviceType type, const std::vector<int>& ordinals, size_t len,
                      Rng& rng) {
    const int n = int(ordinals.size());
    const size_t guard = 5, total = len + 2 * guard;
    std::vector<std::unique_ptr<Device>> devs;
    std::vector<DeviceBuffer<float>> bufs;
    std::vector<std::vector<float>> host(n);
    std::vector<Device*> dp;
    std::vector<float*> bp;
    for (int r = 0; r < n; ++r) {
        devs.push_back(type == DeviceType::cuda ? make_cuda_device(ordinals[r]) : make_cpu_device(r));
        host[r].resize(total);
        for (auto& v : host[r]) v = float(rng.integer(-1000, 1000));
        bufs.push_back(upload(*devs[r], host[r]));
        devs[r]->synchronize();
        dp.push_back(devs[r].get());
        bp.push_back(bufs[r].data());
    }
    ReplicaThreads threads(n);
    auto ops = make_cross_device_ops(op, dp, bp, threads.barrier());
    threads.run([&](int r) {
        ops->all_reduce(r, guard, len);
        devs[r]->comm_stream();
        devs[r]->synchronize();
    });
    std::vector<float> want(host[0]);
    for (size_t i = guard; i < guard + len; ++i) {
        double s = 0;
        for (int r = 0; r < n; ++r) s += host[r][i];
        want[i] = float(s);
    }
    bool exact = true, identical = true, untouched = true;
    std::vector<float> first;
    for (int r = 0; r < n; ++r) {
        const auto got = download(*devs[r], bufs[r]);
        for (size_t i = guard; i < guard + len; ++i) exact = exact && got[i] == want[i];
        for (size_t i = 0; i < guard; ++i)
            untouched = untouched && got[i] == host[r][i] && got[total - 1 - i] == host[r][total - 1 - i];
        if (r == 0) first = got;
        else
            for (size_t i = guard; i < guard + len; ++i) identical = identical && got[i] == first[i];
    }
    CAPTURE(op);
    CAPTURE(n);
    CAPTURE(len);
    CHECK(exact);
    CHECK(identical);
    CHECK(untouched);
}

void all_reduce_matrix(const std::string& op, DeviceType type, int max_n, bool same_gpu) {
    Rng rng(31 + max_n);
    for (int n = 1; n <= max_n; ++n) {
        std::vector<int> ordinals;
        for (int r = 0; r < n; ++r) ordinals.push_back(same_gpu ? 0 : r);
        for (size_t len : {size_t(1), size_t(n > 1 ? n - 1 : 1), size_t(n), size_t(n + 1), size_t(1009),
                           size_t(262147)})
            check_all_reduce(op, type, ordinals, len, rng);
    }
}

LayerSpec dense(int units, Activation act) {
    LayerSpec s;
    s.type = LayerSpec::Type::dense;
    s.units = units;
    s.activation = act;
    s.init = InitKind::he_uniform;
    return s;
}

struct TrainResult {
    std::vector<float> params;
    std::vector<uint64_t> checksums;
    Metrics metrics;
};

// `steps` optimizer steps on a small synthetic problem; returns replica 0's parameters.
TrainResult train(const std::string& devices, int steps, double bucket_mb, int accumulation = 1,
                  OptimizerConfig::Type opt_type = OptimizerConfig::Type::sgd, double clip = 0.0) {
    SyntheticOptions so;
    so.shape = {12};
    so.classes = 5;
    so.samples = 480;
    so.seed = 7;
    const Dataset ds = make_synthetic(so);
    LayerSpec drop;
    drop.type = LayerSpec::Type::dropout;
    drop.rate = 0.2f;
    const Model model({12}, {dense(16, Activation::relu), drop, dense(16, Activation::gelu), dense(5, Activation::none)}, 3);
    OptimizerConfig oc;
    oc.type = opt_type;
    oc.lr = opt_type == OptimizerConfig::Type::sgd ? 0.1 : 0.01;
    oc.weight_decay = 1e-3;
    oc.grad_clip_norm = clip;
    StrategyConfig sc;
    sc.devices = devices;
    sc.bucket_mb = bucket_mb;
    sc.verify_every_steps = 5;
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
    for (int s = 0; s < steps; ++s) strategy.train_step(loader.next(), s, float(oc.lr), 99, false);
    strategy.request_train_metrics();
    TrainResult out;
    out.metrics = strategy.take_train_metrics();
    out.params = strategy.download_params();
    for (int r = 0; r < strategy.replicas(); ++r) out.checksums.push_back(strategy.checksum(r));
    return out;
}

}  // namespace

TEST_CASE("device specs: auto, cpu:N, and clear errors for malformed ones") {
    CHECK(parse_devices("cpu:3").ordinals == std::vector<int>{0, 1, 2});
    CHECK(parse_devices("cpu:3").type == DeviceType::cpu);
    CHECK(parse_devices("cpu:3").describe() == "cpu:0,cpu:1,cpu:2");
    CHECK(!parse_devices("auto").ordinals.empty());
    CHECK_THROWS_WITH_AS(parse_devices("gpu:0"), doctest::Contains("strategy.devices"), ConfigError);
    CHECK_THROWS_WITH_AS(parse_devices("cpu:0"), doctest::Contains("cpu:N"), ConfigError);
    CHECK_THROWS_WITH_AS(parse_devices("cpu:x"), doctest::Contains("expected device numbers"), ConfigError);
    if (!have_cuda()) {
        CHECK_THROWS_AS(parse_devices("cuda:0"), DeviceError);
        CHECK(parse_devices("auto").type == DeviceType::cpu);
    } else {
        CHECK(parse_devices("cuda:0,0,0,0").ordinals == std::vector<int>{0, 0, 0, 0});
        CHECK_THROWS_AS(parse_devices("cuda:99"), DeviceError);
    }
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
            CHECK(b[i].ready_after_layer <= b[i - 1].ready_after_layer);
        }
        if (mb == 0.0 || mb == 100.0) CHECK(b.size() == 1);
    }
    CHECK(make_buckets(m, 0.001).size() == 4);
}

TEST_CASE("cpu all-reduce (ring, reduce_to_one) is exact and bit-identical for N = 1..8, any length") {
    all_reduce_matrix("ring", DeviceType::cpu, 8, false);
    all_reduce_matrix("reduce_to_one", DeviceType::cpu, 8, false);
}

TEST_CASE("nccl refuses CPU replicas; unknown ops list the known ones") {
    auto d = make_cpu_device(0);
    DeviceBuffer<float> b(*d, 4);
    ReplicaBarrier barrier(1);
    CHECK_THROWS_AS(make_cross_device_ops("nccl", {d.get()}, {b.data()}, barrier), ConfigError);
    CHECK_THROWS_WITH_AS(make_cross_device_ops("tree", {d.get()}, {b.data()}, barrier),
                         doctest::Contains("ring, nccl, reduce_to_one"), ConfigError);
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

TEST_CASE("gradient accumulation and AdamW with clipping: N replicas still match one") {
    const TrainResult one = train("cpu:1", 5, 0.0, 1, OptimizerConfig::Type::adamw, 0.5);
    const TrainResult acc = train("cpu:2", 5, 0.0005, 3, OptimizerConfig::Type::adamw, 0.5);
    CHECK(rel_error(acc.params, one.params) < 1e-5);
}

TEST_CASE("replicas stay bit-identical over many steps; verify_every_steps checks it") {
    const TrainResult r = train("cpu:3", 40, 0.0005);  // verify runs every 5 steps inside
    for (uint64_t c : r.checksums) CHECK(c == r.checksums[0]);
}

TEST_CASE("verify_replicas names the tensor and replica of a deliberately corrupted copy") {
    const Model model({6}, {dense(8, Activation::relu), dense(3, Activation::none)}, 1);
    StrategyConfig sc;
    sc.devices = "cpu:3";
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

TEST_CASE("global batch must divide into replicas x accumulation steps") {
    const Model model({6}, {dense(3, Activation::none)}, 1);
    StrategyConfig sc;
    sc.devices = "cpu:3";
    CHECK_THROWS_WITH_AS(MirroredStrategy(sc, model, OptimizerConfig{}, 10, 1),
                         doctest::Contains("does not divide into 3 replicas"), ConfigError);
    CHECK_THROWS_AS(MirroredStrategy(sc, model, OptimizerConfig{}, 12, 5), ConfigError);
}

TEST_CASE("cuda all-reduce: ring and reduce_to_one on replicas sharing GPU 0 (N = 1..8)") {
    SKIP_WITHOUT_CUDA();
    all_reduce_matrix("ring", DeviceType::cuda, 8, true);
    all_reduce_matrix("reduce_to_one", DeviceType::cuda, 4, true);
}

TEST_CASE("cuda all-reduce through staged peer copies (copy and add pipelined) is exact too") {
    SKIP_WITHOUT_CUDA();
    cuda_set_peer_transport(PeerTransport::staged);
    Rng rng(77);
    for (int n : {2, 3})
        for (size_t len : {size_t(1), size_t(1009), size_t(3) << 20})  // the last spans several slices
            check_all_reduce("ring", DeviceType::cuda, std::vector<int>(size_t(n), 0), len, rng);
    check_all_reduce("reduce_to_one", DeviceType::cuda, {0, 0, 0}, size_t(5) << 20, rng);
    cuda_set_peer_transport(PeerTransport::automatic);
}

TEST_CASE("cuda all-reduce across distinct GPUs (ring, reduce_to_one, nccl)") {
    SKIP_WITHOUT_CUDA();
    const int gpus = cuda_device_count();
    if (gpus < 2) {
        mark_skipped("needs 2 or more GPUs, " + std::to_string(gpus) + " visible");
        return;
    }
    for (const char* op : {"ring", "reduce_to_one", "nccl"}) all_reduce_matrix(op, DeviceType::cuda, gpus, false);
}

TEST_CASE("nccl refuses a device list that repeats a GPU") {
    SKIP_WITHOUT_CUDA();
    auto a = make_cuda_device(0), b = make_cuda_device(0);
    DeviceBuffer<float> x(*a, 4), y(*b, 4);
    ReplicaBarrier barrier(2);
    CHECK_THROWS_WITH_AS(make_cross_device_ops("nccl", {a.get(), b.get()}, {x.data(), y.data()}, barrier),
                         doctest::Contains("cannot place two replicas"), ConfigError);
}

TEST_CASE("cuda: N replicas on GPU 0 match one replica, and match the CPU run") {
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
