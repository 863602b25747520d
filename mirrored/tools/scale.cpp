// `mirrored scale CONFIG`: the same training step at 1, 2, 4, 8 replicas with the real loader and
// the real all-reduce; step time, speedup, efficiency, where the time goes, the all-reduce's bus
// bandwidth, the planner's prediction beside each measurement, a verdict, scaling.json and
// scaling.png.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "data/datasets.h"
#include "data/loader.h"
#include "kernels/blas.h"
#include "base/error.h"
#include "mirrored/adaptation.h"
#include "mirrored/config.h"
#include "mirrored/strategy.h"
#include "mirrored/planner.h"
#include "mirrored/tools/timed_steps.h"
#include "mirrored/tools/tools.h"
#include "mirrored/session.h"
#include "mirrored/util.h"
#include "mirrored/watchdog.h"

namespace mirrored {

using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

struct Kind {
    std::string name;   // cuda, cuda-shared, cpu, sim
    int available = 0;  // replicas it can provide
    std::string meaning;
};

Kind resolve_kind(const std::string& asked, int most) {
    const int gpus = cuda_device_count();
    const int cores = int(std::max(1u, std::thread::hardware_concurrency()));
    std::string k = asked;
    if (k.empty()) k = gpus == 0 ? "cpu" : gpus >= most ? "cuda" : "cuda-shared";
    if (k == "cuda") {
        if (gpus == 0)
            throw DeviceError("--kind cuda: no GPU is visible (" + cuda_unavailable_reason() + "; use --kind cpu)");
        return {k, gpus, "one replica per GPU: the speedup includes the links between them"};
    }
    if (k == "cuda-shared") {
        if (gpus == 0)
            throw DeviceError("--kind cuda-shared: no GPU is visible (" + cuda_unavailable_reason() +
                              "; use --kind cpu)");
        return {k, 8,
                "every replica on GPU 0: they divide one GPU's compute, so the speedup is not what more GPUs "
                "would give; the numbers show the all-reduce's and the host's overhead per replica"};
    }
    if (k == "cpu")
        return {k, cores,
                "CPU replicas share this machine's cores, memory bandwidth and caches; GPUs scale "
                "differently - `mirrored plan` predicts them"};
    if (k == "sim") return {k, 8, "simulated GPUs (CPU threads with CUDA's semantics): for testing, not for speed"};
    throw ConfigError("--kind: expected cuda, cuda-shared, cpu or sim, got '" + asked + "'");
}

std::string device_spec(const Kind& k, int n) {
    if (k.name == "cpu") return "cpu:" + std::to_string(n);
    std::string s = (k.name == "sim" ? "sim:" : "cuda:");
    for (int i = 0; i < n; ++i) s += (i ? "," : "") + std::to_string(k.name == "cuda" ? i : 0);
    return s;
}

struct Row {
    int replicas = 0, global_batch = 0;
    std::string devices;
    std::string ops;  // the cross-device ops the run used (what `auto` chose)
    double step_s = 0, step_min_s = 0, step_max_s = 0, samples_per_s = 0;
    double speedup = 0, efficiency = 0;
    TimeSplit split;
    double wire_bytes = 0, allreduce_s = 0, busbw = 0;
    bool predicted = false;
    StepPrediction prediction;
    double predicted_speedup = 0;

    void print() const;
    json to_json() const;
};

std::string format(const char* f, double v) {
    char s[64];
    std::snprintf(s, sizeof s, f, v);
    return s;
}

void Row::print() const {
    const double busy = std::max(split.data_wait_s + split.compute_s + split.comm_s, 1e-12);
    char range[64];
    std::snprintf(range, sizeof range, "%.2f [%.2f, %.2f]", step_s * 1e3, step_min_s * 1e3, step_max_s * 1e3);
    std::printf("%8d %8d %22s %11.0f %7.2fx %5.0f%% %6.1f %6.1f %6.1f %9.2f %8s %12s %9s\n", replicas, global_batch,
                range, samples_per_s, speedup, 100 * efficiency, 100 * split.data_wait_s / busy,
                100 * split.compute_s / busy, 100 * split.comm_s / busy, wire_bytes / 1e6,
                replicas > 1 ? format("%.2fG", busbw / 1e9).c_str() : "-",
                predicted ? format("%.2f", prediction.step_s * 1e3).c_str() : "-",
                predicted ? format("%.2fx", predicted_speedup).c_str() : "-");
}

json Row::to_json() const {
    json j = {
        {"replicas", replicas},
        {"devices", devices},
        {"global_batch", global_batch},
        {"per_replica_batch", global_batch / replicas},
        {"step_ms", step_s * 1e3},
        {"step_ms_min", step_min_s * 1e3},
        {"step_ms_max", step_max_s * 1e3},
        {"samples_per_sec", samples_per_s},
        {"speedup", speedup},
        {"efficiency", efficiency},
        {"time_split", {{"data_wait_s", split.data_wait_s}, {"compute_s", split.compute_s}, {"comm_s", split.comm_s}}},
        {"allreduce_bytes_per_step", wire_bytes},
        {"allreduce_ms", allreduce_s * 1e3},
        {"busbw_gbs", busbw / 1e9},
        {"cross_device_ops", ops}};
    if (predicted)
        j["predicted"] = {{"step_ms", prediction.step_s * 1e3},
                          {"compute_ms", prediction.compute_s * 1e3},
                          {"allreduce_ms", prediction.allreduce_s * 1e3},
                          {"exposed_ms", prediction.exposed_s * 1e3},
                          {"speedup", predicted_speedup}};
    return j;
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
}

// Warm-up, then `steps` in groups of five, each group timed to a device synchronisation.
Row measure(const Config& cfg, std::shared_ptr<const Datasets> data, int steps, int warmup, Watchdog* watchdog) {
    auto s = start_timed_session(cfg, std::move(data), watchdog);
    const TimedSteps t = time_steps(*s, warmup, steps, 5, watchdog);
    s->train_loader->stop();
    Row row;
    row.replicas = s->strategy->replicas();
    row.global_batch = cfg.train.global_batch_size;
    row.devices = cfg.strategy.devices;
    row.ops = s->strategy->cross_device_ops_name();
    row.step_s = median(t.step_s);
    row.step_min_s = *std::min_element(t.step_s.begin(), t.step_s.end());
    row.step_max_s = *std::max_element(t.step_s.begin(), t.step_s.end());
    row.samples_per_s = row.global_batch / row.step_s;
    row.split = t.split;
    return row;
}

std::string verdict(const Row& a, const Row& b) {
    const double busy = std::max(b.split.data_wait_s + b.split.compute_s + b.split.comm_s, 1e-12);
    const double comm = b.split.comm_s / busy, data = b.split.data_wait_s / busy;
    char s[320];
    std::snprintf(s, sizeof s, "%d -> %d replicas: %.2fx (%.0f%%), ", a.replicas, b.replicas, b.speedup / a.speedup,
                  100.0 * (b.speedup / a.speedup) / (double(b.replicas) / a.replicas));
    std::string out = s;
    if (data >= 0.10) {
        std::snprintf(s, sizeof s,
                      "input-bound: %.0f%% of the step waits for data (data.loader_threads, data.prefetch)",
                      100 * data);
    } else if (comm >= 0.25) {
        std::snprintf(s, sizeof s, "communication-bound: the all-reduce of %.1f MB takes %.0f%% of the step",
                      b.wire_bytes / 1e6, 100 * comm);
    } else {
        std::snprintf(s, sizeof s, "compute-bound (exposed communication %.0f%% of the step)", 100 * comm);
    }
    return out + s;
}

// The plot, by scripts/plot_scaling.py beside the binary's build folder (matplotlib).
void plot(const std::string& json_path, const std::string& png_path) {
    const int rc = run_project_script("plot_scaling.py", {json_path, png_path});
    if (rc == kScriptMissing) std::printf("no plot: scripts/plot_scaling.py not found beside the build folder\n");
    else if (rc == 0) std::printf("wrote %s\n", png_path.c_str());
    else if (rc == 3)
        std::printf(
            "no plot: python3-matplotlib is not installed (scripts/install_deps.sh installs it); "
            "the table and scaling.json are complete\n");
    else if (rc == kNoPython)
        std::printf("no plot: python3 is not installed; the table and scaling.json are complete\n");
    else std::printf("no plot: scripts/plot_scaling.py failed (exit %d)\n", rc);
}

// The replica counts asked for (1, 2, 4, 8 as far as the kind provides), checked, ascending.
std::vector<int> replica_counts(const ScaleOptions& o, const Kind& kind) {
    std::vector<int> counts = o.replicas;
    if (counts.empty())
        for (int n : {1, 2, 4, 8})
            if (n <= kind.available) counts.push_back(n);
    for (int n : counts) {
        if (n < 1) throw ConfigError("--replicas: expected positive counts, got " + std::to_string(n));
        if (n > kind.available)
            throw ConfigError("--replicas " + std::to_string(n) + ": --kind " + kind.name + " provides at most " +
                              std::to_string(kind.available) +
                              (kind.name == "cpu"    ? " on this machine (one replica per core)"
                               : kind.name == "cuda" ? " (one per GPU; --kind cuda-shared puts them all on GPU 0)"
                                                     : ""));
    }
    std::sort(counts.begin(), counts.end());
    counts.erase(std::unique(counts.begin(), counts.end()), counts.end());
    return counts;
}

// The all-reduce of a measured point on its own (bus bandwidth), and the planner's prediction of
// its step from one replica's compute time (compute_one at per_replica rows; 0: none yet).
void add_comm_and_prediction(Row& row, const Config& cfg, const Model& model, double compute_one, int per_replica) {
    const int n = row.replicas;
    const CommPlan comm = comm_plan(model, cfg.strategy);
    row.wire_bytes = comm.wire_bytes;
    // Shared parameters run no all-reduce: each replica sums its slice where it lies. The direct
    // op (the same per-slice sum, then written to every replica) stands in for it in the bus
    // bandwidth and the prediction - an upper bound on what the sums cost.
    const std::string link_op = row.ops == "shared" ? "direct" : row.ops;
    const size_t grad_bytes = size_t(model.trainable_size()) * 4;
    if (n > 1) {
        row.allreduce_s =
            measure_allreduce_seconds(cfg.strategy.devices, link_op, cfg.strategy.allreduce_dtype, grad_bytes);
        row.busbw = 2.0 * (n - 1) / n * double(model.trainable_size()) * dtype_size(cfg.strategy.allreduce_dtype) /
                    row.allreduce_s;
    }
    if (compute_one <= 0) return;
    const double rows_here = double(cfg.train.global_batch_size) / n;
    // the link calibrated at the gradients' size (CPU caches make bandwidth size-dependent)
    const LinkModel link =
        n > 1 ? measure_link(cfg.strategy.devices, link_op, cfg.strategy.allreduce_dtype, grad_bytes) : LinkModel{};
    row.prediction = predict_step(n, compute_one * rows_here / per_replica, comm, link);
    row.predicted = true;
}

// The batch per replica: --per-replica-batch, else the config's global batch split over the
// first count. Strong scaling needs the global batch to divide into every count.
int per_replica_batch(const ScaleOptions& o, const Config& base, const std::vector<int>& counts) {
    if (o.mode == "strong")
        for (int n : counts)
            if (base.train.global_batch_size % n != 0)
                throw ConfigError("train.global_batch_size " + std::to_string(base.train.global_batch_size) +
                                  " does not divide into " + std::to_string(n) + " replicas (strong scaling keeps it)");
    return o.per_replica_batch > 0 ? o.per_replica_batch : std::max(1, base.train.global_batch_size / counts.front());
}

void print_intro(const ScaleOptions& o, const Config& base, const Kind& kind, int per_replica) {
    std::printf("scaling %s: %s\n", o.config.c_str(), model_config_summary(base).c_str());
    std::printf("kind %s: %s\n", kind.name.c_str(), kind.meaning.c_str());
    if (o.mode == "weak")
        std::printf("weak scaling: %d samples per replica, the global batch grows with the replicas\n", per_replica);
    else std::printf("strong scaling: a global batch of %d, split over the replicas\n", base.train.global_batch_size);
    std::printf("%d timed steps after %d of warm-up per point; step time is the median of groups of 5 [min, max]\n\n",
                o.steps, o.warmup);
}

// One row per replica count, measured, with its communication and the planner's prediction.
std::vector<Row> measure_points(const ScaleOptions& o, const Config& base, const Kind& kind,
                                const std::vector<int>& counts, int per_replica) {
    const auto watchdog = steps_watchdog(base.strategy.step_timeout_s);
    auto data = std::make_shared<const Datasets>(load_datasets(base.data, base.base_dir, base.run.seed));
    std::vector<Row> rows;
    double compute_one = 0;  // one replica's step, at per_replica rows: the planner's compute
    for (int n : counts) {
        Config cfg = base;
        cfg.strategy.devices = device_spec(kind, n);
        cfg.train.global_batch_size = o.mode == "weak" ? per_replica * n : base.train.global_batch_size;
        Row row = measure(cfg, data, o.steps, o.warmup, watchdog.get());
        const DeviceList devices = parse_devices(cfg.strategy.devices);
        const auto built =
            build_model(cfg, cfg.model.input_shape.empty() ? data->train.shape : cfg.model.input_shape, false,
                        gradient_piece_floats(cfg.strategy, n, parameters_shared(cfg.strategy, devices)));
        const Model& model = *built;
        if (n == 1) compute_one = row.step_s * (double(per_replica) / cfg.train.global_batch_size);
        if (watchdog) watchdog->phase("the all-reduce measurement", 0);
        add_comm_and_prediction(row, cfg, model, compute_one, per_replica);
        rows.push_back(row);
        std::printf("  measured %s: %.2f ms per step\n", cfg.strategy.devices.c_str(), row.step_s * 1e3);
    }
    const Row first = rows.front();
    for (Row& r : rows) {
        r.speedup = r.samples_per_s / first.samples_per_s;
        r.efficiency = r.speedup / (double(r.replicas) / first.replicas);
        if (r.predicted && first.predicted)
            r.predicted_speedup =
                (double(r.global_batch) / r.prediction.step_s) / (double(first.global_batch) / first.prediction.step_s);
    }
    return rows;
}

// The table, what the shared-parameter rows mean, and a verdict for each step up in replicas.
void print_results(const std::vector<Row>& rows) {
    std::printf("\n%8s %8s %22s %11s %8s %6s %6s %6s %6s %9s %8s %12s %9s\n", "replicas", "batch", "step ms [min, max]",
                "samples/s", "speedup", "eff.", "data%", "comp%", "comm%", "MB/step", "busbw", "predicted ms",
                "pred. x");
    for (const Row& r : rows) r.print();
    if (std::any_of(rows.begin(), rows.end(), [](const Row& r) { return r.ops == "shared"; }))
        std::printf(
            "shared parameters: no all-reduce runs (each replica sums its slice in place); busbw and the "
            "prediction use the direct op's per-slice sum, written to every replica, as an upper bound\n");
    std::printf("\n");
    for (size_t i = 1; i < rows.size(); ++i) std::printf("%s\n", verdict(rows[i - 1], rows[i]).c_str());
    if (!rows.front().predicted) std::printf("(no predictions: they need a 1-replica point for the compute time)\n");
}

// --out: a folder of scaling.json and scaling.png, made when missing; a file in its place, or a
// folder that cannot be made, is an error naming it (exit 2).
void make_out_dir(const std::string& dir) {
    std::error_code ec;
    if (fs::exists(dir, ec) && !fs::is_directory(dir, ec))
        throw ConfigError("--out " + dir + ": is a file; scale writes scaling.json and scaling.png into a folder");
    fs::create_directories(dir, ec);
    if (ec) throw ConfigError("--out " + dir + ": cannot make the folder: " + ec.message());
}

}  // namespace

int scale(const ScaleOptions& o) {
    if (o.mode != "weak" && o.mode != "strong")
        throw ConfigError("--mode: expected weak or strong, got '" + o.mode + "'");
    if (o.steps < 1) throw ConfigError("--steps: expected a positive number of steps");
    const Config base = load_config(o.config, o.sets);
    const Kind kind =
        resolve_kind(o.kind, o.replicas.empty() ? 8 : *std::max_element(o.replicas.begin(), o.replicas.end()));
    const std::vector<int> counts = replica_counts(o, kind);
    const int per_replica = per_replica_batch(o, base, counts);
    const std::string out_dir = o.out_dir.empty() ? (fs::path(base.run.output_dir) / "scaling").string() : o.out_dir;
    make_out_dir(out_dir);  // before the measurement: a folder that cannot be made fails now

    print_intro(o, base, kind, per_replica);
    const std::vector<Row> rows = measure_points(o, base, kind, counts, per_replica);
    print_results(rows);
    json jrows = json::array();
    for (const Row& r : rows) jrows.push_back(r.to_json());
    const std::string json_path = (fs::path(out_dir) / "scaling.json").string();
    write_json({"--out", json_path, /*force=*/true, {}},
               {{"benchmark", "scale"},
                {"config", o.config},
                {"kind", kind.name},
                {"kind_meaning", kind.meaning},
                {"mode", o.mode},
                {"model", model_config_summary(base)},
                {"machine", kind.name == "cpu" || kind.name == "sim" ? cpu_model_name() : ""},
                {"blas", blas_description()},
                {"steps", o.steps},
                {"results", jrows}});
    plot(json_path, (fs::path(out_dir) / "scaling.png").string());
    return kExitOk;
}

}  // namespace mirrored
