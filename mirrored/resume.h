// Resuming a run from a checkpoint: which one (checkpoint.resume), whether this run can continue
// it, what would make the continuation differ from an uninterrupted run (each said, none an
// error), and the run folder put back to the checkpoint's step.
#pragma once

#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "mirrored/checkpoint.h"
#include "mirrored/config.h"
#include "mirrored/strategy.h"

namespace mirrored {

// cross_device_ops: auto, resuming: the op the checkpoint to resume from was written with, read
// from its header before anything is built, so that the strategy keeps it - a measurement could
// pick another op, which sums in another order, and the resume would not be bit-identical.
Config with_resume_hints(Config c);

// The newest usable checkpoint in ckpt_dir (checkpoint.resume: auto), the one named, or none
// (never). A corrupt one is skipped for the previous one; one of another model is an error.
// `used` is the file read; what it says goes to `out`, warnings to stderr.
std::optional<CheckpointData> find_checkpoint(const Config& cfg, const Model& model, const std::string& ckpt_dir,
                                              std::FILE* out, std::string& used);

// Throws when this run cannot continue the checkpoint at `path`: another seed, batch size or
// training-set size, a loader position outside an epoch, or a step beyond the run's total_steps.
// Other data of the same size only warns (train_data: this run's training-set fingerprint).
void check_checkpoint_fits(const CheckpointData& ckpt, const std::string& path, const Config& cfg, size_t train_samples,
                           uint64_t train_data, int64_t batches_per_epoch, int64_t total_steps);

// What makes this run continue correctly but not bit-identically: other replica counts, GEMM
// library, mirrored version or cross-device op than the checkpoint's. One note each.
std::vector<std::string> resume_notes(const CheckpointData& ckpt, const MirroredStrategy& st, const Config& cfg);

// On the checkpoint's GEMM library, the kernel it measured for each product's shape is used for
// that shape again (a measurement made afresh may pick another, which sums in another order); says
// how many on `out`.
void adopt_gemm_choices(const CheckpointData& ckpt, const MirroredStrategy& st, const Config& cfg, std::FILE* out);

// The GEMM library a checkpoint's rounding depends on: the BLAS kernel for CPU replicas (and the
// simulated GPUs, which run the CPU reference); on CUDA, whether cuBLASLt's fused epilogues ran.
std::string gemm_library(const MirroredStrategy& st, const Config& cfg);

// Checkpoints of later steps than `step` are not this run's past: one auto-resume skipped as
// unusable, or another timeline's (a resume from an older, named checkpoint). They move aside with
// the metrics up to them, so that pruning never weighs them against this run's own and a later
// auto-resume never returns to them. Returns the note to print ("" when none moved).
std::string set_aside_later_checkpoints(const std::string& out_dir, const std::string& ckpt_dir, int64_t step);

// metrics.jsonl's records of the steps the checkpoint covers (later lines are replayed by training
// again), rewritten when `write`, and the last train and eval records, so that a summary written
// without further training still has them.
struct RecoveredMetrics {
    Metrics train, eval;
    int64_t eval_step = -1;
    // the newest record's step since the last resume record, dropped ones included: the steps redone
    int64_t last_logged_step = -1;
    // The run's history, kept whatever its step: its replica failures (alerts of that kind, each
    // with after_fault_s from the continuation's "continued" record where there is one).
    nlohmann::json failures = nlohmann::json::array();
};
RecoveredMetrics recover_metrics(const std::string& out_dir, int64_t up_to_step, bool write);

}  // namespace mirrored
