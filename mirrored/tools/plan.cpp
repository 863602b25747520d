// `mirrored plan CONFIG --gpus 2,4,8 --gpu h200 --link nvlink4`: does the model fit, how long a
// step takes and what more GPUs buy, for GPUs not at hand (mirrored/tools/planner.h is the model).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "data/datasets.h"
#include "data/io.h"
#include "data/loader.h"
#include "kernels/backends.h"
#include "kernels/buffer.h"
#include "kernels/error.h"
#include "mirrored/config.h"
#include "mirrored/strategy.h"
#include "mirrored/tools/hardware.h"
#include "mirrored/tools/planner.h"
#include "mirrored/tools/tools.h"
#include "mirrored/trainer.h"
#include "mirrored/util.h"

namespace mirrored {

using json = nlohmann::json;

namespace {

constexpr double kContextReserve = 1.0 * (1 << 30);  // the CUDA context, cuBLAS and NCCL: assumed 1 GiB
constexpr double kStopPaying = 0.75;                 // per-GPU efficiency below which more GPUs stop paying

std::string fmt(const char* f, double v) {
    char s[64];
    std::snprintf(s, sizeof s, f, v);
    return s;
}

// The model's input shape: the config's, else the dataset's (which must then be readable).
std::vector<int> input_shape(const Config& cfg) {
    if (!cfg.model.input_shape.empty()) return cfg.model.input_shape;
    try {
        return load_datasets(cfg.data, cfg.base_dir, cfg.run.seed).train.shape;
    } catch (const Error& e) {
        throw ConfigError("model.input_shape", std::string("needed to size the model, and the data cannot tell it (") +
                                                   e.what() + "): set model.input_shape");
    }
}

// The config with synthetic data of the model's shape, and one local device: compute measured
// here does not depend on the data's values.
Config local_config(const Config& base, const std::vector<int>& shape, int classes, int rows, int steps,
                    const std::string& devices) {
    Config c = base;
    c.data = DataConfig{};
    c.data.dataset = "synthetic";
    c.data.input_shape = shape;
    c.data.classes = classes;
    c.data.train_samples = size_t(rows) * size_t(steps + 2);
    c.data.test_samples = size_t(rows);
    c.data.normalize = DataConfig::Normalize::none;
    c.model.input_shape = shape;
    c.strategy.devices = devices;
    c.train.global_batch_size = rows;
    return c;
}

struct LocalStep {
    double seconds = 0;       // one step at `rows`
    double gemm_flops = 0;    // this device's GEMM ceiling, FLOP/s
    uint64_t launches = 0;    // per step, counted on a simulated GPU
    std::string device;
};

double gemm_ceiling(Device& d) {
    const int n = d.type() == DeviceType::cuda ? 4096 : 1024;
    const size_t count = size_t(n) * n;
    const DType t = d.value_dtype();
    DeviceBuffer<unsigned char> a(d, d.act_bytes(count)), b(d, d.act_bytes(count));
    DeviceBuffer<float> c(d, count), f(d, count);
    const Stream s = d.compute_stream();
    d.fill(s, count, 0.5f, f.data());
    d.convert(s, count, f.data(), DType::f32, a.data(), t);
    d.convert(s, count, f.data(), DType::f32, b.data(), t);
    auto once = [&] { d.gemm(s, false, true, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n, GemmTypes{t, t, DType::f32}); };
    once();
    d.synchronize();
    int iters = 0;
    const double t0 = now_s();
    do {
        once();
        d.synchronize();
        ++iters;
    } while (now_s() - t0 < 0.3);
    return 2.0 * n * double(n) * n * iters / (now_s() - t0);
}

LocalStep measure_local(const Config& base, const std::vector<int>& shape, int classes, int rows) {
    constexpr int kWarmup = 2, kSteps = 8;
    LocalStep out;
    out.device = cuda_device_count() > 0 ? "cuda:0" : "cpu:1";
    {
        const Config c = local_config(base, shape, classes, rows, kWarmup + kSteps, out.device);
        auto s = make_session(c, nullptr, true);
        MirroredStrategy& st = *s->strategy;
        st.init_and_broadcast();
        s->train_loader->start({});
        for (int i = 0; i < kWarmup; ++i) st.train_step(st.next_batch(*s->train_loader), i, 0.01f, c.run.seed, false);
        st.synchronize();
        const double t0 = now_s();
        for (int i = 0; i < kSteps; ++i) st.train_step(st.next_batch(*s->train_loader), kWarmup + i, 0.01f, c.run.seed, false);
        st.synchronize();
        out.seconds = (now_s() - t0) / kSteps;
        s->train_loader->stop();
        auto d = make_device(st.device_type(), 0);
        d->set_precision(base.train.precision);
        out.gemm_flops = gemm_ceiling(*d);
    }
    {  // the kernels a step launches, as the simulated GPU counts them
        const Config c = local_config(base, shape, classes, rows, 3, "sim:0");
        auto s = make_session(c, nullptr, true);
        MirroredStrategy& st = *s->strategy;
        st.init_and_broadcast();
        s->train_loader->start({});
        st.train_step(st.next_batch(*s->train_loader), 0, 0.01f, c.run.seed, false);
        st.synchronize();
        const StepWork before = st.host_work();
        st.train_step(st.next_batch(*s->train_loader), 1, 0.01f, c.run.seed, false);
        st.synchronize();
        out.launches = (st.host_work().device - before.device).launches;
        s->train_loader->stop();
    }
    return out;
}

// A profile measured on the target GPU: scaling.json (`scale`) or bench-step's JSON; the
// one-replica point gives the compute time per sample.
double profile_seconds_per_sample(const std::string& path) {
    std::ifstream in(path);
    if (!in) throw ConfigError("--profile: cannot read '" + path + "'");
    json j;
    try {
        j = json::parse(in);
    } catch (const std::exception& e) {
        throw ConfigError("--profile: " + path + " is not JSON (" + e.what() + ")");
    }
    if (!j.contains("results") || !j["results"].is_array())
        throw ConfigError("--profile: " + path + " has no results (expected scaling.json from `mirrored scale` or "
                          "bench-step --json)");
    for (const auto& r : j["results"]) {
        if (!r.is_object() || r.value("replicas", 0) != 1) continue;
        const double step_ms = r.value("step_ms", 0.0);
        const int rows = r.value("global_batch", 0);
        if (step_ms > 0 && rows > 0) return step_ms / 1e3 / rows;
    }
    throw ConfigError("--profile: " + path + " has no one-replica point with step_ms and global_batch");
}

}  // namespace

int plan(const PlanOptions& o) {
    if (o.mode != "weak" && o.mode != "strong")
        throw ConfigError("--mode: expected weak or strong, got '" + o.mode + "'");
    if (o.gpus.empty()) throw ConfigError("--gpus: expected GPU counts such as 2,4,8");
    for (int n : o.gpus)
        if (n < 1 || n > 1024) throw ConfigError("--gpus: expected counts from 1 to 1024, got " + std::to_string(n));
    if (o.nodes < 1 || o.nodes > 4096) throw ConfigError("--nodes: expected 1 to 4096, got " + std::to_string(o.nodes));
    for (double v : {o.memory_gb, o.tflops, o.bus_gbs, o.latency_us, o.launch_us, o.network_gbs, o.network_latency_us})
        if (!(v >= 0) || !std::isfinite(v)) throw ConfigError("plan: figures must be finite and >= 0");
    GpuSpec gpu = find_gpu(o.gpu);
    LinkSpec link = find_link(o.link.empty() ? gpu.link : o.link);
    if (o.memory_gb > 0) gpu.memory_gib = o.memory_gb;
    if (o.bus_gbs > 0) link.bus_gbs = o.bus_gbs;
    if (o.latency_us > 0) link.latency_us = o.latency_us;
    NetworkSpec net = find_network(o.network);
    if (o.network_gbs > 0) net.node_gbs = o.network_gbs;
    if (o.network_latency_us > 0) net.latency_us = o.network_latency_us;
    const int nodes = o.nodes;
    const Config base = load_config(o.config, o.sets);
    const Precision precision = base.train.precision;
    const double peak = (o.tflops > 0 ? o.tflops : gpu.tflops(precision)) * 1e12;
    std::vector<int> counts = o.gpus;
    std::sort(counts.begin(), counts.end());
    counts.erase(std::unique(counts.begin(), counts.end()), counts.end());
    const int global = base.train.global_batch_size;
    const int per_replica_weak = o.per_replica_batch > 0 ? o.per_replica_batch : std::max(1, global / counts.front());
    if (o.mode == "strong")
        for (int n : counts)
            if (global % (n * nodes) != 0)
                throw ConfigError("train.global_batch_size " + std::to_string(global) + " does not divide into " +
                                  std::to_string(n * nodes) + " GPUs (strong scaling keeps it)");

    const std::vector<int> shape = input_shape(base);
    const Model model(shape, base.model.layers, base.run.seed);
    const int classes = model.output_features();
    const double flops_per_sample = model.train_flops_per_sample();
    StrategyConfig strategy = base.strategy;
    strategy.precision = precision;
    const CommPlan comm = comm_plan(model, strategy);
    const LinkModel lm{link.bus_gbs * 1e9, link.latency_us * 1e-6};
    const LinkModel netm{net.node_gbs * 1e9, net.latency_us * 1e-6};

    std::printf("plan %s: %s\n", o.config.c_str(), model_config_summary(base).c_str());
    std::printf("  %zu parameters, %.1f MFLOP per sample (forward and backward), %s\n", model.param_count(),
                flops_per_sample / 1e6, precision_name(precision));
    std::printf("  GPU %s: %s, %.0f GB, %.1f dense TFLOP/s %s%s [%s]\n", gpu.name.c_str(), gpu.description.c_str(),
                gpu.memory_gib, peak / 1e12, precision_name(precision), o.tflops > 0 ? " (--tflops)" : "", gpu.source.c_str());
    std::printf("  link %s: %s; bus bandwidth %.1f GB/s, %.1f us per ring step [%s]\n", link.name.c_str(),
                link.description.c_str(), link.bus_gbs, link.latency_us, link.source.c_str());
    if (nodes > 1)
        std::printf("  %d nodes over %s: %s; %.1f GB/s per node, %.1f us per ring step [%s]; gradients summed in the "
                    "node, each GPU's slice between the nodes, then gathered in the node\n", nodes, net.name.c_str(),
                    net.description.c_str(), net.node_gbs, net.latency_us, net.source.c_str());

    // Compute time of one replica's step at `rows` on the target.
    double seconds_per_sample = 0, efficiency = 0;
    uint64_t launches = 0;
    std::string compute_source;
    if (!o.profile.empty()) {
        seconds_per_sample = profile_seconds_per_sample(o.profile);
        compute_source = "measured on the target (" + o.profile + "), scaled by the batch";
    } else {
        const LocalStep here = measure_local(base, shape, classes, per_replica_weak);
        efficiency = std::min(1.0, flops_per_sample * per_replica_weak / here.seconds / here.gemm_flops);
        launches = here.launches;
        compute_source = "measured here on " + here.device + " (" + fmt("%.2f", here.seconds * 1e3) + " ms per step at " +
                         std::to_string(per_replica_weak) + " samples, " + fmt("%.0f", 100 * efficiency) +
                         "% of its GEMM ceiling of " + fmt("%.1f", here.gemm_flops / 1e9) + " GFLOP/s), scaled to " +
                         gpu.name + "'s peak at that efficiency, plus " + std::to_string(launches) + " kernel launches x " +
                         fmt("%.1f", o.launch_us) + " us";
    }
    auto compute_s = [&](int rows) {
        if (seconds_per_sample > 0) return seconds_per_sample * rows;
        return flops_per_sample * rows / (efficiency * peak) + double(launches) * o.launch_us * 1e-6;
    };
    std::printf("  compute: %s\n", compute_source.c_str());
    std::printf("  all-reduce: %.2f MB of gradients per step (%s) in %zu bucket(s)%s\n\n", comm.wire_bytes / 1e6,
                dtype_name(strategy.allreduce_dtype), comm.buckets.size(),
                comm.blocking_allreduces ? (", plus " + std::to_string(comm.blocking_allreduces) +
                                            " small blocking ones (synchronised batchnorm)").c_str() : "");

    const double capacity = gpu.memory_gib * 1e9 - kContextReserve;
    std::printf("%7s %9s %10s %5s %10s %12s %10s %10s %10s %12s %8s %6s\n", nodes > 1 ? "nodesxN" : "GPUs", "batch/GPU", "memory", "fits",
                "max batch", "ZeRO-1 saves", "compute ms", "allred. ms", "exposed ms", "samples/s", "speedup", "eff.");
    json rows = json::array();
    double first_sps = 0;
    int first_n = 0, stops_at = 0;
    std::vector<std::string> notes;
    for (int n : counts) {
        const int total = n * nodes;
        const int rows_n = o.mode == "weak" ? per_replica_weak : global / total;
        const MemoryPlan mem = gpu_memory_plan(model, base.optimizer, strategy, n, rows_n, base.train.grad_accumulation_steps);
        const bool fits = double(mem.total()) <= capacity;
        const int largest = largest_fitting_rows(model, base.optimizer, strategy, n, base.train.grad_accumulation_steps,
                                                 uint64_t(std::max(0.0, capacity)));
        const double zero1 = double(mem.optimizer) * (total - 1) / total;
        const StepPrediction p = predict_step(Topology{n, nodes, lm, netm}, compute_s(rows_n), comm);
        const double sps = total * rows_n / p.step_s;
        if (first_n == 0) {  // the baseline: the smallest count on one node, so that the nodes' cost shows
            first_n = counts.front();
            const int rows_1 = o.mode == "weak" ? per_replica_weak : global / first_n;
            first_sps = first_n * rows_1 / predict_step(Topology{first_n, 1, lm, netm}, compute_s(rows_1), comm).step_s;
        }
        const double speedup = sps / first_sps, eff = speedup / (double(total) / first_n);
        if (stops_at == 0 && eff < kStopPaying) stops_at = total;
        const std::string label = nodes > 1 ? std::to_string(nodes) + "x" + std::to_string(n) : std::to_string(n);
        std::printf("%7s %9d %10s %5s %10d %12s %10.3f %10.3f %10.3f %12.0f %7.2fx %5.0f%%\n", label.c_str(), rows_n,
                    format_bytes(mem.total()).c_str(), fits ? "yes" : "NO", largest, format_bytes(uint64_t(zero1)).c_str(),
                    p.compute_s * 1e3, p.allreduce_s * 1e3, p.exposed_s * 1e3, sps, speedup, 100 * eff);
        if (!fits)
            notes.push_back(label + " GPUs: " + format_bytes(mem.total()) + " per GPU (" + mem.describe() +
                            ") does not fit in " + fmt("%.0f", gpu.memory_gib) + " GB less 1 GiB for the CUDA context; " +
                            (largest > 0 ? "the largest per-GPU batch that fits is " + std::to_string(largest)
                                         : std::string("not even one sample fits")) +
                            "; sharding the optimizer state (ZeRO-1) would save " + format_bytes(uint64_t(zero1)));
        rows.push_back({{"gpus", total},
                        {"nodes", nodes},
                        {"gpus_per_node", n},
                        {"per_gpu_batch", rows_n},
                        {"memory_bytes", mem.total()},
                        {"memory", {{"parameters", mem.params}, {"gradients", mem.grads}, {"optimizer", mem.optimizer},
                                    {"activations", mem.activations}, {"inputs", mem.inputs},
                                    {"weight_copy", mem.weight_copy}, {"wire", mem.wire}, {"workspace", mem.workspace}}},
                        {"fits", fits},
                        {"largest_per_gpu_batch", largest},
                        {"zero1_saving_bytes", zero1},
                        {"compute_ms", p.compute_s * 1e3},
                        {"allreduce_ms", p.allreduce_s * 1e3},
                        {"exposed_ms", p.exposed_s * 1e3},
                        {"step_ms", p.step_s * 1e3},
                        {"samples_per_sec", sps},
                        {"speedup", speedup},
                        {"efficiency", eff}});
    }
    std::printf("\n");
    for (const auto& n : notes) std::printf("%s\n", n.c_str());
    if (stops_at)
        std::printf("adding GPUs stops paying at %d: per-GPU efficiency falls below %.0f%% (the all-reduce is no longer "
                    "hidden behind backward)\n", stops_at, 100 * kStopPaying);
    else
        std::printf("every count keeps per-GPU efficiency above %.0f%%: more GPUs keep paying up to %d\n",
                    100 * kStopPaying, counts.back() * nodes);
    std::printf("(a model, not a measurement: docs/SCALING.md gives the formulas and how they compare with `scale`)\n");
    write_json(o.json_path, {{"benchmark", "plan"},
                             {"config", o.config},
                             {"gpu", {{"name", gpu.name}, {"memory_gb", gpu.memory_gib}, {"tflops", peak / 1e12}}},
                             {"link", {{"name", link.name}, {"bus_gbs", link.bus_gbs}, {"latency_us", link.latency_us}}},
                             {"nodes", nodes},
                             {"network", nodes > 1 ? json{{"name", net.name}, {"node_gbs", net.node_gbs},
                                                          {"latency_us", net.latency_us}}
                                                   : json(nullptr)},
                             {"mode", o.mode},
                             {"compute", compute_source},
                             {"stops_paying_at", stops_at ? json(stops_at) : json(nullptr)},
                             {"results", rows}});
    return kExitOk;
}

}  // namespace mirrored
