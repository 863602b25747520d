// What a run records: the training log line and record, evaluations, checkpoints and the
// summary with its device hours.
#include <algorithm>
#include <cstring>
#include <filesystem>

#include "base/io.h"
#include "base/output.h"
#include "kernels/blas.h"
#include "mirrored/resume.h"
#include "mirrored/software.h"
#include "mirrored/training_run.h"
#include "mirrored/util.h"

namespace mirrored {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// A finite-parameters check before anything is saved: a NaN must never overwrite good state.
bool all_finite(const std::vector<float>& v) {
    for (float x : v)
        if (!std::isfinite(x)) return false;
    return true;
}

}  // namespace

void TrainingRun::check_loss_finite(double loss, int64_t step, float lr) const {
    if (std::isfinite(loss)) return;
    throw Error(
        kExitDiverged,
        "training diverged: the loss is " + std::to_string(loss) + " at step " + std::to_string(step) + " (lr " +
            std::to_string(lr) + "); lower optimizer.lr or set optimizer.grad_clip_norm" +
            (last_ckpt_step_ >= 0 ? "; the last checkpoint is at step " + std::to_string(last_ckpt_step_) : ""));
}

void TrainingRun::alert_bottlenecks(double f_data, double f_comm, double interval) {
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

void TrainingRun::log_train(int64_t step, float lr) {
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

void TrainingRun::evaluate(int64_t step, double epoch) {
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

void TrainingRun::save_checkpoint(int64_t step) {
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

TrainingRun::ProcessHours TrainingRun::process_hours() const {
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

void TrainingRun::write_summary(const std::string& status) {
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

}  // namespace mirrored
