#include "mirrored/trainer.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <optional>
#include <nlohmann/json.hpp>
#include <sstream>

#include "kernels/blas.h"
#include "base/env.h"
#include "base/error.h"
#include "mirrored/util.h"
#include "mirrored/bottlenecks.h"
#include "mirrored/checkpoint.h"
#include "mirrored/hf_models.h"
#include "mirrored/resume.h"
#include "mirrored/run_dir.h"
#include "mirrored/run_log.h"
#include "mirrored/software.h"
#include "mirrored/watchdog.h"
#include "base/io.h"
#include "base/output.h"
#include "base/signals.h"
#include "mirrored/strategy.h"

namespace mirrored {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// model.init_from's weights onto every replica, under the optimizer state they start with.
void load_pretrained(Session& s) {
    std::vector<float> params = s.strategy->download_params();
    read_hf_weights(s.cfg.model.init_from, *s.model, params.data());
    s.strategy->upload_params(params);
}

}  // namespace

namespace {

std::atomic<int> g_signals{0};
std::atomic<bool> g_training{false};  // a checkpoint is worth finishing the step for
// Multi-node: what this node says when mpirun ends the job (written from the signal handler).
char g_node_stopped[320] = {};

void on_signal(int sig) {
    // Multi-node: mpirun turns SIGINT/SIGTERM into the end of the job (it sends SIGTERM to every
    // node, then SIGKILL), also when another node has died - no step can be finished with the
    // others. Only SIGUSR1, which mpirun forwards, asks for a checkpoint.
    if (g_node_stopped[0] && sig != SIGUSR1) {
        ssize_t ignored = ::write(2, g_node_stopped, std::strlen(g_node_stopped));
        (void)ignored;
        _exit(kExitInterrupted);
    }
    // Before training starts (loading data, building replicas) there is nothing to save: stop at
    // once. During training the first signal finishes the step and writes a checkpoint; a second
    // one exits at once.
    if (!g_training.load() || g_signals.fetch_add(1) >= 1) {
        static const char msg[] = "\ninterrupted\n";
        ssize_t ignored = ::write(2, msg, sizeof msg - 1);
        (void)ignored;
        _exit(kExitInterrupted);
    }
}

// Test hook: behave as if SIGINT arrived during this step (exercises the interrupt path exactly).
int64_t stop_after_step() { return env_integer("MIRRORED_TEST_STOP_AFTER_STEP", -1, 0, int64_t(1) << 62); }

// Test hook for strategy.on_replica_failure on any devices, CPU replicas included:
// MIRRORED_TEST_REPLICA_FAULT=<replica>:<step> makes that replica fail, as its device would, in
// the step-th step this process takes (a continuation counts afresh, so a fault placed past the
// steps it redoes happens once).
std::pair<int, int64_t> test_replica_fault() {
    static const std::vector<std::string> spec =
        env_fields("MIRRORED_TEST_REPLICA_FAULT", {{0, 1023}, {1, int64_t(1) << 62}}, "REPLICA:STEP, e.g. 1:40");
    if (spec.empty()) return {-1, 0};
    return {std::stoi(spec[0]), std::stoll(spec[1])};
}

// Test hook for multi-node runs: MIRRORED_TEST_NODE_FAULT=<node>:<step>:kill|hang makes that
// node die (SIGKILL) or stop answering after that step, as a crashed or hung machine would.
void test_node_fault(Nodes* nodes, int64_t step) {
    static const std::vector<std::string> spec =
        env_fields("MIRRORED_TEST_NODE_FAULT", {{0, 1 << 20}, {0, int64_t(1) << 62}, {0, 0}},
                   "NODE:STEP:kill or NODE:STEP:hang, e.g. 1:8:kill", {{2, "kill|hang"}});
    if (!nodes || spec.empty() || std::stoi(spec[0]) != nodes->rank() || std::stoll(spec[1]) != step) return;
    std::fflush(nullptr);
    if (spec[2] == "kill") ::raise(SIGKILL);
    for (;;) ::pause();  // hang: only a signal ends this process
}

// "every 1000 steps and every 30 min": when checkpoints are written (the last step and a stop too).
std::string checkpoint_policy(const CheckpointConfig& k) {
    std::vector<std::string> when;
    if (k.every_steps > 0) when.push_back("every " + std::to_string(k.every_steps) + " steps");
    if (k.every_epochs > 0) when.push_back("every " + std::to_string(k.every_epochs) + " epoch(s)");
    if (k.every_minutes > 0) when.push_back("every " + number_str(k.every_minutes) + " min");
    std::string s;
    for (size_t i = 0; i < when.size(); ++i) s += (i ? i + 1 == when.size() ? " and " : ", " : "") + when[i];
    return s.empty() ? "at the end and on a stop only" : s;
}

// A finite-parameters check before anything is saved: a NaN must never overwrite good state.
bool all_finite(const std::vector<float>& v) {
    for (float x : v)
        if (!std::isfinite(x)) return false;
    return true;
}

// strategy.step_timeout_s: the watchdog of a run, from its start (data, replicas, NCCL, the first
// collectives) to its end; none when 0.
std::unique_ptr<Watchdog> make_watchdog(const Config& c) {
    return step_timeout_watchdog(
        c.strategy.step_timeout_s,
        "start-up (loading data, building the replicas, NCCL and peer access, the first copies)");
}

// Every node must read the same data: each node draws its replicas' samples from its own copy by
// the global replica index, so a node whose files differ (another copy, another version, another
// MIRRORED_DATA_DIR) would train a different model than one node would, silently. The splits'
// sizes and fingerprints are compared; a difference stops every node (exit 3).
void check_same_data(const Datasets& data, uint64_t train_fingerprint, Nodes& nodes) {
    const auto describe = [](const std::vector<uint64_t>& v) {
        return std::to_string(v[0]) + " training samples (fingerprint " + hex64(v[1]) + "), " + std::to_string(v[2]) +
               " test samples (" + hex64(v[3]) + ")";
    };
    const std::vector<uint64_t> mine = {data.train.count(), train_fingerprint, data.test.count(),
                                        fingerprint(data.test)};
    const std::vector<uint64_t> all = nodes.all_gather(mine, "the exchange of the data sets' fingerprints");
    for (size_t k = 1; k * mine.size() < all.size(); ++k) {
        const std::vector<uint64_t> theirs(all.begin() + long(k * mine.size()),
                                           all.begin() + long((k + 1) * mine.size()));
        const std::vector<uint64_t> first(all.begin(), all.begin() + long(mine.size()));
        if (theirs == first) continue;
        throw DataError("node " + std::to_string(k) + " reads other data than node 0: " + describe(theirs) +
                        " where node 0 has " + describe(first) +
                        ": every node must read the same files (one shared folder, or identical copies under "
                        "data.root or MIRRORED_DATA_DIR)");
    }
}

class Run {
public:
    Run(const Config& config, Nodes* nodes, std::FILE* progress, const Failover& failover)
        : failover_(failover),
          out_(progress),
          watchdog_(make_watchdog(config)),
          s_(make_session(with_resume_hints(config), nullptr, true, nodes)),
          cfg_(s_->cfg),
          nodes_(nodes),
          leader_(!nodes || nodes->leader()),
          // mpirun hands its processes a pseudo-terminal even when its own output is a file
          log_(progress, leader_, ::isatty(::fileno(progress)) && !nodes) {
        out_dir_ = cfg_.run.output_dir;
        ckpt_dir_ = (fs::path(out_dir_) / "checkpoints").string();
        train_data_ = fingerprint(s_->data->train);
        if (nodes_) check_same_data(*s_->data, train_data_, *nodes_);
        log_.set_context([this] {
            return last_ckpt_step_ >= 0 ? "the last checkpoint is at step " + std::to_string(last_ckpt_step_)
                                        : std::string();
        });
    }

    int run();

private:
    void print_header();
    void print_strategy_choices(const MirroredStrategy& st) const;
    void print_staging_note(const MirroredStrategy& st) const;
    bool prepare_output();  // false: a finished run in a folder this process cannot write
    void resume_or_init();
    void init_weights();
    void start_fresh();
    void resume_from(const CheckpointData& ckpt, const std::string& path);
    void continue_from_start();
    void continue_without(const DeviceError& e, bool from_watchdog = false);
    void continue_after_hang(double idle_s);
    void report_continued();
    int finish_complete_run();
    void train_loop();
    struct AfterStep {
        bool stop = false, eval = false, checkpoint = false;
    };
    AfterStep after_step(const Loader& loader);
    void flush_pending_log();
    void pause_for(const AfterStep& next, double& loop_start);
    void log_train(int64_t step, float lr);
    void check_loss_finite(double loss, int64_t step, float lr) const;
    void alert_bottlenecks(double f_data, double f_comm, double interval);
    void evaluate(int64_t step, double epoch);
    void save_checkpoint(int64_t step);
    void write_summary(const std::string& status);
    void alert(const std::string& kind, const std::string& text) { log_.alert(kind, text, step_); }
    void emit(const json& record) { log_.emit(record); }
    void status_line(const std::string& line, bool final_line) { log_.status_line(line, final_line); }
    // A metric's accuracy for the records, or null for a loss that has none (mse).
    json accuracy(const Metrics& m) const { return has_accuracy_ ? json(m.accuracy()) : json(nullptr); }

    const Failover failover_;
    json failures_ = json::array();  // the run's replica failures (metrics.jsonl's alerts of that kind)
    int64_t process_steps_ = 0;      // steps this process took
    std::FILE* out_;                 // progress: the header, status lines, notes (alerts and warnings go to stderr)
    std::unique_ptr<Watchdog> watchdog_;  // first: it watches the session's building too
    std::unique_ptr<Session> s_;
    Config& cfg_;
    Nodes* nodes_;
    const bool leader_;  // writes the run folder: the only node, or node 0 of several
    RunLog log_;
    RunDirLock lock_;
    std::string out_dir_, ckpt_dir_;
    int64_t total_steps_ = 0, step_ = 0;
    std::optional<int64_t> resumed_from_;
    int64_t redone_steps_ = 0;     // steps the interrupted run had logged past the checkpoint resumed from
    double checkpoint_hours_ = 0;  // the run's device hours up to the checkpoint resumed from
    // This process's devices, wall time, its training loop's time (compute, data and communication
    // waits) and of that the steps an interrupted run had done already (redone here); and the run's
    // device hours before this process (`earlier_h`) and up to now (`run_total_h`).
    struct ProcessHours {
        double devices = 0, wall_s = 0, loop_s = 0, redone_s = 0, earlier_h = 0, run_total_h = 0;
    };
    ProcessHours process_hours() const;
    uint64_t train_data_ = 0;  // fingerprint() of the training set
    Metrics last_train_, last_eval_;
    int64_t last_eval_step_ = -1, last_ckpt_step_ = -1;
    // What a continuation goes on from (strategy.on_replica_failure): the newest checkpoint this
    // process wrote (once on disk), else the one it resumed from.
    std::string resume_path_;
    int64_t resume_step_ = -1;
    std::atomic<bool> handing_over_{false};  // the training thread and the watchdog's: one hands over
    double wall_start_ = 0, train_time_ = 0, interval_start_ = 0, interval_wait_ = 0;
    double last_ckpt_time_ = 0;     // checkpoint.every_minutes counts from here
    double interval_excluded_ = 0;  // evaluation and checkpoint time inside a log interval
    int64_t interval_steps_ = 0, samples_done_ = 0;
    double samples_per_sec_ = 0;
    TimeSplit split_, interval_split_;
    SustainedBottlenecks bottlenecks_;  // alerts need two log intervals in a row
    bool pending_log_ = false;
    // The first log interval of a process holds its start-up (the loader filling its queue, first
    // allocations, graph capture): its time split says nothing about the steady state, so it
    // raises no alert.
    bool first_interval_ = true;
    const int64_t stop_after_ = stop_after_step();
    // The learning rate's replica count (optimizer.scale_lr_with_replicas): a continuation keeps
    // the first process's, as the global batch stays.
    const int lr_replicas_ = failover_.continued ? failover_.continued->lr_replicas : s_->strategy->all_replicas();
    int64_t pending_step_ = 0;
    float pending_lr_ = 0;
    int exit_code_ = kExitOk;
    const bool has_accuracy_ = loss_kind(cfg_.model.loss).accuracy;
    // a language model: its loss is per token, also reported in bits (per byte for byte-level tokens)
    const int tokens_per_sample_ = s_->model->output_positions();
    json bits(const Metrics& m) const {
        return tokens_per_sample_ > 1 ? json(m.loss() / std::log(2.0)) : json(nullptr);
    }
    // ... and per byte of text where the token files say how many bytes a token holds (meta.json):
    // comparable across tokenizers
    json bits_per_byte(const Metrics& m) const {
        const double b = s_->data->test.bytes_per_token;
        return tokens_per_sample_ > 1 && b > 0 ? json(m.loss() / std::log(2.0) / b) : json(nullptr);
    }
    // what the throughput is counted in: tokens for a language model, else samples
    double throughput(double samples_per_s) const {
        return tokens_per_sample_ > 1 ? samples_per_s * tokens_per_sample_ : samples_per_s;
    }
    const char* throughput_unit() const { return tokens_per_sample_ > 1 ? "tokens/s" : "samples/s"; }
};

void Run::print_header() {
    MirroredStrategy& st = *s_->strategy;
    const DeviceTraits& traits = st.device_traits();
    const char* kind = traits.display;
    // Every node's devices: collected on every node, printed by node 0.
    const std::vector<std::string> nodes = nodes_ ? nodes_->all_gather(nodes_->host() + ": " + st.devices().describe() +
                                                                           ", " + st.replica(0).device->description(),
                                                                       "the exchange of the nodes' devices")
                                                  : std::vector<std::string>{};
    const std::string where = nodes_ ? std::to_string(nodes_->count()) + " nodes x " : std::string();
    std::fprintf(out_, "mirrored: run '%s' on %s%d %s replica(s) [%s], cross-device ops %s, %zu bucket(s)\n",
                 cfg_.run.name.c_str(), where.c_str(), st.replicas(), kind, st.devices().describe().c_str(),
                 st.cross_device_ops_name(), st.buckets().size());
    if (nodes_) {
        std::fprintf(out_,
                     "  %d replicas in all over %s; node k's replica r is replica k x %d + r; gradients summed in the "
                     "node, then between the nodes\n",
                     st.all_replicas(), Nodes::library().c_str(), st.replicas());
        for (size_t k = 0; k < nodes.size(); ++k) std::fprintf(out_, "  node %zu: %s\n", k, nodes[k].c_str());
    }
    std::fprintf(out_, "  software: %s\n", software_line().c_str());
    print_strategy_choices(st);
    if (!traits.gpu && cuda_status().state != CudaStatus::State::ok)
        std::fprintf(out_, "  no GPU: %s\n", cuda_unavailable_reason().c_str());
    if (*traits.note) std::fprintf(out_, "  %s\n", traits.note);
    for (int r = 0; r < st.replicas(); ++r)
        if (r == 0 || !traits.replicas_alike)
            std::fprintf(out_, "  replica %d: %s\n", r, st.replica(r).device->description().c_str());
    const std::string topo = st.topology_report();
    if (!topo.empty()) std::fprintf(out_, "  %s", topo.c_str());
    std::fprintf(out_,
                 "  data: %s, %zu train / %zu test samples of %s, %d classes; global batch %d (%d per replica%s), %lld "
                 "steps per epoch\n",
                 cfg_.data.dataset.c_str(), s_->data->train.count(), s_->data->test.count(),
                 shape_str(s_->data->train.shape).c_str(), s_->data->train.classes, cfg_.train.global_batch_size,
                 cfg_.train.global_batch_size / st.all_replicas(),
                 cfg_.train.grad_accumulation_steps > 1
                     ? (", " + std::to_string(cfg_.train.grad_accumulation_steps) + " micro-batches").c_str()
                     : "",
                 static_cast<long long>(s_->train_loader->batches_per_epoch()));
    std::fprintf(out_, "  model:\n%s", s_->model->summary().c_str());
    const Device& d0 = *st.replica(0).device;
    std::fprintf(
        out_,
        "  precision %s, gradients all-reduced in %s; memory per replica: planned %s; allocated %s (measured)%s\n",
        precision_name(cfg_.train.precision), dtype_name(cfg_.strategy.allreduce_dtype),
        st.memory_plan().describe().c_str(), format_bytes(d0.allocated_bytes()).c_str(),
        traits.gpu ? ("; " + format_bytes(d0.memory_in_use()) + " in use on the GPU").c_str() : "");
    std::fprintf(out_, "  output: %s; checkpoints %s, the newest %d kept\n", out_dir_.c_str(),
                 checkpoint_policy(cfg_.checkpoint).c_str(), cfg_.checkpoint.keep);
    if (cfg_.strategy.continue_on_failure)
        std::fprintf(out_,
                     "  on a device's fault: continue on the others from the last checkpoint (at least %d "
                     "replica%s)\n",
                     cfg_.strategy.min_replicas, cfg_.strategy.min_replicas == 1 ? "" : "s");
    if (failover_.continued)
        std::fprintf(out_, "  continuing without %s, which failed\n", failover_.continued->failed.c_str());
    std::fflush(out_);
}

// shard: gradients where its staging slots outweigh the saving. A slot holds a bucket whole and
// a bucket splits only between gradient pieces (a dense weight's blocks of rows; any other tensor
// whole): where the buckets are larger than the largest piece, smaller buckets help; where that
// piece fills a bucket alone, shard: optimizer keeps less.
void Run::print_staging_note(const MirroredStrategy& st) const {
    const Model& model = st.model();
    const uint64_t whole = uint64_t(model.grad_size()) * sizeof(float);
    if (st.memory_plan().grads <= whole) return;
    size_t piece = 0, at = 0;  // the largest piece, floats, and its offset
    for (const GradientPiece& p : model.gradient_pieces())
        if (p.end - p.begin > piece) piece = p.end - p.begin, at = p.begin;
    const TensorInfo* tensor = nullptr;
    for (const TensorInfo& t : model.tensors())
        if (t.trainable && at >= t.offset && at < t.offset + t.count) tensor = &t;
    if (!tensor) return;
    size_t bucket = 0;  // the largest trainable bucket, floats
    for (const Bucket& b : st.buckets())
        if (b.begin < model.trainable_size()) bucket = std::max(bucket, b.end - b.begin);
    // a block of a split weight is about a bucket: smaller buckets make smaller blocks
    const bool smaller_buckets_help = bucket > 2 * piece || piece < tensor->count;
    std::fprintf(out_,
                 "  note: shard: gradients keeps more gradient memory here than unsharded (%s against %s): its "
                 "staging slots (%s) each hold a bucket whole, the largest bucket is %s, and a bucket splits only "
                 "a dense layer's weight, by rows (the largest piece, of %s, is %s); %s\n",
                 format_bytes(st.memory_plan().grads).c_str(), format_bytes(whole).c_str(),
                 format_bytes(uint64_t(st.gradient_slot_floats()) * sizeof(float)).c_str(),
                 format_bytes(uint64_t(bucket) * sizeof(float)).c_str(), tensor->name.c_str(),
                 format_bytes(uint64_t(piece) * sizeof(float)).c_str(),
                 smaller_buckets_help ? "a smaller strategy.bucket_mb makes smaller slots"
                                      : "that piece fills its slot alone, so strategy.shard: optimizer keeps less "
                                        "on this model");
}

// How the strategy runs: the ops `auto` chose, shared parameters, captured steps - each when it
// applies, and why not when the config asked for it and it does not.
void Run::print_strategy_choices(const MirroredStrategy& st) const {
    if (!st.cross_device_ops_choice().empty())
        std::fprintf(out_, "  cross-device ops: %s\n", st.cross_device_ops_choice().c_str());
    if (st.shared_parameters())
        std::fprintf(out_,
                     "  shared parameters: the %s keep one parameter copy; each sums its slice of the gradients over "
                     "the replicas and updates that slice\n",
                     st.device_traits().one_memory ? "CPU replicas" : "replicas on one GPU");
    else if (cfg_.strategy.shared_parameters && st.replicas() > 1)
        std::fprintf(
            out_,
            "  shared parameters apply to replicas in one memory (CPU replicas, or replicas sharing one GPU on "
            "one node): each of these replicas keeps its own copy\n");
    if (st.sharded_optimizer())
        std::fprintf(out_,
                     "  shard: %s - each replica keeps the optimizer state of its own chunk of every gradient "
                     "bucket (%s of %s); gradients are reduce-scattered, the updated parameters all-gathered\n",
                     st.sharded_gradients() ? "gradients" : "optimizer",
                     format_bytes(st.memory_plan().optimizer).c_str(),
                     format_bytes(uint64_t(st.model().trainable_size()) * sizeof(float) *
                                  uint64_t(optimizer_state_buffers(cfg_.optimizer)))
                         .c_str());
    if (st.sharded_gradients()) {
        std::fprintf(out_,
                     "  and gradients: each replica keeps only its own chunks' summed gradients, backward writing "
                     "the buckets into %d reused staging slot(s) (gradients %s per replica, unsharded %s)\n",
                     st.gradient_slots(), format_bytes(st.memory_plan().grads).c_str(),
                     format_bytes(uint64_t(st.model().grad_size()) * sizeof(float)).c_str());
        print_staging_note(st);
    } else if (cfg_.strategy.shard != StrategyConfig::Shard::none && st.shared_parameters()) {
        std::fprintf(out_,
                     "  shard: %s - the shared parameter copy's optimizer state is already held once, "
                     "each replica updating its slice; the gradients stay whole per replica (summed in place by "
                     "slices)\n",
                     shard_name(cfg_.strategy.shard));
    }
    if (st.cuda_graph())
        std::fprintf(out_,
                     "  cuda_graph: each step shape is captured once and replayed with one launch (not yet measured on "
                     "a GPU)\n");
    if (st.cuda_graph() && st.device_traits().gpu && std::string(st.cross_device_ops_name()) == "nccl")
        std::fprintf(out_,
                     "  cuda_graph with nccl: NCCL documents that capturing several GPUs of one process can deadlock "
                     "in a graph launch; the watchdog stops a run that hangs, and the ring needs no NCCL\n");
    else if (!st.cuda_graph_note().empty())
        std::fprintf(out_, "  cuda_graph is off: %s\n", st.cuda_graph_note().c_str());
    if (cfg_.strategy.fused_epilogues)
        std::fprintf(out_, "  fused_epilogues: %s\n", st.device_traits().fused_epilogues);
}

bool Run::prepare_output() {
    std::error_code ec;
    fs::create_directories(ckpt_dir_, ec);
    std::string holder;
    const RunDirLock::Result lock = ec ? RunDirLock::Result::read_only : lock_.acquire(out_dir_, holder);
    if (lock == RunDirLock::Result::busy)
        cfg_.fail("run.output_dir", out_dir_ + " is in use by another mirrored run (" + holder +
                                        "); wait for it to finish or choose another --output");
    if (lock == RunDirLock::Result::read_only) {
        if (cfg_.checkpoint.resume == "never")
            throw CheckpointError(out_dir_ + ": cannot start afresh as checkpoint.resume: never asks: the folder is " +
                                  (ec ? ec.message() : std::string("read-only")) + "; choose another --output");
        if (!completed_summary(out_dir_).is_null()) return false;  // nothing to write: show it
        cfg_.fail("run.output_dir",
                  "cannot write to " + out_dir_ + (ec ? ": " + ec.message() : std::string(" (read-only)")));
    }
    return true;
}

void Run::resume_or_init() {
    std::string used;
    std::optional<CheckpointData> ckpt =
        leader_ ? find_checkpoint(cfg_, *s_->model, ckpt_dir_, out_, used) : std::nullopt;
    if (nodes_) {  // node 0 chooses; every node reads that checkpoint from its own view of the folder
        const bool named = cfg_.checkpoint.resume != "auto";
        std::string chosen = ckpt ? (named ? used : fs::path(used).filename().string()) : std::string();
        chosen = nodes_->broadcast(chosen, "the choice of the checkpoint to resume from");
        if (!leader_ && !chosen.empty()) {
            used = named ? chosen : (fs::path(ckpt_dir_) / chosen).string();
            std::error_code ec;
            if (!fs::exists(used, ec))
                throw CheckpointError(used +
                                      ": this node cannot see the checkpoint node 0 resumes from: the run "
                                      "folder must be on a file system every node shares, at the same path");
            ckpt = read_checkpoint(used, *s_->model, model_config_hash(cfg_), model_config_summary(cfg_));
        }
    }
    if (ckpt) resume_from(*ckpt, used);
    else if (failover_.continued) continue_from_start();
    else start_fresh();
}

// Step 0's weights: initialised, then model.init_from's where it names a folder.
void Run::init_weights() {
    s_->strategy->init_and_broadcast();
    if (!cfg_.model.init_from.empty()) {
        std::fprintf(out_, "  weights from %s\n", cfg_.model.init_from.c_str());
        load_pretrained(*s_);
    }
}

// A continuation after a device failed before the run's first checkpoint: from step 0 on the
// survivors, the run folder kept (its metrics hold the failure).
void Run::continue_from_start() {
    init_weights();
    s_->train_loader->start({0, 0});
    step_ = 0;
    resumed_from_ = 0;
    const RecoveredMetrics recovered = recover_metrics(out_dir_, 0, leader_);
    failures_ = recovered.failures;
    redone_steps_ = std::max<int64_t>(0, recovered.last_logged_step);
    log_.open_metrics(out_dir_, std::ios::app);
    emit({{"type", "resume"}, {"step", 0}, {"redone_steps", redone_steps_}});
}

// A fresh start never deletes an earlier run's results: they move aside.
void Run::start_fresh() {
    std::vector<std::string> old = list_checkpoints(ckpt_dir_);
    for (const char* f : {"metrics.jsonl", "metrics.csv", "summary.json", "config.yaml"})
        old.push_back((fs::path(out_dir_) / f).string());
    const std::string aside = leader_ ? move_aside(out_dir_, old) : std::string();
    if (!aside.empty()) std::fprintf(out_, "  starting fresh; the earlier run's files moved to %s\n", aside.c_str());
    init_weights();
    s_->train_loader->start({0, 0});
    step_ = 0;
    log_.open_metrics(out_dir_, std::ios::trunc);
}

void Run::resume_from(const CheckpointData& ckpt, const std::string& path) {
    MirroredStrategy& st = *s_->strategy;
    check_checkpoint_fits(ckpt, path, cfg_, s_->data->train.count(), train_data_, s_->train_loader->batches_per_epoch(),
                          total_steps_);
    for (const std::string& note : resume_notes(ckpt, st, cfg_)) std::fprintf(out_, "  note: %s\n", note.c_str());
    adopt_gemm_choices(ckpt, st, cfg_, out_);
    if (leader_)  // node 0 alone writes the run folder
        if (const std::string moved = set_aside_later_checkpoints(out_dir_, ckpt_dir_, ckpt.step); !moved.empty())
            std::fprintf(out_, "  note: %s\n", moved.c_str());
    st.upload_state(ckpt.params, ckpt.optimizer);
    st.restore_loss_scale(ckpt.loss_scale);
    st.restore_train_metrics(ckpt.train_metrics);
    s_->train_loader->start(ckpt.loader);
    step_ = ckpt.step;
    resumed_from_ = ckpt.step;
    last_ckpt_step_ = ckpt.step;
    resume_path_ = fs::absolute(path).string();
    resume_step_ = ckpt.step;
    if (watchdog_) watchdog_->checkpointed(ckpt.step);  // a hang from here on names it, not "none yet"
    const RecoveredMetrics recovered = recover_metrics(out_dir_, ckpt.step, leader_);
    last_train_ = recovered.train;
    last_eval_ = recovered.eval;
    last_eval_step_ = recovered.eval_step;
    failures_ = recovered.failures;
    log_.open_metrics(out_dir_, std::ios::app);
    // the resume on the time axis, with the steps the interrupted run had logged past the checkpoint
    redone_steps_ = std::max<int64_t>(0, recovered.last_logged_step - ckpt.step);
    checkpoint_hours_ = ckpt.device_hours;
    emit({{"type", "resume"}, {"step", ckpt.step}, {"redone_steps", redone_steps_}});
}

// strategy.on_replica_failure: continue. A fault of one device hands the run to a process on the
// others (mirrored/failover.h); this returns (and the error stops the run) when the fault names
// no device, when too few replicas would be left, or when the restart itself fails.
void Run::continue_without(const DeviceError& e, bool from_watchdog) {
    if (!cfg_.strategy.continue_on_failure || !failover_.restart || e.device().empty() || !leader_ ||
        g_signals.load() > 0)  // asked to stop: it stops
        return;
    if (handing_over_.exchange(true))  // the other thread hands over (or ends the process): wait for it
        for (;;) ::pause();
    MirroredStrategy& st = *s_->strategy;
    std::vector<std::string> names;
    for (int r = 0; r < st.replicas(); ++r) names.push_back(st.replica(r).device->name());
    const SurvivorPlan plan = plan_survivors(names, e.device(), cfg_.train.global_batch_size,
                                             cfg_.train.grad_accumulation_steps, cfg_.strategy.min_replicas);
    if (plan.keep.empty())
        throw DeviceError(std::string(e.what()) + "; strategy.on_replica_failure: continue: " + plan.refused +
                          ": stopping");
    const Continuation next{survivors_spec(st.devices(), plan.keep), plan.accumulation, e.device(),
                            int64_t(unix_time_s() * 1000),           lr_replicas_,      resume_path_};
    const int64_t from = std::max<int64_t>(resume_step_, 0);
    const std::string count = std::to_string(plan.keep.size()), noun = plan.keep.size() == 1 ? " replica" : " replicas";
    // CPU replicas are interchangeable: "cpu:2 failed; continuing on cpu:2" would read as the same one
    const bool cpu = std::string(st.devices().backend->name) == "cpu";
    std::string text = e.device() + " failed after step " + std::to_string(step_) + "; continuing on " +
                       (cpu ? count + " CPU" + noun + " (" + next.devices : next.devices + " (" + count + noun);
    if (next.accumulation != cfg_.train.grad_accumulation_steps)
        text += ", " + std::to_string(next.accumulation) + " accumulation steps";
    text += ", global batch " + std::to_string(cfg_.train.global_batch_size) + ") from " +
            (resume_step_ >= 0 ? "the checkpoint of step " + std::to_string(from) : std::string("step 0")) + ", " +
            std::to_string(step_ - from) + " steps redone";
    if (int(plan.keep.size()) < plan.survivors)
        text += "; " + std::to_string(plan.survivors) + " replicas survive but only " +
                std::to_string(plan.keep.size()) + " share the global batch equally";
    // write(2), no stdio: on the watchdog's thread the training thread may be inside a stream
    if (log_.tty() && !from_watchdog) std::fprintf(out_, "\n");
    const std::string said = "alert: replica_failure: " + text + "\n  the error: " + e.what() + "\n";
    (void)!::write(2, said.data(), said.size());
    const json record = {{"type", "alert"},           {"step", step_},
                         {"kind", "replica_failure"}, {"message", text},
                         {"device", e.device()},      {"error", e.what()},
                         {"resume_step", from},       {"redone_steps", step_ - from},
                         {"devices", next.devices},   {"accumulation", next.accumulation}};
    if (!from_watchdog) {
        emit(record);
    } else {  // the training thread is stuck, perhaps inside the run log's stream: a file of its own
        json r = record;
        r["time"] = unix_time_s();
        std::ofstream(fs::path(out_dir_) / "metrics.jsonl", std::ios::app)
            << r.dump(-1, ' ', false, json::error_handler_t::replace) << "\n";
    }
    if (!from_watchdog) std::fflush(nullptr);  // (a stuck thread's buffered progress lines are lost)
    if (g_signals.load() > 0)                  // a stop asked for meanwhile: the new process would not know of it
        throw DeviceError(std::string(e.what()) + "; not continuing on " + next.devices + ": asked to stop");
    failover_.restart(next);
    throw DeviceError(std::string(e.what()) + "; strategy.on_replica_failure: continue: could not restart on " +
                      next.devices + ": " + std::strerror(errno));
}

// The watchdog's thread, after strategy.step_timeout_s without progress (the training thread is
// stuck in a wait): a hang that one device's replicas alone are behind in is that device's
// failure; anything else (every replica stopped at the same point, the input pipeline) ends the
// run as the watchdog always does.
void Run::continue_after_hang(double idle_s) {
    const std::string device = s_->strategy->lagging_device();
    if (device.empty()) return;
    char seconds[32];
    std::snprintf(seconds, sizeof seconds, "%.0f", idle_s);
    try {
        continue_without(DeviceError(device + ": no progress for " + seconds +
                                         " s (strategy.step_timeout_s): its step stopped while the other "
                                         "replicas' went on (a hung kernel or copy)",
                                     device),
                         true);
    } catch (const std::exception& e) {  // the watchdog ends the process as it would have
        const std::string said = std::string("error: ") + e.what() + "\n";
        (void)!::write(2, said.data(), said.size());
    }
}

// The first step of a continuation: how long the run was down.
void Run::report_continued() {
    s_->strategy->synchronize();  // completed, not only issued
    const double after = unix_time_s() - double(failover_.continued->fault_ms) / 1000;
    std::fprintf(out_, "continued without %s: step %lld done %.1f s after the fault\n",
                 failover_.continued->failed.c_str(), static_cast<long long>(step_), after);
    emit({{"type", "continued"}, {"step", step_}, {"device", failover_.continued->failed}, {"after_fault_s", after}});
    if (!failures_.empty()) failures_.back()["after_fault_s"] = after;
}

void Run::check_loss_finite(double loss, int64_t step, float lr) const {
    if (std::isfinite(loss)) return;
    throw Error(
        kExitDiverged,
        "training diverged: the loss is " + std::to_string(loss) + " at step " + std::to_string(step) + " (lr " +
            std::to_string(lr) + "); lower optimizer.lr or set optimizer.grad_clip_norm" +
            (last_ckpt_step_ >= 0 ? "; the last checkpoint is at step " + std::to_string(last_ckpt_step_) : ""));
}

void Run::alert_bottlenecks(double f_data, double f_comm, double interval) {
    IntervalLoad load;
    load.data_share = f_data;
    load.comm_share = f_comm;
    load.device_step_s = interval_split_.device_step_s;
    load.wall_step_s = interval / double(std::max<int64_t>(interval_steps_, 1));
    load.loader_threads = s_->train_loader->threads();
    // CPU replicas gather their own rows: the loader's threads then only draw indices and labels
    if (load.loader_threads > 0 && !s_->train_loader->gathers())
        load.loader_batch_s = s_->train_loader->seconds_per_batch();
    load.prefetch = cfg_.data.prefetch;
    load.bucket_mb = cfg_.strategy.bucket_mb;
    for (const Bottleneck& b : bottlenecks_.update(load)) alert(b.kind, b.message);
}

void Run::log_train(int64_t step, float lr) {
    MirroredStrategy& st = *s_->strategy;
    last_train_ = st.take_train_metrics();
    const double t = now_s();
    const double interval = std::max(t - interval_start_ - interval_excluded_, 1e-9);
    const double wait = s_->train_loader->wait_seconds() - interval_wait_;
    st.collect_timing(interval_split_, interval_steps_);
    interval_split_.data_wait_s = wait;
    split_.data_wait_s += wait;
    split_.compute_s += interval_split_.compute_s;
    split_.comm_s += interval_split_.comm_s;
    const double sps = double(interval_steps_) * cfg_.train.global_batch_size / interval;
    samples_per_sec_ = sps;
    const double loss = last_train_.loss();
    check_loss_finite(loss, step, lr);
    const double bpe = double(s_->train_loader->batches_per_epoch());
    const double busy = interval_split_.compute_s + interval_split_.comm_s + interval_split_.data_wait_s;
    const double f_data = busy > 0 ? interval_split_.data_wait_s / busy : 0;
    const double f_comm = busy > 0 ? interval_split_.comm_s / busy : 0;
    const double f_compute = busy > 0 ? interval_split_.compute_s / busy : 0;
    json record = {{"type", "train"},
                   {"step", step},
                   {"epoch", double(step) / bpe},
                   {"loss", loss},
                   {"accuracy", accuracy(last_train_)},
                   {"lr", lr},
                   {"samples_per_sec", sps},
                   {"time_split", {{"data_wait", f_data}, {"compute", f_compute}, {"comm", f_comm}}}};
    if (tokens_per_sample_ > 1) record["tokens_per_sec"] = throughput(sps);
    if (cfg_.train.precision == Precision::fp16) record["loss_scale"] = st.loss_scale();
    emit(record);
    const double eta = (total_steps_ - step) * cfg_.train.global_batch_size / std::max(sps, 1e-9);
    char acc[32] = "";
    if (has_accuracy_) std::snprintf(acc, sizeof acc, "  acc %.3f", last_train_.accuracy());
    char line[256];
    std::snprintf(line, sizeof line,
                  "epoch %lld/%.0f  step %lld/%lld  loss %.4f%s  lr %.3g  %.0f %s  ETA %s  "
                  "[data %.0f%% compute %.0f%% comm %.0f%%]",
                  static_cast<long long>((step - 1) / (int64_t)bpe) + 1, std::ceil(total_steps_ / bpe),
                  static_cast<long long>(step), static_cast<long long>(total_steps_), loss, acc, double(lr),
                  throughput(sps), throughput_unit(), duration_str(eta).c_str(), 100 * f_data, 100 * f_compute,
                  100 * f_comm);
    std::string text = line;
    // bad files left out or replaced (data.on_bad_file: skip): said on every line, not only at the end
    const Dataset& train = s_->data->train;
    const uint64_t bad = train.skipped_files.size() + (train.source ? train.source->bad_reads() : 0);
    if (bad) text += "  [" + std::to_string(bad) + " bad file(s) skipped]";
    status_line(text, false);
    if (!first_interval_) alert_bottlenecks(f_data, f_comm, interval);
    first_interval_ = false;
    interval_start_ = t;
    interval_excluded_ = 0;
    interval_wait_ = s_->train_loader->wait_seconds();
    s_->train_loader->reset_fill_time();
    interval_steps_ = 0;
    interval_split_ = {};
}

void Run::evaluate(int64_t step, double epoch) {
    if (watchdog_) watchdog_->phase("an evaluation", step);
    const double t0 = now_s();
    last_eval_ = s_->strategy->evaluate(*s_->test_loader);
    last_eval_step_ = step;
    emit({{"type", "eval"},
          {"step", step},
          {"epoch", epoch},
          {"test_loss", last_eval_.loss()},
          {"test_accuracy", accuracy(last_eval_)},
          {"test_bits_per_token", bits(last_eval_)},
          {"test_bits_per_byte", bits_per_byte(last_eval_)},
          {"samples", last_eval_.count}});
    char acc[120] = "";
    if (has_accuracy_) std::snprintf(acc, sizeof acc, "  test accuracy %.4f", last_eval_.accuracy());
    if (const json b = bits(last_eval_), per_byte = bits_per_byte(last_eval_); !per_byte.is_null())
        std::snprintf(acc + std::strlen(acc), sizeof acc - std::strlen(acc), "  (%.3f bits per token, %.3f per byte)",
                      b.get<double>(), per_byte.get<double>());
    else if (!b.is_null())
        std::snprintf(acc + std::strlen(acc), sizeof acc - std::strlen(acc), "  (%.3f bits per token)",
                      b.get<double>());
    char line[200];
    std::snprintf(line, sizeof line, "eval  epoch %.2f  step %lld  test loss %.4f%s  (%.1fs)", epoch,
                  static_cast<long long>(step), last_eval_.loss(), acc, now_s() - t0);
    status_line(line, true);
}

void Run::save_checkpoint(int64_t step) {
    MirroredStrategy& st = *s_->strategy;
    CheckpointData d;
    d.step = step;
    d.loader = s_->train_loader->position();
    d.seed = cfg_.run.seed;
    d.train_metrics = st.peek_train_metrics();  // every node's (a collective)
    d.params = st.download_params();
    if (!all_finite(d.params))
        throw Error(kExitDiverged, "training diverged: parameters are not finite at step " + std::to_string(step) +
                                       "; no checkpoint was written" +
                                       (last_ckpt_step_ >= 0
                                            ? " (the last good one is at step " + std::to_string(last_ckpt_step_) + ")"
                                            : ""));
    last_ckpt_step_ = step;
    if (!leader_) return;  // node 0 writes; its replicas are every node's (verified)
    d.optimizer = st.download_optimizer_state();
    d.model_hash = model_config_hash(cfg_);
    d.model_summary = model_config_summary(cfg_);
    d.config_yaml = config_to_yaml(cfg_);
    d.replicas = st.all_replicas();
    d.devices = st.devices().describe();
    d.blas_kernel = gemm_library(st, cfg_);
    d.gemm_choices = st.backend().gemm_choices();
    d.device_hours = process_hours().run_total_h;  // as summary.json's run_total
    d.cross_device_ops = st.cross_device_ops_name();
    d.global_batch = cfg_.train.global_batch_size;
    d.loss_scale = st.loss_scale_state();
    d.train_samples = int64_t(s_->data->train.count());
    d.train_data = train_data_;
    d.software = software_json();
    if (watchdog_) watchdog_->phase("a checkpoint write", step);
    write_checkpoint(checkpoint_path(ckpt_dir_, step), *s_->model, d);
    resume_path_ = fs::absolute(checkpoint_path(ckpt_dir_, step)).string();
    resume_step_ = step;
    prune_checkpoints(ckpt_dir_, cfg_.checkpoint.keep, step);
    if (watchdog_) watchdog_->checkpointed(step);
    last_ckpt_time_ = now_s();
}

Run::ProcessHours Run::process_hours() const {
    const MirroredStrategy& st = *s_->strategy;
    ProcessHours p;
    p.devices = double(st.devices().distinct()) * st.node_count();
    p.loop_s = split_.compute_s + split_.comm_s + split_.data_wait_s;
    const double steps_run = double(step_ - resumed_from_.value_or(0));
    p.redone_s =
        steps_run > 0 ? p.loop_s / steps_run * double(std::min<int64_t>(redone_steps_, int64_t(steps_run))) : 0;
    p.wall_s = now_s() - wall_start_;
    // The interrupted process's work after its checkpoint was lost: it cost as long as redoing it.
    p.earlier_h = checkpoint_hours_ + p.redone_s * p.devices / 3600;
    p.run_total_h = p.earlier_h + p.wall_s * p.devices / 3600;
    return p;
}

void Run::write_summary(const std::string& status) {
    MirroredStrategy& st = *s_->strategy;
    json checks = json::array();
    for (uint64_t c : st.all_checksums()) checks.push_back(hex64(c));  // every node's (a collective)
    if (!leader_) return;
    const double bpe = double(s_->train_loader->batches_per_epoch());
    // What this process cost in device hours: its wall time on every device (GPUs, or the cores of
    // CPU replicas), split into the training loop's compute, data wait and exposed communication,
    // and the rest (start-up, evaluations, checkpoints); `redone`, within compute and the loop's
    // waits, is the steps an interrupted run had done already. Across processes: the hours up to
    // the checkpoint resumed from, plus the interrupted process's work after it, lost (as long as
    // this process took to redo it), are `earlier_processes`; with this process, `run_total`.
    const ProcessHours p = process_hours();
    const double wall = p.wall_s, h = p.devices / 3600;
    const json device_hours = {{"devices", p.devices},
                               {"total", wall * h},
                               {"compute", split_.compute_s * h},
                               {"data_wait", split_.data_wait_s * h},
                               {"comm_wait", split_.comm_s * h},
                               {"other", std::max(0.0, wall - p.loop_s) * h},
                               {"redone", p.redone_s * h},
                               {"earlier_processes", p.earlier_h},
                               {"run_total", p.run_total_h}};
    // Files left out when opened and samples that could not be read (data.on_bad_file: skip).
    json bad = json::array();
    uint64_t bad_reads = 0;
    for (const Dataset* d : {&s_->data->train, &s_->data->test}) {
        for (size_t i = 0; i < d->skipped_files.size() && bad.size() < 100; ++i) bad.push_back(d->skipped_files[i]);
        if (d->source) bad_reads += d->source->bad_reads();
    }
    const json data = {{"skipped_files", s_->data->train.skipped_files.size() + s_->data->test.skipped_files.size()},
                       {"skipped", bad},
                       {"bad_reads", bad_reads}};
    json j = {
        {"status", status},
        {"name", cfg_.run.name},
        {"test_accuracy", last_eval_step_ >= 0 ? accuracy(last_eval_) : json(nullptr)},
        {"test_loss", last_eval_step_ >= 0 ? json(last_eval_.loss()) : json(nullptr)},
        {"test_bits_per_token", last_eval_step_ >= 0 ? bits(last_eval_) : json(nullptr)},
        {"test_bits_per_byte", last_eval_step_ >= 0 ? bits_per_byte(last_eval_) : json(nullptr)},
        {"train_loss", last_train_.count > 0 ? json(last_train_.loss()) : json(nullptr)},
        {"train_accuracy", last_train_.count > 0 ? accuracy(last_train_) : json(nullptr)},
        {"epochs", double(step_) / bpe},
        {"steps", step_},
        {"global_batch_size", cfg_.train.global_batch_size},
        {"replicas", st.all_replicas()},
        {"nodes", st.node_count()},
        {"devices", st.devices().describe()},
        {"device_type", st.backend().name},
        {"cross_device_ops", st.cross_device_ops_name()},
        {"parameters", s_->model->param_count()},
        {"train_data_fingerprint", hex64(train_data_)},  // which data: runs on the same data compare
        {"data", data},
        {"precision", precision_name(cfg_.train.precision)},
        {"blas", blas_description()},
        {"software", json::parse(software_json())},
        {"peak_memory_bytes", st.peak_memory_bytes()},
        {"memory_plan_bytes", st.memory_plan().total()},
        {"memory_per_replica_bytes", st.memory_per_replica_bytes()},
        {"shard", st.sharded_gradients()   ? "gradients"
                  : st.sharded_optimizer() ? "optimizer"
                                           : "none"},
        // CUDA: what GPU 0 has in use, the CUDA context and libraries included; elsewhere the same as allocated
        {"device_memory_in_use_bytes", st.replica(0).device->memory_in_use()},
        {"allreduce_dtype", dtype_name(cfg_.strategy.allreduce_dtype)},
        {"samples_per_sec", train_time_ > 0 ? double(samples_done_) / train_time_ : 0.0},
        {"tokens_per_sec", tokens_per_sample_ > 1 && train_time_ > 0
                               ? json(double(samples_done_) * tokens_per_sample_ / train_time_)
                               : json(nullptr)},
        {"wall_time_s", wall},
        {"device_hours", device_hours},
        {"train_time_s", train_time_},
        {"time_split",
         {{"data_wait_s", split_.data_wait_s}, {"compute_s", split_.compute_s}, {"comm_s", split_.comm_s}}},
        {"replica_checksums", checks},
        {"resumed_from_step", resumed_from_ ? json(*resumed_from_) : json(nullptr)},
        {"replica_failures", failures_},
        {"last_checkpoint_step", last_ckpt_step_ >= 0 ? json(last_ckpt_step_) : json(nullptr)},
    };
    write_file_atomic((fs::path(out_dir_) / "summary.json").string(),
                      j.dump(2, ' ', false, json::error_handler_t::replace) + "\n");
}

int Run::run() {
    wall_start_ = now_s();
    bool writable = leader_ ? prepare_output() : true;
    if (nodes_) writable = nodes_->broadcast(writable ? "write" : "show", "the run folder check") == "write";
    if (!writable) {
        if (leader_)
            std::fprintf(out_, "the run in %s is complete (the folder cannot be written, so it is only shown):\n%s\n",
                         out_dir_.c_str(),
                         completed_summary(out_dir_).dump(2, ' ', false, json::error_handler_t::replace).c_str());
        return kExitOk;
    }
    print_header();
    const int64_t bpe = s_->train_loader->batches_per_epoch();
    total_steps_ = cfg_.train.steps > 0 ? cfg_.train.steps : cfg_.train.epochs * bpe;
    resume_or_init();
    if (leader_) write_file_atomic((fs::path(out_dir_) / "config.yaml").string(), config_to_yaml(cfg_));
    if (step_ >= total_steps_) return finish_complete_run();
    g_training = true;  // from here a signal finishes the step and writes a checkpoint
    if (watchdog_ && cfg_.strategy.continue_on_failure && failover_.restart)
        watchdog_->set_hang_handler([this](double idle_s) { continue_after_hang(idle_s); });
    struct HangHandlerOff {  // before this Run's members go
        Watchdog* watchdog;
        ~HangHandlerOff() {
            if (watchdog) watchdog->set_hang_handler(nullptr);
        }
    } off{watchdog_.get()};
    try {
        train_loop();
    } catch (const DeviceError& e) {
        continue_without(e);  // strategy.on_replica_failure: continue (returns only when it may not)
        throw;
    }
    g_training = false;
    if (pending_log_) log_train(pending_step_, pending_lr_);
    s_->strategy->synchronize();
    s_->train_loader->stop();
    write_summary(exit_code_ == kExitOk ? "completed" : "interrupted");
    if (exit_code_ == kExitOk) {
        char acc[40] = "";
        if (has_accuracy_) std::snprintf(acc, sizeof acc, "test accuracy %.4f, ", last_eval_.accuracy());
        std::fprintf(out_, "done: %lld steps, %stest loss %.4f, %.0f %s, %s; results in %s\n",
                     static_cast<long long>(step_), acc, last_eval_.loss(),
                     throughput(train_time_ > 0 ? samples_done_ / train_time_ : 0.0), throughput_unit(),
                     duration_str(now_s() - wall_start_).c_str(), out_dir_.c_str());
        // where the curves are, not the curves: drawing them costs seconds the run need not spend
        if (leader_) std::fprintf(out_, "curves: mirrored report %s\n", out_dir_.c_str());
    }
    return exit_code_;
}

// Resumed a finished run: nothing to train. Its summary is shown; if the run was killed between
// its final checkpoint and its summary, the summary is written now from the recorded metrics
// (evaluating only if the final evaluation never made it to metrics.jsonl).
int Run::finish_complete_run() {
    std::fprintf(out_,
                 "the run is already complete (step %lld of %lld); set checkpoint.resume: never to train it again\n",
                 static_cast<long long>(step_), static_cast<long long>(total_steps_));
    const json done = completed_summary(out_dir_);
    if (done.is_object() && done.contains("steps") && done["steps"].is_number_integer() &&
        done["steps"].get<int64_t>() == step_) {
        std::fprintf(out_, "%s\n", done.dump(2, ' ', false, json::error_handler_t::replace).c_str());
        return kExitOk;
    }
    if (last_eval_step_ != step_) evaluate(step_, double(step_) / double(s_->train_loader->batches_per_epoch()));
    write_summary("completed");
    std::fprintf(out_, "wrote the missing %s/summary.json\n", out_dir_.c_str());
    return kExitOk;
}

// What ends this step: a stop (a signal on any node, or MIRRORED_TEST_STOP_AFTER_STEP), an evaluation,
// a checkpoint. Every node agrees on the stop and on a timed checkpoint (node 0's clock decides).
Run::AfterStep Run::after_step(const Loader& loader) {
    const bool epoch_end = loader.position().batch == 0;
    const int64_t epochs_done = loader.position().epoch;
    const bool last = step_ == total_steps_;
    AfterStep next;
    next.stop = g_signals.load() > 0 || step_ == stop_after_;
    bool time_due = leader_ && cfg_.checkpoint.every_minutes > 0 &&
                    now_s() - last_ckpt_time_ >= cfg_.checkpoint.every_minutes * 60.0;
    if (nodes_) {
        double flags[2] = {next.stop ? 1.0 : 0.0, time_due ? 1.0 : 0.0};
        nodes_->sum(flags, 2, "the per-step stop check");
        next.stop = flags[0] > 0;
        time_due = flags[1] > 0;
    }
    next.eval = (epoch_end && cfg_.train.eval_every_epochs > 0 && epochs_done % cfg_.train.eval_every_epochs == 0) ||
                (cfg_.train.eval_every_steps > 0 && step_ % cfg_.train.eval_every_steps == 0) || last;
    next.checkpoint =
        (cfg_.checkpoint.every_steps > 0 && step_ % cfg_.checkpoint.every_steps == 0) ||
        (epoch_end && cfg_.checkpoint.every_epochs > 0 && epochs_done % cfg_.checkpoint.every_epochs == 0) ||
        time_due || last || next.stop;
    return next;
}

void Run::flush_pending_log() {  // the previous log step's metrics, read after the next step was issued
    if (!pending_log_) return;
    log_train(pending_step_, pending_lr_);
    pending_log_ = false;
}

// Evaluation and saving, off the training clock (they are not training throughput).
void Run::pause_for(const AfterStep& next, double& loop_start) {
    if (!next.eval && !next.checkpoint) return;
    flush_pending_log();
    const double pause = now_s();
    train_time_ += pause - loop_start;
    if (next.eval) evaluate(step_, double(step_) / double(s_->train_loader->batches_per_epoch()));
    if (next.checkpoint) save_checkpoint(step_);
    if (watchdog_) watchdog_->phase("training", step_);
    loop_start = now_s();
    interval_excluded_ += loop_start - pause;
}

void Run::train_loop() {
    MirroredStrategy& st = *s_->strategy;
    Loader& loader = *s_->train_loader;
    const int64_t log_every = cfg_.train.log_every_steps;
    interval_start_ = now_s();
    interval_wait_ = loader.wait_seconds();
    double loop_start = now_s();
    last_ckpt_time_ = loop_start;
    if (watchdog_) watchdog_->phase("training", step_);
    while (step_ < total_steps_) {
        const Batch& batch = st.next_batch(loader);
        const int rows = batch.global_rows;  // the slot may be refilled once the replicas release it
        const float lr = float(learning_rate(cfg_.optimizer, step_, total_steps_, lr_replicas_));
        const bool log_now = (step_ + 1) % log_every == 0 || step_ + 1 == total_steps_;
        if (const auto [r, at] = test_replica_fault(); at == process_steps_ + 1 && r < st.replicas())
            st.test_inject_fault(r);
        st.train_step(batch, step_, lr, cfg_.run.seed, log_now);
        ++step_;
        if (++process_steps_ == 1 && failover_.continued) report_continued();
        if (watchdog_) watchdog_->tick(step_);
        ++interval_steps_;
        samples_done_ += rows;
        flush_pending_log();
        if (log_now) {
            st.request_train_metrics();
            pending_log_ = true;
            pending_step_ = step_;
            pending_lr_ = lr;
        }
        test_node_fault(nodes_, step_);
        const AfterStep next = after_step(loader);
        pause_for(next, loop_start);
        if (next.stop) {
            if (log_.tty()) std::fprintf(out_, "\n");
            std::fprintf(out_, "interrupted: checkpoint written at step %lld; run again to resume\n",
                         static_cast<long long>(step_));
            exit_code_ = kExitInterrupted;
            break;
        }
    }
}

}  // namespace

void install_signal_handlers() {
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    for (int sig : kInterruptSignals) {
        // A closed terminal or a dropped ssh session (SIGHUP) would end the run without a
        // checkpoint; under nohup (SIGHUP ignored) the run goes on, as asked. SIGUSR1 is what
        // mpirun forwards to every node (it ends the job on SIGINT/SIGTERM).
        struct sigaction now {};
        if (sig == SIGHUP && (sigaction(SIGHUP, nullptr, &now) != 0 || now.sa_handler == SIG_IGN)) continue;
        sigaction(sig, &sa, nullptr);
    }
}

namespace {

// Every node must train the same run: the configurations must match, the run folder too (node 0
// writes it; the others read the checkpoint to resume from in it, so it must be one folder on a
// file system every node shares). A mismatch is named by its first differing line.
void check_same_config(const Config& config, Nodes& nodes) {
    const std::string mine = config_to_yaml(config);
    const std::vector<std::string> all = nodes.all_gather(mine, "the exchange of the configurations");
    for (size_t k = 1; k < all.size(); ++k) {
        if (all[k] == all[0]) continue;
        std::istringstream a(all[0]), b(all[k]);
        std::string la, lb, section;
        while (std::getline(a, la) && std::getline(b, lb) && la == lb)
            if (!la.empty() && la[0] != ' ') section = la.substr(0, la.find(':'));
        throw ConfigError("node " + std::to_string(k) + "'s configuration differs from node 0's" +
                          (section.empty() ? std::string() : " in " + section) + ": '" + lb + "' instead of '" + la +
                          "': start every node with the same config, --set and --output options");
    }
}

// Every node must run the same build of mirrored on the same CUDA runtime, NCCL and MPI (NCCL
// ranks of different versions hang or fail in the first collective); other differences (the
// BLAS kernel, cuBLAS) cost only bit-identity with a one-node run, and node 0 says so.
void check_same_software(Nodes& nodes) {
    const SoftwareComparison c =
        compare_software(nodes.all_gather(software_fingerprint(), "the exchange of the software versions"));
    if (!c.refusal.empty()) throw ConfigError(c.refusal);
    if (nodes.leader())
        for (const std::string& note : c.notes)
            std::printf("note: %s: the job trains correctly, but not bit-identically to one node\n", note.c_str());
}

}  // namespace

int run_training(const Config& config, Nodes* nodes, std::FILE* progress, const Failover& failover) {
    g_signals = 0;
    (void)stop_after_step();  // the test hooks: a bad value fails now, not in the middle of the run
    (void)checkpoint_kill_hook();
    (void)test_replica_fault();
    if (nodes && config.strategy.continue_on_failure)
        config.fail("strategy.on_replica_failure",
                    "continue is for a run on one node: across nodes a failure stops every node within "
                    "strategy.collective_timeout_s (exit 5), and the job resumes on the nodes left (the same "
                    "global batch); set stop");
    test_node_fault(nullptr, -1);  // reads MIRRORED_TEST_NODE_FAULT (a malformed one is exit 2 here)
    if (nodes) {
        std::snprintf(g_node_stopped, sizeof g_node_stopped,
                      "\nerror: node %d (%.64s): stopped by mpirun (another node failed, or the job was interrupted); "
                      "rerun the job to resume from the last checkpoint\n",
                      nodes->rank(), nodes->host().c_str());
        nodes->set_timeout(config.strategy.collective_timeout_s);
        check_same_software(*nodes);
        check_same_config(config, *nodes);
        // Node 0 prints; the others' progress would only repeat it (errors still go to stderr).
        if (!nodes->leader()) {
            std::fflush(stdout);
            const int null = ::open("/dev/null", O_WRONLY);
            if (null >= 0) {
                ::dup2(null, 1);
                ::close(null);
            }
        }
    }
    Run run(config, nodes, progress, failover);
    return run.run();
}

namespace {

// A float32 array in NumPy's .npy format (version 1.0), where the user named it (base/output.h).
void write_npy(const OutputTarget& target, const std::vector<size_t>& shape, const float* data) {
    std::string dims;
    size_t count = 1;
    for (size_t d : shape) {
        dims += std::to_string(d) + ", ";
        count *= d;
    }
    std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + dims + "), }";
    while ((10 + header.size() + 1) % 64) header += ' ';
    header += '\n';
    std::string out = std::string("\x93NUMPY\x01\x00", 8);
    out += char(header.size() & 0xff);
    out += char(header.size() >> 8);
    out += header;
    out.append(reinterpret_cast<const char*>(data), count * sizeof(float));
    write_output(target, out);
}

}  // namespace

EvalResult evaluate_checkpoint(const Config& config, const std::string& checkpoint, const EvalDump& dump) {
    // a GPU that stops answering ends the evaluation as it ends a training run (exit 5), not in a
    // process that waits forever
    const auto watchdog =
        step_timeout_watchdog(config.strategy.step_timeout_s, "start-up (loading data, building the replicas)",
                              "the evaluation did not finish: run it again");
    auto s = make_session(config, nullptr, false);
    CheckpointData d;
    if (checkpoint.empty()) {  // the pretrained weights of model.init_from, as they are
        if (watchdog) watchdog->phase("loading the weights of model.init_from", 0);
        s->strategy->init_and_broadcast();
        load_pretrained(*s);
    } else {
        d = read_checkpoint(checkpoint, *s->model, model_config_hash(s->cfg), model_config_summary(s->cfg));
        if (watchdog) watchdog->phase("loading the checkpoint onto the replicas", 0);
        s->strategy->upload_state(d.params, d.optimizer);
    }
    if (watchdog) watchdog->phase("the evaluation", 0);
    const Metrics m = s->strategy->evaluate(*s->test_loader);
    if (watchdog) watchdog->phase("writing --dump-inputs / --dump-logits", 0);
    if (!dump.inputs.empty() || !dump.logits.empty()) {
        const Dataset& test = s->data->test;
        const size_t n = dump.limit ? std::min(dump.limit, test.count()) : test.count();
        std::vector<size_t> shape{n};
        for (int dim : test.shape) shape.push_back(size_t(dim));
        std::vector<float> scratch;
        const float* inputs = first_features(test, n, scratch);
        if (!dump.inputs.empty())
            write_npy({"--dump-inputs", dump.inputs, dump.force, {{"the checkpoint", checkpoint}}}, shape, inputs);
        if (!dump.logits.empty()) {
            const auto logits = s->strategy->predict(inputs, n);
            write_npy({"--dump-logits", dump.logits, dump.force, {{"the checkpoint", checkpoint}}},
                      {n, size_t(s->model->output_features())}, logits.data());
        }
    }
    return {m.loss(), m.accuracy(), size_t(m.count), d.step};
}

}  // namespace mirrored
