// strategy: how the replicas are laid out and how they exchange gradients (the config section,
// read by config.cpp; used by the strategy and the tools).
#pragma once

#include <string>

#include "kernels/device.h"

namespace mirrored {

struct StrategyConfig {
    std::string devices = "auto";
    std::string cross_device_ops = "ring";  // or "auto": measured at start-up
    // auto, resuming: the op the checkpoint was written with (not a config key; the trainer reads
    // it). Kept when these devices can run it: a resume then sums in the order of the run it continues.
    std::string resume_cross_device_ops;
    double bucket_mb = 4.0;                 // 0: one all-reduce after backward
    int verify_every_steps = 0;             // 0: off
    Precision precision = Precision::fp32;  // train.precision, applied to every device
    int loss_scale_growth_interval = 2000;  // fp16
    DType allreduce_dtype = DType::f32;     // gradients on the links: f32 or bf16
    double collective_timeout_s = 600;      // multi-node: a collective waiting longer aborts the job
    double step_timeout_s = 1800;  // no step (evaluation, checkpoint) finished for this long: a hang, exit 5; 0: off
    // Replicas in one memory - CPU replicas, or replicas sharing one GPU (cuda:0,0,0,0) on one
    // node - keep one parameter copy (and optimizer state) that every replica reads; after
    // backward each replica sums its slice of the gradients over all replicas and updates that
    // slice - no all-gather, the update done once. Replicas on distinct GPUs keep their copies.
    bool shared_parameters = false;
    // What the replicas keep only their own share of (ZeRO): none, or optimizer - each replica
    // holds the optimizer state of its chunk of every gradient bucket; the all-reduce becomes
    // reduce-scatter -> update of the own chunks -> all-gather of the parameters. Replicas that
    // share one parameter copy already hold one optimizer state between them.
    // gradients (ZeRO-2): each also keeps the summed gradients of its own chunks only; backward
    // writes each bucket into a reused staging slot and every micro-batch reduce-scatters it.
    enum class Shard { none, optimizer, gradients };
    Shard shard = Shard::none;
    // GPU replicas (CUDA, simulated): each step shape's work - every replica's forward, backward,
    // bucketed all-reduce and update - is captured once as one graph and replayed with one launch;
    // what changes per step (learning rate, step counters, the input buffer) is in device memory.
    // Off by default until it has run on a GPU. Not with the simulated NCCL.
    bool cuda_graph = false;
    // CUDA: a dense layer's bias and ReLU fused into its forward GEMM and its bias gradient into
    // the weight-gradient GEMM (cuBLASLt epilogues), one launch instead of two each. Off by
    // default until it has run on a GPU. CPU replicas run the ops unfused; simulated GPUs count
    // the fused cases as one launch, as CUDA does.
    bool fused_epilogues = false;
    // strategy.on_replica_failure: continue - a device's fault sets it aside and the run goes on
    // from the last checkpoint on the others, with the same global batch (mirrored/failover.h),
    // while at least min_replicas can; stop (false) - the run stops, exit 5.
    bool continue_on_failure = false;
    int min_replicas = 1;
    bool operator==(const StrategyConfig&) const = default;
};

inline const char* shard_name(StrategyConfig::Shard s) {
    return s == StrategyConfig::Shard::gradients   ? "gradients"
           : s == StrategyConfig::Shard::optimizer ? "optimizer"
                                                   : "none";
}

}  // namespace mirrored
