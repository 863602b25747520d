// `mirrored plan CONFIG --gpus 2,4,8 --gpu h200 --link nvlink4`: does the model fit, how long a
// step takes and what more GPUs buy, for GPUs not at hand (mirrored/planner.h is the model).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <thread>
#include <nlohmann/json.hpp>

#include "base/io.h"
#include "base/error.h"
#include "mirrored/adaptation.h"
#include "mirrored/config.h"
#include "mirrored/cross_device_ops.h"
#include "mirrored/strategy.h"
#include "mirrored/tools/hardware.h"
#include "mirrored/tools/plan_measure.h"
#include "mirrored/planner.h"
#include "mirrored/tools/tools.h"
#include "mirrored/session.h"
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

// A span of time at any scale: "0.42 s", "37 s" up to a minute, then duration_str's "3m07s", "2h05m".
std::string seconds_str(double s) { return s < 60 ? fmt("%.3g s", s) : duration_str(s); }

// What the plan needs of the training set, read at most once: the model's input shape (the
// config's, else the data's) and, when `count` (--price over epochs), its samples; and, where the
// data can be read here, what one loader thread reads of it per second.
// A profile measured on the target GPU, read whole (at most 64 MiB: a results file is kilobytes).
double read_profile(const std::string& path) {
    std::string text;
    try {
        text = read_regular_file(path, uint64_t(64) << 20);
    } catch (const InputError& e) {
        throw ConfigError(std::string("--profile: cannot read ") + e.what());
    }
    return profile_seconds_per_sample(text, path);
}

// The hardware the plan is for: the named GPU, link and network, with any figure overridden.
struct Target {
    GpuSpec gpu;
    LinkSpec link;
    NetworkSpec net;
    double peak = 0;  // dense FLOP/s at the run's precision
};

void check_options(const PlanOptions& o) {
    if (o.mode != "weak" && o.mode != "strong")
        throw ConfigError("--mode: expected weak or strong, got '" + o.mode + "'");
    if (o.gpus.empty()) throw ConfigError("--gpus: expected GPU counts such as 2,4,8");
    for (int n : o.gpus)
        if (n < 1 || n > 1024) throw ConfigError("--gpus: expected counts from 1 to 1024, got " + std::to_string(n));
    if (o.nodes < 1 || o.nodes > 4096) throw ConfigError("--nodes: expected 1 to 4096, got " + std::to_string(o.nodes));
    for (double v : {o.memory_gb, o.tflops, o.bus_gbs, o.latency_us, o.launch_us, o.network_gbs, o.network_latency_us})
        if (!(v >= 0) || !std::isfinite(v)) throw ConfigError("plan: figures must be finite and >= 0");
}

Target find_target(const PlanOptions& o) {
    Target t{find_gpu(o.gpu.empty() ? "h100" : o.gpu), {}, find_network(o.network), 0};
    t.link = find_link(o.link.empty() ? t.gpu.link : o.link);
    if (o.memory_gb > 0) t.gpu.memory_gib = o.memory_gb;
    if (o.bus_gbs > 0) t.link.bus_gbs = o.bus_gbs;
    if (o.latency_us > 0) t.link.latency_us = o.latency_us;
    if (o.network_gbs > 0) t.net.node_gbs = o.network_gbs;
    if (o.network_latency_us > 0) t.net.latency_us = o.network_latency_us;
    return t;
}

void print_header(const PlanOptions& o, const Config& base, const Model& model, const Target& t) {
    const Precision precision = base.train.precision;
    std::printf("plan %s: %s\n", o.config.c_str(), model_config_summary(base).c_str());
    const std::string frozen =
        model.frozen_count() ? " trained (and " + std::to_string(model.frozen_count()) + " frozen)" : "";
    std::printf("  %zu parameters%s, %.1f MFLOP per sample (forward and backward), %s\n", model.param_count(),
                frozen.c_str(), model.train_flops_per_sample() / 1e6, precision_name(precision));
    std::printf("  GPU %s%s: %s, %.0f GB, %.1f dense TFLOP/s %s%s [%s]\n", t.gpu.name.c_str(),
                o.gpu.empty() ? " (the default: --gpu names yours)" : "", t.gpu.description.c_str(), t.gpu.memory_gib,
                t.peak / 1e12, precision_name(precision), o.tflops > 0 ? " (--tflops)" : "", t.gpu.source.c_str());
    std::printf("  link %s: %s; bus bandwidth %.1f GB/s, %.1f us per ring step [%s]\n", t.link.name.c_str(),
                t.link.description.c_str(), t.link.bus_gbs, t.link.latency_us, t.link.source.c_str());
    if (o.nodes > 1)
        std::printf(
            "  %d nodes over %s: %s; %.1f GB/s per node, %.1f us per ring step [%s]; gradients summed in the "
            "node, each GPU's slice between the nodes, then gathered in the node\n",
            o.nodes, t.net.name.c_str(), t.net.description.c_str(), t.net.node_gbs, t.net.latency_us,
            t.net.source.c_str());
}

// The compute time of one replica's step on the target: from a profile measured there, else
// measured here and scaled to the target's peak at the same efficiency, plus its launches.
struct ComputeModel {
    double seconds_per_sample = 0;  // from a profile
    double efficiency = 0, flops_per_sample = 0, peak = 0, launch_s = 0;
    uint64_t launches = 0;
    std::string source;

    double seconds(int rows) const {
        if (seconds_per_sample > 0) return seconds_per_sample * rows;
        return flops_per_sample * rows / (efficiency * peak) + double(launches) * launch_s;
    }
};

ComputeModel compute_model(const PlanOptions& o, const Config& base, const Model& model, const std::vector<int>& shape,
                           const Target& t, int rows) {
    ComputeModel m;
    if (!o.profile.empty()) {
        m.seconds_per_sample = read_profile(o.profile);
        m.source = "measured on the target (" + o.profile + "), scaled by the batch";
        return m;
    }
    // the model's own efficiency, without recomputed blocks (plan_row adds their FLOPs)
    Config plain = base;
    plain.train.recompute_blocks = false;
    const LocalShape at =
        local_shape(model, rows, base.train.grad_accumulation_steps, cuda_device_count() > 0, kMeasureFlops);
    const LocalStep here = measure_local(plain, shape, model.output_classes(), at);
    m.flops_per_sample = model.train_flops_per_sample();
    m.efficiency = std::min(1.0, m.flops_per_sample * at.rows / here.seconds / here.gemm_flops);
    m.peak = t.peak;
    m.launches = here.launches;
    m.launch_s = o.launch_us * 1e-6;
    m.source = "measured here on " + here.device + " (" + fmt("%.2f", here.seconds * 1e3) + " ms per step at " +
               (at.rows < rows ? std::to_string(at.rows) + " of the planned " : std::string()) + std::to_string(rows) +
               " samples, " + fmt("%.0f", 100 * m.efficiency) + "% of its GEMM ceiling of " +
               fmt("%.1f", here.gemm_flops / 1e9) + " GFLOP/s), scaled to " + t.gpu.name +
               "'s peak at that efficiency, plus " + std::to_string(m.launches) + " kernel launches x " +
               fmt("%.1f", o.launch_us) + " us";
    return m;
}

// One row of the table: n GPUs per node at rows samples each.
struct PlanRow {
    std::string label;
    int rows = 0, largest = 0;
    MemoryPlan mem;
    bool fits = false;
    double zero1 = 0;                 // bytes per GPU strategy.shard optimizer would save (0: taken, or not possible)
    bool zero1_fits = false;          // and the run would fit with it
    StepPrediction step, zero1_step;  // the step as configured, and with the optimizer state sharded
    double zero2 = 0;                 // the same for strategy.shard gradients
    bool zero2_fits = false;
    StepPrediction zero2_step;
    // What train.recompute: blocks would save (0: taken, or no blocks), whether the run would fit
    // with it (and with the optimizer state or the gradients sharded too), and its step
    double recompute = 0;
    bool recompute_fits = false, recompute_zero1_fits = false, recompute_zero2_fits = false;
    StepPrediction recompute_step;
    std::string recommendation;
    double samples_per_sec = 0, speedup = 0, efficiency = 0;

    json to_json(int n, int nodes) const {
        return {{"gpus", n * nodes},
                {"nodes", nodes},
                {"gpus_per_node", n},
                {"per_gpu_batch", rows},
                {"memory_bytes", mem.total()},
                {"memory",
                 {{"parameters", mem.params},
                  {"gradients", mem.grads},
                  {"optimizer", mem.optimizer},
                  {"activations", mem.activations},
                  {"inputs", mem.inputs},
                  {"weight_copy", mem.weight_copy},
                  {"wire", mem.wire},
                  {"workspace", mem.workspace}}},
                {"fits", fits},
                {"largest_per_gpu_batch", largest},
                {"zero1_saving_bytes", zero1},
                {"zero1_step_ms", zero1 > 0 ? json(zero1_step.step_s * 1e3) : json(nullptr)},
                {"zero2_saving_bytes", zero2},
                {"zero2_step_ms", zero2 > 0 ? json(zero2_step.step_s * 1e3) : json(nullptr)},
                {"recompute_saving_bytes", recompute},
                {"recompute_step_ms", recompute > 0 ? json(recompute_step.step_s * 1e3) : json(nullptr)},
                {"recommendation", recommendation},
                {"compute_ms", step.compute_s * 1e3},
                {"allreduce_ms", step.allreduce_s * 1e3},
                {"exposed_ms", step.exposed_s * 1e3},
                {"step_ms", step.step_s * 1e3},
                {"samples_per_sec", samples_per_sec},
                {"speedup", speedup},
                {"efficiency", efficiency}};
    }
    std::string does_not_fit(double memory_gib) const {
        return label + " GPUs: " + format_bytes(mem.total()) + " per GPU (" + mem.describe() + ") does not fit in " +
               fmt("%.0f", memory_gib) + " GB less 1 GiB for the CUDA context; " +
               (largest > 0 ? "the largest per-GPU batch that fits is " + std::to_string(largest)
                            : std::string("not even one sample fits")) +
               (zero1 > 0 ? "; strategy.shard: optimizer (ZeRO-1) would save " + format_bytes(uint64_t(zero1)) +
                                (zero1_fits ? " per GPU: enough to fit" : ": not enough to fit")
                          : std::string()) +
               (zero2 > 0 ? "; strategy.shard: gradients (ZeRO-2) would save " + format_bytes(uint64_t(zero2)) +
                                (zero2_fits ? " per GPU: enough to fit" : ": not enough to fit")
                          : std::string()) +
               (recompute > 0 ? "; train.recompute: blocks would save " + format_bytes(uint64_t(recompute)) +
                                    (recompute_fits ? " per GPU: enough to fit" : " per GPU")
                              : std::string()) +
               ". Recommended: " + recommendation;
    }
    void print() const {
        std::printf("%7s %9d %10s %5s %10d %12s %10.3f %10.3f %10.3f %12.0f %7.2fx %5.0f%%\n", label.c_str(), rows,
                    format_bytes(mem.total()).c_str(), fits ? "yes" : "NO", largest,
                    format_bytes(uint64_t(zero1)).c_str(), step.compute_s * 1e3, step.allreduce_s * 1e3,
                    step.exposed_s * 1e3, samples_per_sec, speedup, 100 * efficiency);
    }
};

// The GPU counts asked for (sorted, once each) and the batch per GPU at each.
struct Batches {
    std::vector<int> counts;
    bool weak = true;
    int global = 0, per_replica_weak = 0;
    int rows(int gpus) const { return weak ? per_replica_weak : global / gpus; }
};

Batches plan_batches(const PlanOptions& o, const Config& base) {
    Batches b;
    b.counts = o.gpus;
    std::sort(b.counts.begin(), b.counts.end());
    b.counts.erase(std::unique(b.counts.begin(), b.counts.end()), b.counts.end());
    b.weak = o.mode == "weak";
    b.global = base.train.global_batch_size;
    b.per_replica_weak = o.per_replica_batch > 0 ? o.per_replica_batch : std::max(1, b.global / b.counts.front());
    if (!b.weak)
        for (int n : b.counts)
            if (b.global % (n * o.nodes) != 0)
                throw ConfigError("train.global_batch_size " + std::to_string(b.global) + " does not divide into " +
                                  std::to_string(n * o.nodes) + " GPUs (strong scaling keeps it)");
    return b;
}

// What every row of the table is predicted from.
struct PlanInputs {
    const Config& base;
    const Model& model;
    const Model* recomputed;  // the model with train.recompute: blocks, where that would save memory
    const Model& staged;      // the model as shard: gradients builds it (gradient_piece_floats)
    const StrategyConfig& strategy;
    const CommPlan& comm;
    const CommPlan& staged_comm;  // the staged model's buckets
    const ComputeModel& compute;
    LinkModel link, network;
    double capacity = 0;  // bytes a GPU has for the run
    int nodes = 1;
};

// A step's compute with recomputed blocks against without: each block's forward runs twice.
double recompute_factor(const Model& m) {
    const double f = m.train_flops_per_sample();
    return f > 0 ? 1 + m.recomputed_flops_per_sample() / f : 1;
}

PlanRow plan_row(const PlanInputs& in, const Batches& batches, int n, double baseline_sps, int baseline_gpus) {
    const int total = n * in.nodes, accumulation = in.base.train.grad_accumulation_steps;
    PlanRow r;
    r.label = in.nodes > 1 ? std::to_string(in.nodes) + "x" + std::to_string(n) : std::to_string(n);
    r.rows = batches.rows(total);
    r.mem = gpu_memory_plan(in.model, in.base.optimizer, in.strategy, n, r.rows, accumulation);
    r.fits = double(r.mem.total()) <= in.capacity;
    r.largest = largest_fitting_rows(in.model, in.base.optimizer, in.strategy, n, accumulation,
                                     uint64_t(std::max(0.0, in.capacity)));
    // What sharding the optimizer state, or the gradients too, would save (each node's replicas
    // share them out), where the run does not already
    using Shard = StrategyConfig::Shard;
    const auto saving = [&](Shard mode) {
        if (in.strategy.shard >= mode || n < 2) return 0.0;
        StrategyConfig sharded = in.strategy;
        sharded.shard = mode;
        const Model& m = mode == Shard::gradients ? in.staged : in.model;
        const double need = double(gpu_memory_plan(m, in.base.optimizer, sharded, n, r.rows, accumulation).total());
        return std::max(0.0, double(r.mem.total()) - need);  // staging slots can outweigh a small model's gradients
    };
    r.zero1 = saving(Shard::optimizer);
    r.zero1_fits = r.zero1 > 0 && double(r.mem.total()) - r.zero1 <= in.capacity;
    r.zero2 = saving(Shard::gradients);
    r.zero2_fits = r.zero2 > 0 && double(r.mem.total()) - r.zero2 <= in.capacity;
    const Topology topo{n, in.nodes, in.link, in.network};
    const bool sharded = in.strategy.shard != Shard::none;
    // staged gradients are reduce-scattered in every micro-batch
    const auto scatters = [&](Shard mode) { return mode == Shard::gradients && n > 1 ? accumulation : 1; };
    // a profile measured the run as configured, recomputation included
    const double compute_s =
        in.compute.seconds(r.rows) * (in.compute.seconds_per_sample > 0 ? 1 : recompute_factor(in.model));
    r.step = predict_step(topo, compute_s, in.comm, sharded && total > 1, scatters(in.strategy.shard));
    if (r.zero1 > 0) r.zero1_step = predict_step(topo, compute_s, in.comm, true);
    if (r.zero2 > 0) r.zero2_step = predict_step(topo, compute_s, in.staged_comm, true, accumulation);
    if (in.recomputed) {
        const MemoryPlan m = gpu_memory_plan(*in.recomputed, in.base.optimizer, in.strategy, n, r.rows, accumulation);
        r.recompute = double(r.mem.total()) - double(m.total());
        r.recompute_fits = double(m.total()) <= in.capacity;
        r.recompute_zero1_fits = r.zero1 > 0 && double(m.total()) - r.zero1 <= in.capacity;
        r.recompute_zero2_fits = r.zero2 > 0 && double(m.total()) - r.zero2 <= in.capacity;
        // priced as the recommendation would run it: as configured, or with the sharding it adds
        const Shard with = r.recompute_fits || r.fits ? in.strategy.shard
                           : r.recompute_zero1_fits   ? std::max(in.strategy.shard, Shard::optimizer)
                           : r.recompute_zero2_fits   ? Shard::gradients
                                                      : in.strategy.shard;
        r.recompute_step = predict_step(topo, compute_s * recompute_factor(*in.recomputed),
                                        with == Shard::gradients ? in.staged_comm : in.comm,
                                        with != Shard::none && total > 1, scatters(with));
    }
    // What a user with this model and these GPUs should run: the first that fits of replicating,
    // sharding the optimizer state, the gradients too, recomputing blocks (with either sharded
    // too), or a smaller batch; what mirrored does not have is named.
    const auto recompute_cost = [&] {
        return "; each block's forward runs again in backward: " + fmt("%.2f", r.recompute_step.step_s * 1e3) +
               " ms per step instead of " + fmt("%.2f", r.step.step_s * 1e3) + ")";
    };
    const std::string splitting_op =
        shard_refusal(in.strategy.cross_device_ops).empty() ? "" : " with cross_device_ops: ring";
    const auto shard_cost = [&](const char* mode, double saving, const StepPrediction& s) {
        return std::string("strategy.shard: ") + mode + splitting_op + " (" +
               format_bytes(r.mem.total() - uint64_t(saving)) + " per GPU; its communication adds " +
               fmt("%.2f", (s.step_s - r.step.step_s) * 1e3) + " ms per step)";
    };
    if (r.fits)
        r.recommendation = sharded ? std::string("strategy.shard: ") + shard_name(in.strategy.shard) + ", as configured"
                                   : "replicate (strategy.shard: none)";
    else if (r.zero1_fits) r.recommendation = shard_cost("optimizer", r.zero1, r.zero1_step);
    else if (r.zero2_fits) r.recommendation = shard_cost("gradients", r.zero2, r.zero2_step);
    else if (r.recompute_fits)
        r.recommendation = "train.recompute: blocks (" + format_bytes(r.mem.total() - uint64_t(r.recompute)) +
                           " per GPU" + recompute_cost();
    else if (r.recompute_zero1_fits || r.recompute_zero2_fits)
        r.recommendation =
            std::string("train.recompute: blocks with strategy.shard: ") +
            (r.recompute_zero1_fits ? "optimizer" : "gradients") + " (" +
            format_bytes(r.mem.total() - uint64_t(r.recompute) - uint64_t(r.recompute_zero1_fits ? r.zero1 : r.zero2)) +
            " per GPU" + recompute_cost();
    else
        r.recommendation =
            (r.largest > 0 ? "a per-GPU batch of at most " + std::to_string(r.largest) + ", or " : std::string()) +
            "sharded parameters (FSDP) or tensor parallelism (not in mirrored yet), or GPUs with more memory";
    r.samples_per_sec = total * r.rows / r.step.step_s;
    r.speedup = r.samples_per_sec / baseline_sps;
    r.efficiency = r.speedup / (double(total) / baseline_gpus);
    return r;
}

// The run's cost on each count (--price): its steps at the predicted step time, checkpoints every
// checkpoint.every_minutes / every_steps, failures at --mtbf per GPU; the cheapest and the fastest.
json print_costs(const PlanOptions& o, const Config& base, const Batches& batches, const std::vector<PlanRow>& rows,
                 size_t samples) {
    std::printf(
        "\ncost of the run at $%.2f per GPU hour (%s)%s:\n", o.price,
        base.train.steps > 0
            ? (std::to_string(base.train.steps) + " steps").c_str()
            : (std::to_string(samples) + " training samples, " + std::to_string(base.train.epochs) + " epochs").c_str(),
        o.mtbf_hours > 0 ? fmt(", a GPU failing every %.0f h", o.mtbf_hours).c_str() : ", no failures");
    std::printf("%7s %8s %10s %11s %10s %11s %11s %9s %11s %11s\n", "GPUs", "steps", "wall time", "GPU hours", "cost $",
                "comm wait $", "checkpts $", "failures", "rework $", "Young/Daly");
    json out = json::array();
    int cheapest = -1, fastest = -1;
    std::vector<CostEstimate> est;
    for (size_t i = 0; i < rows.size(); ++i) {
        const PlanRow& r = rows[i];
        const int gpus = batches.counts[i] * o.nodes;
        const double global = double(batches.weak ? r.rows * gpus : batches.global);
        const double steps = base.train.steps > 0 ? double(base.train.steps)
                                                  : double(base.train.epochs) * std::ceil(double(samples) / global);
        CostInputs in;
        in.work_s = steps * r.step.step_s;
        in.exposed_comm_share = r.step.step_s > 0 ? r.step.exposed_s / r.step.step_s : 0;
        in.gpus = gpus;
        in.price_per_gpu_hour = o.price;
        in.job_mtbf_s = o.mtbf_hours * 3600 / gpus;
        double interval = base.checkpoint.every_minutes > 0 ? base.checkpoint.every_minutes * 60 : 0;
        if (base.checkpoint.every_steps > 0) {
            const double by_steps = double(base.checkpoint.every_steps) * r.step.step_s;
            interval = interval > 0 ? std::min(interval, by_steps) : by_steps;
        }
        in.checkpoint_interval_s = interval;
        in.checkpoint_write_s =
            o.checkpoint_write_s > 0 ? o.checkpoint_write_s : double(r.mem.params + r.mem.optimizer) / 1e9;
        in.restart_s = o.restart_s;
        const CostEstimate e = estimate_cost(in);
        est.push_back(e);
        if (e.finishes && (cheapest < 0 || e.cost < est[size_t(cheapest)].cost)) cheapest = int(i);
        if (e.finishes && (fastest < 0 || e.wall_s < est[size_t(fastest)].wall_s)) fastest = int(i);
        std::printf("%7s %8.0f %10s %11.4g %10.4g %11.4g %11.4g %9.3g %11.4g %11s\n", r.label.c_str(), steps,
                    e.finishes ? seconds_str(e.wall_s).c_str() : "never", e.gpu_hours, e.cost, e.comm_cost,
                    e.checkpoint_cost, e.expected_failures, e.rework_cost,
                    e.young_daly_s > 0 ? seconds_str(e.young_daly_s).c_str() : "-");
        out.push_back({{"gpus", gpus},
                       {"steps", steps},
                       {"wall_hours", e.finishes ? json(e.wall_s / 3600) : json(nullptr)},
                       {"gpu_hours", e.gpu_hours},
                       {"cost_usd", e.cost},
                       {"comm_wait_usd", e.comm_cost},
                       {"checkpoint_usd", e.checkpoint_cost},
                       {"rework_usd", e.rework_cost},
                       {"expected_failures", e.expected_failures},
                       {"checkpoint_interval_s", interval},
                       {"checkpoint_write_s", in.checkpoint_write_s},
                       {"young_daly_interval_s", e.young_daly_s > 0 ? json(e.young_daly_s) : json(nullptr)}});
    }
    std::printf("  checkpoints every %s (checkpoint.every_minutes %g, every_steps %lld)%s; a restart %.0f s\n",
                est.empty() || out[0]["checkpoint_interval_s"].get<double>() <= 0
                    ? "never"
                    : seconds_str(out[0]["checkpoint_interval_s"].get<double>()).c_str(),
                base.checkpoint.every_minutes, static_cast<long long>(base.checkpoint.every_steps),
                o.checkpoint_write_s > 0 ? "" : ", each write its bytes at 1 GB/s (--checkpoint-write-s)", o.restart_s);
    if (cheapest < 0) {
        std::printf("no count finishes: failures come faster than a checkpoint interval's work\n");
    } else if (cheapest == fastest) {
        std::printf("cheapest and fastest: %s GPUs ($%.4g, %s)\n", rows[size_t(cheapest)].label.c_str(),
                    est[size_t(cheapest)].cost, seconds_str(est[size_t(cheapest)].wall_s).c_str());
    } else {
        std::printf("cheapest: %s GPUs ($%.4g, %s); fastest: %s GPUs ($%.4g, %s): %.0f%% dearer, %.0f%% sooner\n",
                    rows[size_t(cheapest)].label.c_str(), est[size_t(cheapest)].cost,
                    seconds_str(est[size_t(cheapest)].wall_s).c_str(), rows[size_t(fastest)].label.c_str(),
                    est[size_t(fastest)].cost, seconds_str(est[size_t(fastest)].wall_s).c_str(),
                    100 * (est[size_t(fastest)].cost / est[size_t(cheapest)].cost - 1),
                    100 * (1 - est[size_t(fastest)].wall_s / est[size_t(cheapest)].wall_s));
    }
    return out;
}

// The loader threads each GPU count needs to be fed: its samples/s over one thread's.
json print_loader_threads(const TrainSet& data, const std::vector<int>& counts, const std::vector<PlanRow>& rows,
                          int nodes) {
    if (data.samples_per_thread <= 0) {
        std::printf("loader threads: not measured (the training data cannot be read here: %s)\n", data.why_not.c_str());
        return nullptr;
    }
    std::printf("loader threads to feed them (one thread reads %s samples/s of %s, measured here):",
                fmt("%.0f", data.samples_per_thread).c_str(), data.name.c_str());
    json needed = json::object();
    for (size_t i = 0; i < counts.size() && i < rows.size(); ++i) {
        // per node: each node's loader feeds its own GPUs
        const int threads = int(std::ceil(rows[i].samples_per_sec / nodes / data.samples_per_thread - 1e-9));
        std::printf("%s %d GPU%s: %d", i ? "," : "", counts[i] * nodes, counts[i] * nodes > 1 ? "s" : "", threads);
        needed[std::to_string(counts[i] * nodes)] = threads;
    }
    std::printf(" (data.loader_threads%s; this machine has %u hardware threads)\n", nodes > 1 ? ", per node" : "",
                std::thread::hardware_concurrency());
    return {{"samples_per_sec_per_thread", data.samples_per_thread}, {"data", data.name}, {"threads_needed", needed}};
}

void print_verdict(const std::vector<std::string>& notes, int stops_at, int most_gpus) {
    std::printf("\n");
    for (const auto& n : notes) std::printf("%s\n", n.c_str());
    if (stops_at)
        std::printf(
            "adding GPUs stops paying at %d: per-GPU efficiency falls below %.0f%% (the all-reduce is no longer "
            "hidden behind backward)\n",
            stops_at, 100 * kStopPaying);
    else
        std::printf("every count keeps per-GPU efficiency above %.0f%%: more GPUs keep paying up to %d\n",
                    100 * kStopPaying, most_gpus);
    std::printf("(a model, not a measurement: docs/SCALING.md gives the formulas and how they compare with `scale`)\n");
}

json plan_json(const PlanOptions& o, const Target& target, const ComputeModel& compute, int stops_at, json rows) {
    return {{"benchmark", "plan"},
            {"config", o.config},
            {"gpu", {{"name", target.gpu.name}, {"memory_gb", target.gpu.memory_gib}, {"tflops", target.peak / 1e12}}},
            {"link",
             {{"name", target.link.name}, {"bus_gbs", target.link.bus_gbs}, {"latency_us", target.link.latency_us}}},
            {"nodes", o.nodes},
            {"network", o.nodes > 1 ? json{{"name", target.net.name},
                                           {"node_gbs", target.net.node_gbs},
                                           {"latency_us", target.net.latency_us}}
                                    : json(nullptr)},
            {"mode", o.mode},
            {"compute", compute.source},
            {"stops_paying_at", stops_at ? json(stops_at) : json(nullptr)},
            {"results", std::move(rows)}};
}

}  // namespace

int plan(const PlanOptions& o) {
    check_options(o);
    Target target = find_target(o);
    const Config base = load_config(o.config, o.sets);
    target.peak = (o.tflops > 0 ? o.tflops : target.gpu.tflops(base.train.precision)) * 1e12;
    const Batches batches = plan_batches(o, base);
    const TrainSet data = train_set(base, o.price > 0 && base.train.steps == 0);
    const std::vector<int>& shape = data.shape;
    StrategyConfig strategy = base.strategy;
    strategy.precision = base.train.precision;
    // GPUs of their own, several: as a run of each mode lays the model out (model_for)
    const size_t pieces = gradient_piece_floats(strategy, 2, false);
    const auto built = build_model(base, shape, base.train.recompute_blocks, pieces);
    const Model& model = *built;
    StrategyConfig staging = strategy;
    staging.shard = StrategyConfig::Shard::gradients;
    std::unique_ptr<Model> keep;
    const Model& staged = model_for(model, staging, 2, false, keep);
    const CommPlan comm = comm_plan(model, strategy), staged_comm = comm_plan(staged, staging);
    const auto recomputed_model = build_model(base, shape, true, pieces);
    const Model& recomputed = *recomputed_model;
    const bool recompute_saves = !base.train.recompute_blocks && recomputed.recomputed_flops_per_sample() > 0;

    print_header(o, base, model, target);
    const ComputeModel compute = compute_model(o, base, model, shape, target, batches.per_replica_weak);
    std::printf("  compute: %s\n", compute.source.c_str());
    std::printf("  all-reduce: %.2f MB of gradients per step (%s) in %zu bucket(s)%s\n\n", comm.wire_bytes / 1e6,
                dtype_name(strategy.allreduce_dtype), comm.buckets.size(),
                comm.blocking_allreduces ? (", plus " + std::to_string(comm.blocking_allreduces) +
                                            " small blocking ones (synchronised batchnorm)")
                                               .c_str()
                                         : "");
    const PlanInputs in{base,
                        model,
                        recompute_saves ? &recomputed : nullptr,
                        staged,
                        strategy,
                        comm,
                        staged_comm,
                        compute,
                        LinkModel{target.link.bus_gbs * 1e9, target.link.latency_us * 1e-6},
                        LinkModel{target.net.node_gbs * 1e9, target.net.latency_us * 1e-6},
                        target.gpu.memory_gib * 1e9 - kContextReserve,
                        o.nodes};

    // The baseline: the smallest count on one node, so that the nodes' cost shows.
    const int first_n = batches.counts.front();
    const double first_sps =
        first_n * batches.rows(first_n) /
        predict_step(Topology{first_n, 1, in.link, in.network}, compute.seconds(batches.rows(first_n)), comm).step_s;
    std::printf("%7s %9s %10s %5s %10s %12s %10s %10s %10s %12s %8s %6s\n", o.nodes > 1 ? "nodesxN" : "GPUs",
                "batch/GPU", "memory", "fits", "max batch", "ZeRO-1 saves", "compute ms", "allred. ms", "exposed ms",
                "samples/s", "speedup", "eff.");
    json rows = json::array();
    int stops_at = 0;
    std::vector<std::string> notes;
    std::vector<PlanRow> planned;
    for (int n : batches.counts) {
        const PlanRow r = plan_row(in, batches, n, first_sps, first_n);
        if (stops_at == 0 && r.efficiency < kStopPaying) stops_at = n * o.nodes;
        r.print();
        if (!r.fits) notes.push_back(r.does_not_fit(target.gpu.memory_gib));
        rows.push_back(r.to_json(n, o.nodes));
        planned.push_back(r);
    }
    print_verdict(notes, stops_at, batches.counts.back() * o.nodes);
    const json loader = print_loader_threads(data, batches.counts, planned, o.nodes);
    json j = plan_json(o, target, compute, stops_at, std::move(rows));
    j["loader"] = loader;
    if (o.price > 0) j["costs"] = print_costs(o, base, batches, planned, data.samples);
    write_json(o.json, j);
    return kExitOk;
}

}  // namespace mirrored
