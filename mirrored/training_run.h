// The pieces of one training run (mirrored/trainer.h's run_training), shared by the files that
// hold them: trainer.cpp (start, the step loop, stop), run_resume.cpp (a fresh start, a resume, a
// continuation on fewer devices) and run_records.cpp (the log, evaluations, checkpoints, the
// summary). Not for use outside those.
#pragma once

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "mirrored/bottlenecks.h"
#include "mirrored/checkpoint.h"
#include "mirrored/loss.h"
#include "mirrored/run_dir.h"
#include "mirrored/run_log.h"
#include "mirrored/session.h"
#include "mirrored/trainer.h"
#include "mirrored/watchdog.h"

namespace mirrored {

// A SIGINT/SIGTERM/SIGUSR1 has asked the run to stop after this step.
bool stop_requested();
// Test hook: behave as if SIGINT arrived during this step (exercises the interrupt path exactly).
int64_t stop_after_step();

class TrainingRun {
    using json = nlohmann::json;

public:
    TrainingRun(const Config& config, Nodes* nodes, std::FILE* progress, const Failover& failover);

    int run();

private:
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

}  // namespace mirrored
