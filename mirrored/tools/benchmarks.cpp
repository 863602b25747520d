// The loader, GEMM and training-step benchmarks. Each prints a table and writes the same
// numbers as JSON; none of them is a test (docs/PERFORMANCE.md records what they measured).
#include "mirrored/tools/tools.h"

#include "kernels/blas.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "data/datasets.h"
#include "data/loader.h"
#include "kernels/buffer.h"
#include "kernels/device.h"
#include "base/error.h"
#include "kernels/nccl.h"
#include "kernels/ops/flat.h"
#include "mirrored/util.h"
#include "mirrored/checkpoint.h"
#include "mirrored/config.h"
#include "mirrored/cross_device_ops.h"
#include "mirrored/replica_threads.h"
#include "mirrored/step_profile.h"
#include "mirrored/strategy.h"
#include "mirrored/tools/timed_steps.h"
#include "mirrored/session.h"
#include "mirrored/watchdog.h"
#include "kernels/ops/elementwise.h"
#include "kernels/ops/gemm.h"

namespace mirrored {

using json = nlohmann::json;

namespace {

// The loader's ceiling: one thread copying the same bytes sequentially (what a batch costs at
// best), in samples/s over half the benchmark's time.
double memcpy_ceiling(const Dataset& ds, int global_batch, double seconds) {
    const size_t per = ds.feature_size(), batch = size_t(global_batch);
    std::vector<float> dst(batch * per);
    const size_t batches = ds.count() / batch;
    size_t samples = 0, b = 0;
    const double start = now_s();
    double elapsed = 0;
    do {
        if (ds.source)  // read on demand: the ceiling is the source's own reads, in order
            for (size_t i = 0; i < batch; ++i)
                read_sample(ds, (b % batches) * batch + i, 0, dst.data() + i * per, nullptr);
        else std::memcpy(dst.data(), ds.features.data() + (b % batches) * batch * per, batch * per * sizeof(float));
        samples += batch;
        ++b;
        elapsed = now_s() - start;
    } while (elapsed < seconds / 2);
    return samples / elapsed;
}

// Samples/s of a loader with these threads (and augmentation), after 8 batches of warm-up.
double loader_rate(const Dataset& ds, const LoaderBenchOptions& o, int threads, bool augment) {
    LoaderOptions lo;
    lo.global_batch = o.batch;
    lo.threads = threads;
    lo.prefetch = std::max(4, 2 * threads);
    if (augment) {
        lo.augment.crop_padding = 2;
        lo.augment.horizontal_flip = true;
    }
    Loader loader(ds, lo);
    loader.start({});
    for (int i = 0; i < 8; ++i) loader.release(loader.next());
    size_t samples = 0;
    const double start = now_s();
    double elapsed = 0;
    do {
        const Batch& b = loader.next();
        samples += size_t(b.rows);
        loader.release(b);
        elapsed = now_s() - start;
    } while (elapsed < o.seconds);
    loader.stop();
    return samples / elapsed;
}

}  // namespace

int bench_loader(const LoaderBenchOptions& o) {
    DataConfig dc;
    std::string base;
    if (!o.config.empty()) {
        const Config c = load_config(o.config, {});
        dc = c.data;
        base = c.base_dir;
    }
    const double t0 = now_s();
    const Datasets data = load_datasets(dc, base, 1);
    const Dataset& ds = data.train;
    if (size_t(o.batch) > ds.count())
        throw ConfigError("--batch " + std::to_string(o.batch) + ": larger than the " + std::to_string(ds.count()) +
                          " training samples of " + ds.name);
    std::printf("dataset %s: %zu samples of %zu floats (loaded and normalised in %.2fs)\n", ds.name.c_str(), ds.count(),
                ds.feature_size(), now_s() - t0);
    std::printf("machine: %s, %u hardware threads; global batch %d\n\n", cpu_model_name().c_str(),
                std::thread::hardware_concurrency(), o.batch);
    const double ceiling_sps = memcpy_ceiling(ds, o.batch, o.seconds);
    const double bytes_per_sample = double(ds.feature_size() * sizeof(float));
    std::printf("ceiling: one thread memcpy of contiguous batches: %.0f samples/s (%.0f MB/s)\n\n", ceiling_sps,
                ceiling_sps * bytes_per_sample / 1e6);
    std::printf("%8s %10s %14s %10s %12s\n", "threads", "augment", "samples/s", "MB/s", "of ceiling");
    json rows = json::array();
    const bool images = ds.shape.size() == 3 && !ds.source;  // a source (an image folder) augments itself
    for (bool augment : {false, true}) {
        if (augment && !images) continue;
        for (int threads : o.threads) {
            const double sps = loader_rate(ds, o, threads, augment);
            const double mbs = sps * bytes_per_sample / 1e6;
            std::printf("%8d %10s %14.0f %10.0f %11.0f%%\n", threads, augment ? "crop+flip" : "none", sps, mbs,
                        100 * sps / ceiling_sps);
            rows.push_back({{"threads", threads}, {"augment", augment}, {"samples_per_sec", sps}, {"mb_per_sec", mbs}});
        }
    }
    json stages = nullptr;
    if (ds.source) {  // where one thread's time goes, sample by sample in a shuffled order
        SampleSource::Stages st;
        std::vector<float> x(ds.feature_size());
        size_t n = 0;
        const double start = now_s();
        do {
            ds.source->read_timed(uint32_t((n * 2654435761u) % ds.count()), 0, x.data(), st);
            ++n;
        } while (now_s() - start < o.seconds);
        // No copy stage: a sample is written where the batch holds it (or, with CPU replicas, into
        // the replica's input), straight from the transform.
        const double per = (st.read + st.decode + st.transform) / double(n);
        std::printf(
            "\none thread, per sample (%zu samples): read %.1f us, decode %.1f us, transform %.1f us"
            " (written in place: no copy) = %.0f samples/s per thread\n",
            n, 1e6 * st.read / double(n), 1e6 * st.decode / double(n), 1e6 * st.transform / double(n), 1 / per);
        stages = {{"samples", n},
                  {"read_us", 1e6 * st.read / double(n)},
                  {"decode_us", 1e6 * st.decode / double(n)},
                  {"transform_us", 1e6 * st.transform / double(n)},
                  {"samples_per_sec_per_thread", 1 / per}};
    }
    write_json(o.json, {{"benchmark", "loader"},
                        {"dataset", ds.name},
                        {"stages_one_thread", stages},
                        {"global_batch", o.batch},
                        {"memcpy_ceiling_samples_per_sec", ceiling_sps},
                        {"cpu", cpu_model_name()},
                        {"hardware_threads", std::thread::hardware_concurrency()},
                        {"results", rows}});
    return kExitOk;
}

namespace {

// The device of --device: cpu (one BLAS thread) or one GPU.
std::unique_ptr<Device> gemm_device(const std::string& spec) {
    if (spec == "cpu") {
        cpu_set_blas_threads(1);
        return make_cpu_device(0);
    }
    const DeviceList dl = parse_devices(spec);
    if (!dl.traits().gpu || dl.ordinals.size() != 1)
        throw ConfigError("--device: expected cpu or one GPU such as cuda:0, got '" + spec + "'");
    return dl.backend->make(dl.ordinals[0]);
}

// Seconds per GEMM of shape g, in batches of ten until `seconds` have passed: inputs in the
// device's precision (filled in f32, then converted), output f32.
double time_gemm(Device& d, const GemmShape& g, double seconds) {
    const DType type = d.value_dtype();
    const size_t na = size_t(g.m) * size_t(g.k), nb = size_t(g.k) * size_t(g.n), nc = size_t(g.m) * size_t(g.n);
    DeviceBuffer<float> a32(d, na), b32(d, nb), c(d, nc);
    DeviceBuffer<unsigned char> a(d, d.act_bytes(na)), b(d, d.act_bytes(nb));
    const Stream s = d.compute_stream();
    fill_floats(d, s, na, 0.5f, a32.data());
    fill_floats(d, s, nb, 0.25f, b32.data());
    convert_values(d, s, na, a32.data(), DType::f32, a.data(), type);
    convert_values(d, s, nb, b32.data(), DType::f32, b.data(), type);
    const int lda = g.trans_a ? g.m : g.k, ldb = g.trans_b ? g.k : g.n;
    auto once = [&] {
        gemm(d, s, g.trans_a, g.trans_b, g.m, g.n, g.k, 1.0f, a.data(), lda, b.data(), ldb, 0.0f, c.data(), g.n,
             GemmTypes{type, type, DType::f32});
    };
    once();
    d.synchronize();
    int iters = 0;
    const double start = now_s();
    double elapsed = 0;
    do {
        for (int i = 0; i < 10; ++i) once();
        d.synchronize();
        iters += 10;
        elapsed = now_s() - start;
    } while (elapsed < seconds);
    return elapsed / iters;
}

}  // namespace

namespace {

// A dense layer of `width` inputs and outputs over `rows` samples: its forward (x W^T), weight
// gradient (dy^T x) and input gradient (dy W) products.
std::vector<GemmShape> sweep_grid() {
    std::vector<GemmShape> shapes;
    for (int width : {64, 256, 1024, 4096})
        for (int rows : {16, 64, 256, 1024}) {
            shapes.push_back({rows, width, width, false, true});
            shapes.push_back({width, width, rows, true, false});
            shapes.push_back({rows, width, width, false, false});
        }
    return shapes;
}

int sweep_gemm(const GemmBenchOptions& o) {
    cpu_set_blas_threads(1);
    const std::vector<GemmShape> shapes = o.shapes.empty() ? sweep_grid() : o.shapes;
    std::printf("GEMM kernels of a CPU replica, one thread: %s, %s\n", cpu_model_name().c_str(),
                blas_description().c_str());
    const double peak = cpu_fma_peak_gflops(0.2);
    std::printf("the core's peak (a register-only FMA loop): %.1f GFLOP/s\n", peak);
    const GemmSweepPoint large = sweep_cpu_gemm(false, false, 2048, 2048, 2048, o.sweep_seconds);
    const double large_gflops = large.rates.empty() ? 0 : large.rates.front().gflops;
    std::printf("OpenBLAS's large sgemm (2048^3, nn): %.1f GFLOP/s (%.0f%% of peak)\n\n", large_gflops,
                100 * large_gflops / peak);
    std::fflush(stdout);
    const std::vector<std::string> kernels = cpu_gemm_kernel_names();
    std::printf("%3s %6s %6s %6s", "ops", "m", "n", "k");
    for (const std::string& k : kernels) std::printf(" %17s", k.c_str());
    std::printf("  %-17s %-17s %7s\n", "fastest", "rules' pick", "of peak");
    json rows = json::array();
    int rules_fastest = 0;
    std::vector<double> gain;  // the fastest over OpenBLAS as asked
    const double started = now_s();
    for (size_t i = 0; i < shapes.size(); ++i) {
        const GemmShape& g = shapes[i];
        const GemmSweepPoint p = sweep_cpu_gemm(g.trans_a, g.trans_b, g.m, g.n, g.k, o.sweep_seconds);
        const std::string ops = std::string(g.trans_a ? "t" : "n") + (g.trans_b ? "t" : "n");
        std::printf("%3s %6d %6d %6d", ops.c_str(), g.m, g.n, g.k);
        json rates = json::object();
        double best = 0, blas = 0, rules = 0;
        for (const std::string& k : kernels) {
            double r = 0;
            for (const GemmKernelRate& x : p.rates)
                if (x.kernel == k) r = x.gflops;
            if (r > 0) std::printf(" %17.1f", r), rates[k] = r;
            else std::printf(" %17s", "-");
            best = std::max(best, r);
            if (k == "openblas") blas = r;
            if (p.rules == k) rules = r;
        }
        std::printf("  %-17s %-17s %6.0f%%\n", p.fastest.c_str(), p.rules.c_str(), 100 * best / peak);
        if (p.rules == p.fastest) ++rules_fastest;
        if (blas > 0) gain.push_back(best / blas);
        rows.push_back({{"m", g.m},
                        {"n", g.n},
                        {"k", g.k},
                        {"ops", ops},
                        {"gflops", rates},
                        {"fastest", p.fastest},
                        {"rules", p.rules},
                        {"rules_gflops", rules},
                        {"of_peak", best / peak}});
        const double per = (now_s() - started) / double(i + 1);
        std::fflush(stdout);
        if (i + 1 < shapes.size() && (i + 1) % 12 == 0)
            std::fprintf(stderr, "bench-gemm --sweep: %zu of %zu shapes, about %.0f s left\n", i + 1, shapes.size(),
                         per * double(shapes.size() - i - 1));
    }
    std::sort(gain.begin(), gain.end());
    const double median_gain = gain.empty() ? 1.0 : gain[gain.size() / 2];
    std::printf(
        "\nthe static rules pick the fastest kernel on %d of %zu products; the fastest beats OpenBLAS as asked by "
        "%.2fx on the median product, %.2fx at most\n",
        rules_fastest, shapes.size(), median_gain, gain.empty() ? 1.0 : gain.back());
    write_json(o.json, {{"benchmark", "gemm-sweep"},
                        {"cpu", cpu_model_name()},
                        {"blas", blas_description()},
                        {"fma_peak_gflops", peak},
                        {"large_sgemm_gflops", large_gflops},
                        {"rules_pick_fastest", rules_fastest},
                        {"median_gain_over_openblas", median_gain},
                        {"results", rows}});
    return kExitOk;
}

}  // namespace

int bench_gemm(const GemmBenchOptions& o) {
    if (o.sweep) return sweep_gemm(o);
    const std::unique_ptr<Device> d = gemm_device(o.device);
    const Precision precision = o.tf32 ? Precision::tf32 : o.precision;
    d->set_precision(precision);
    std::printf("GEMM in %s on %s (%s)\n\n", precision_name(precision), d->name().c_str(),
                d->traits().gpu ? d->description().c_str() : (cpu_model_name() + ", one BLAS thread").c_str());
    std::printf("%8s %8s %8s %4s %12s %10s\n", "m", "n", "k", "ops", "time (us)", "GFLOP/s");
    std::vector<GemmShape> shapes = o.shapes;
    if (shapes.empty())
        for (int size : o.sizes) shapes.push_back({size, size, size, false, true});
    json rows = json::array();
    double total_s = 0, total_flop = 0;
    for (const GemmShape& g : shapes) {
        const double t = time_gemm(*d, g, o.seconds);
        const double flop = 2.0 * g.m * double(g.n) * g.k, gflops = flop / t / 1e9;
        const std::string ops = std::string(g.trans_a ? "t" : "n") + (g.trans_b ? "t" : "n");
        std::printf("%8d %8d %8d %4s %12.1f %10.1f\n", g.m, g.n, g.k, ops.c_str(), t * 1e6, gflops);
        rows.push_back({{"m", g.m}, {"n", g.n}, {"k", g.k}, {"ops", ops}, {"time_us", t * 1e6}, {"gflops", gflops}});
        total_s += t;
        total_flop += flop;
    }
    if (shapes.size() > 1)
        std::printf("%35s %12.1f %10.1f  (all, one after another)\n", "", total_s * 1e6, total_flop / total_s / 1e9);
    write_json(o.json, {{"benchmark", "gemm"},
                        {"device", d->traits().gpu ? d->description() : cpu_model_name()},
                        {"blas", blas_description()},
                        {"precision", precision_name(precision)},
                        {"results", rows}});
    return kExitOk;
}

namespace {

// bench-step --layers: `steps` more steps with replica 0 marked layer by layer (StepProfile):
// where its step time goes - each top-level layer's forward and backward (with its GEMM rate),
// the input, the loss, the all-reduce (or shared sums) and the update, in us per step.
json profile_layers(Session& s, int steps, int64_t first_step) {
    MirroredStrategy& st = *s.strategy;
    const Model& model = *s.model;
    StepProfile profile(*st.replica(0).device, int(model.layers().size()), model.gradient_units(),
                        st.accumulation_steps());
    st.set_profile(&profile);
    const float lr = float(s.cfg.optimizer.lr);
    for (int i = 0; i < steps; ++i) {
        st.train_step(st.next_batch(*s.train_loader), first_step + i, lr, s.cfg.run.seed, false);
        profile.collect();
    }
    st.set_profile(nullptr);
    st.synchronize();
    const StepProfile::Totals& t = profile.totals();
    const double per = 1e6 / double(std::max(t.steps, 1));
    const double rows = double(s.cfg.train.global_batch_size) / double(st.all_replicas());  // replica 0's
    // GFLOP/s of a layer's GEMMs from its time summed over the profiled steps
    auto rate = [&](double flop, double total_s) {
        return total_s > 0 && flop > 0 ? flop * rows * double(t.steps) / total_s / 1e9 : 0.0;
    };
    const auto names = model.layer_descriptions();
    const auto flops = model.layer_flops();
    json layers = json::array();
    for (size_t i = 0; i < names.size(); ++i)
        layers.push_back({{"layer", names[i]},
                          {"forward_us", t.forward[i] * per},
                          {"backward_us", t.backward[i] * per},
                          {"forward_gflops", rate(flops[i].forward, t.forward[i])},
                          {"backward_gflops", rate(flops[i].backward, t.backward[i])}});
    return {
        {"steps", t.steps},
        {"clock", st.device_traits().asynchronous ? "device time between events" : "host clock"},
        {"layers", layers},
        {"phases_us",
         {{"input", t.input * per}, {"loss", t.loss * per}, {"reduce", t.reduce * per}, {"update", t.update * per}}},
        {"step_us", t.step * per}};
}

void print_profile(const json& p) {
    const double step = p["step_us"].get<double>();
    auto share = [&](double us) { return step > 0 ? 100.0 * us / step : 0.0; };
    std::printf("  replica 0, us per step (mean of %d profiled steps, %s):\n", p["steps"].get<int>(),
                p["clock"].get<std::string>().c_str());
    std::printf("  %-44s %10s %10s %7s %9s %9s\n", "", "forward", "backward", "share", "fwd GF/s", "bwd GF/s");
    for (const json& l : p["layers"]) {
        const double f = l["forward_us"].get<double>(), b = l["backward_us"].get<double>();
        std::printf("  %-44s %10.1f %10.1f %6.1f%% %9.1f %9.1f\n", l["layer"].get<std::string>().c_str(), f, b,
                    share(f + b), l["forward_gflops"].get<double>(), l["backward_gflops"].get<double>());
    }
    const std::pair<const char*, const char*> phases[] = {{"input", "input (conversion, statistics reset)"},
                                                          {"loss", "loss (softmax cross-entropy)"},
                                                          {"reduce", "all-reduce / shared sums (exposed)"},
                                                          {"update", "update (optimizer)"}};
    for (const auto& [key, what] : phases) {
        const double us = p["phases_us"][key].get<double>();
        std::printf("  %-44s %10.1f %10s %6.1f%%\n", what, us, "", share(us));
    }
    std::printf("  %-44s %10.1f\n\n", "step (begin to end)", step);
}

// Without --devices: 1, 2, 4, ... replicas up to every GPU (or core), ending on all of them.
std::vector<std::string> default_device_lists() {
    const DeviceList all = parse_devices("auto");
    const int n = int(all.ordinals.size());
    std::vector<std::string> lists;
    for (int k = 1; k <= n; k *= 2) {  // the first k of auto's devices: GPUs 0..k-1, or k CPU replicas
        std::string spec = std::string(all.backend->name) + ":";
        if (all.traits().gpu)
            for (int i = 0; i < k; ++i) spec += (i ? "," : "") + std::to_string(i);
        else spec += std::to_string(k);
        lists.push_back(spec);
        if (k * 2 > n && k != n) k = n / 2;  // end on n
    }
    return lists;
}

struct StepMeasurement {
    int replicas = 0;
    double samples_per_s = 0, step_ms = 0, gflops = 0;
    double host_calls = 0;  // per replica and step: device calls the host issued
    bool cuda_graph = false;
    TimeSplit split;
    json profile;  // --layers
};

// o.warmup steps, then o.steps timed as one span (the last one sampled for the time split), then
// the layer profile.
StepMeasurement measure_steps(const Config& cfg, const std::shared_ptr<const Datasets>& data, const StepBenchOptions& o,
                              Watchdog* watchdog) {
    auto s = start_timed_session(cfg, data, watchdog);
    const TimedSteps t = time_steps(*s, o.warmup, o.steps, o.steps, watchdog);
    StepMeasurement m;
    m.replicas = s->strategy->replicas();
    m.host_calls = double(t.host_work.total()) / (double(o.steps) * m.replicas);  // a captured step's replays: a few
    m.split = t.split;
    if (watchdog) watchdog->phase("the layer profile", 0);
    if (o.layer_steps > 0) m.profile = profile_layers(*s, o.layer_steps, t.steps_run);
    s->train_loader->stop();
    m.samples_per_s = double(o.steps) * cfg.train.global_batch_size / t.elapsed_s;
    m.step_ms = 1e3 * t.elapsed_s / o.steps;
    m.gflops = m.samples_per_s * s->model->train_flops_per_sample() / 1e9;
    m.cuda_graph = s->strategy->cuda_graph();
    return m;
}

}  // namespace

int bench_step(const StepBenchOptions& o) {
    const Config base = load_config(o.config, o.sets);
    const std::vector<std::string> lists = o.devices.empty() ? default_device_lists() : o.devices;
    const double t0 = now_s();
    const auto watchdog = steps_watchdog(base.strategy.step_timeout_s);
    auto data = std::make_shared<const Datasets>(load_datasets(base.data, base.base_dir, base.run.seed));
    std::printf("config %s: %s, global batch %d; data ready in %.1fs\n\n", o.config.c_str(),
                model_config_summary(base).c_str(), base.train.global_batch_size, now_s() - t0);
    std::printf("%-28s %8s %12s %12s %9s %10s %9s %8s %8s %8s %11s\n", "devices", "replicas", "samples/s",
                "per replica", "speedup", "efficiency", "GFLOP/s", "data%", "compute%", "comm%", "host calls");
    json rows = json::array();
    double base_sps = 0;
    int base_n = 0;
    for (const auto& spec : lists) {
        Config cfg = base;
        cfg.strategy.devices = spec;
        if (o.per_replica_batch > 0)
            cfg.train.global_batch_size = o.per_replica_batch * int(parse_devices(spec).ordinals.size());
        const StepMeasurement m = measure_steps(cfg, data, o, watchdog.get());
        const int n = m.replicas;
        if (base_n == 0) {
            base_sps = m.samples_per_s;
            base_n = n;
        }
        const double speedup = m.samples_per_s / base_sps;
        const double efficiency = speedup / (double(n) / base_n);
        const TimeSplit& split = m.split;
        const double busy = std::max(split.data_wait_s + split.compute_s + split.comm_s, 1e-12);
        std::printf("%-28s %8d %12.0f %12.0f %8.2fx %9.0f%% %9.1f %8.1f %8.1f %8.1f %11.1f\n", spec.c_str(), n,
                    m.samples_per_s, m.samples_per_s / n, speedup, 100 * efficiency, m.gflops,
                    100 * split.data_wait_s / busy, 100 * split.compute_s / busy, 100 * split.comm_s / busy,
                    m.host_calls);
        rows.push_back(
            {{"devices", spec},
             {"replicas", n},
             {"global_batch", cfg.train.global_batch_size},
             {"samples_per_sec", m.samples_per_s},
             {"step_ms", m.step_ms},
             {"host_calls_per_replica_step", m.host_calls},
             {"cuda_graph", m.cuda_graph},
             {"fused_epilogues", cfg.strategy.fused_epilogues},
             {"gflops", m.gflops},
             {"speedup", speedup},
             {"efficiency", efficiency},
             {"time_split",
              {{"data_wait_s", split.data_wait_s}, {"compute_s", split.compute_s}, {"comm_s", split.comm_s}}}});
        if (!m.profile.is_null()) {
            print_profile(m.profile);
            rows.back()["profile"] = m.profile;
        }
    }
    if (o.per_replica_batch > 0)
        std::printf(
            "\nspeedup and efficiency are relative to the first row; %d samples per replica per step (weak scaling)\n",
            o.per_replica_batch);
    else
        std::printf(
            "\nspeedup and efficiency are relative to the first row; the global batch is fixed (strong scaling):\n"
            "--per-replica-batch B scales it with the replicas instead\n");
    write_json(o.json, {{"benchmark", "step"},
                        {"config", o.config},
                        {"global_batch", base.train.global_batch_size},
                        {"model", model_config_summary(base)},
                        {"cpu", cpu_model_name()},
                        {"blas", blas_description()},
                        {"results", rows}});
    return kExitOk;
}

}  // namespace mirrored
