#include "mirrored/trainer.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <sstream>

#include "base/env.h"
#include "base/error.h"
#include "base/io.h"
#include "base/output.h"
#include "base/signals.h"
#include "data/datasets.h"
#include "mirrored/resume.h"
#include "mirrored/run_dir.h"
#include "mirrored/run_header.h"
#include "mirrored/software.h"
#include "mirrored/training_run.h"
#include "mirrored/util.h"

namespace mirrored {

namespace fs = std::filesystem;
using json = nlohmann::json;

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

}  // namespace

bool stop_requested() { return g_signals.load() > 0; }

int64_t stop_after_step() { return env_integer("MIRRORED_TEST_STOP_AFTER_STEP", -1, 0, int64_t(1) << 62); }

TrainingRun::TrainingRun(const Config& config, Nodes* nodes, std::FILE* progress, const Failover& failover)
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

int TrainingRun::run() {
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
    print_run_header(out_, *s_, nodes_, out_dir_, failover_.continued ? failover_.continued->failed : std::string());
    const int64_t bpe = s_->train_loader->batches_per_epoch();
    total_steps_ = cfg_.train.steps > 0 ? cfg_.train.steps : cfg_.train.epochs * bpe;
    resume_or_init();
    if (leader_) {
        write_file_atomic((fs::path(out_dir_) / "config.yaml").string(), config_to_yaml(cfg_));
        if (s_->model->reads_token_ids()) keep_tokenizer(effective_data_root(cfg_.data, cfg_.base_dir), out_dir_);
    }
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
int TrainingRun::finish_complete_run() {
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
TrainingRun::AfterStep TrainingRun::after_step(const Loader& loader) {
    const bool epoch_end = loader.position().batch == 0;
    const int64_t epochs_done = loader.position().epoch;
    const bool last = step_ == total_steps_;
    AfterStep next;
    next.stop = stop_requested() || step_ == stop_after_;
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

void TrainingRun::flush_pending_log() {  // the previous log step's metrics, read after the next step was issued
    if (!pending_log_) return;
    log_train(pending_step_, pending_lr_);
    pending_log_ = false;
}

// Evaluation and saving, off the training clock (they are not training throughput).
void TrainingRun::pause_for(const AfterStep& next, double& loop_start) {
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

void TrainingRun::train_loop() {
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
    TrainingRun run(config, nodes, progress, failover);
    return run.run();
}

}  // namespace mirrored
