// A run's start: the output folder, a fresh start or a resume from a checkpoint, and the
// continuation on the surviving devices after one failed (strategy.on_replica_failure).
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "base/output.h"
#include "mirrored/failover.h"
#include "mirrored/resume.h"
#include "mirrored/training_run.h"
#include "mirrored/util.h"

namespace mirrored {

namespace fs = std::filesystem;
using json = nlohmann::json;

bool TrainingRun::prepare_output() {
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

void TrainingRun::resume_or_init() {
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
void TrainingRun::init_weights() {
    s_->strategy->init_and_broadcast();
    if (!cfg_.model.init_from.empty()) {
        std::fprintf(out_, "  weights from %s\n", cfg_.model.init_from.c_str());
        load_pretrained_weights(*s_);
    }
}

// A continuation after a device failed before the run's first checkpoint: from step 0 on the
// survivors, the run folder kept (its metrics hold the failure).
void TrainingRun::continue_from_start() {
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
void TrainingRun::start_fresh() {
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

void TrainingRun::resume_from(const CheckpointData& ckpt, const std::string& path) {
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
void TrainingRun::continue_without(const DeviceError& e, bool from_watchdog) {
    if (!cfg_.strategy.continue_on_failure || !failover_.restart || e.device().empty() || !leader_ ||
        stop_requested())  // asked to stop: it stops
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
    if (stop_requested())                      // a stop asked for meanwhile: the new process would not know of it
        throw DeviceError(std::string(e.what()) + "; not continuing on " + next.devices + ": asked to stop");
    failover_.restart(next);
    throw DeviceError(std::string(e.what()) + "; strategy.on_replica_failure: continue: could not restart on " +
                      next.devices + ": " + std::strerror(errno));
}

// The watchdog's thread, after strategy.step_timeout_s without progress (the training thread is
// stuck in a wait): a hang that one device's replicas alone are behind in is that device's
// failure; anything else (every replica stopped at the same point, the input pipeline) ends the
// run as the watchdog always does.
void TrainingRun::continue_after_hang(double idle_s) {
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
void TrainingRun::report_continued() {
    s_->strategy->synchronize();  // completed, not only issued
    const double after = unix_time_s() - double(failover_.continued->fault_ms) / 1000;
    std::fprintf(out_, "continued without %s: step %lld done %.1f s after the fault\n",
                 failover_.continued->failed.c_str(), static_cast<long long>(step_), after);
    emit({{"type", "continued"}, {"step", step_}, {"device", failover_.continued->failed}, {"after_fault_s", after}});
    if (!failures_.empty()) failures_.back()["after_fault_s"] = after;
}

}  // namespace mirrored
