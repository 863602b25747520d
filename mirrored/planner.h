// The performance and memory model behind `mirrored plan` and the predictions `mirrored scale`
// prints beside its measurements (docs/SCALING.md):
//
//   ring all-reduce of S bytes over n replicas   t = 2(n-1)/n * S / B + 2(n-1) * alpha
//   step                                         compute + the all-reduce time not hidden
//                                                behind backward
//   K nodes of n GPUs (hierarchical, as mirrored runs it): the node's ring all-reduce, each GPU's
//   1/n slice all-reduced between the nodes (the n slices share the node's network: B_net is the
//   node's), then the node's all-gather of the slices:
//     t = ring(n, S) + 2(K-1)/K * S / B_net + 2(K-1) * alpha_net + (n-1)/n * S / B + (n-1) * alpha
//
// B is the link's bus bandwidth (nccl-tests' busbw), alpha the latency of one ring step. Each
// bucket's all-reduce starts when backward has produced it (backward runs the layers in reverse,
// each taking its share of the backward FLOPs) and the buckets queue on the comm stream; what
// runs past the end of backward is exposed. Synchronised batchnorm adds two small blocking
// all-reduces per layer.
#pragma once

#include <string>
#include <vector>

#include "kernels/device.h"
#include "mirrored/model.h"
#include "mirrored/optimizer.h"
#include "mirrored/strategy.h"

namespace mirrored {

struct LinkModel {
    double bus_bytes_per_s = 0;
    double step_latency_s = 0;
};

double ring_allreduce_seconds(int n, double bytes, const LinkModel& link);

// Where the replicas are: n per node over `local`, K nodes joined by `net` (the node's network).
struct Topology {
    int per_node = 1, nodes = 1;
    LinkModel local, net;
};
double allreduce_seconds(const Topology& t, double bytes);

// One gradient bucket: its bytes on the wire, and the fraction of backward done when it is ready.
struct BucketTiming {
    double bytes = 0;
    double ready = 1;
};

struct CommPlan {
    std::vector<BucketTiming> buckets;
    double wire_bytes = 0;            // per step, all buckets
    int blocking_allreduces = 0;      // synchronised batchnorm: two per layer per step
    double blocking_bytes = 0;        // each
    double backward_share = 2.0 / 3;  // of a step's compute, by FLOPs
};
CommPlan comm_plan(const Model& model, const StrategyConfig& strategy);

struct StepPrediction {
    double compute_s = 0;    // one replica's forward, backward and update
    double allreduce_s = 0;  // every all-reduce of the step, end to end
    double exposed_s = 0;    // the part not hidden behind backward
    double step_s = 0;
};
// sharded (strategy.shard optimizer): each bucket's reduce-scatter in the node (half its ring
// all-reduce) and its chunk's sum over the nodes overlap backward as the all-reduce would; the
// node's all-gather of the updated parameters (the other half) and the gradient norm's two-float
// sum follow, exposed whole. scatters: the micro-batches whose gradients are each reduce-scattered
// (strategy.shard gradients: the accumulation steps; else 1) - an earlier micro-batch's hides
// behind that micro-batch's backward where it can.
StepPrediction predict_step(const Topology& t, double compute_s, const CommPlan& comm, bool sharded = false,
                            int scatters = 1);
inline StepPrediction predict_step(int n, double compute_s, const CommPlan& comm, const LinkModel& link) {
    return predict_step(Topology{n, 1, link, {}}, compute_s, comm);
}

// Memory of one replica on a GPU at `rows` per replica, and the largest per-replica batch that
// fits in `capacity_bytes` (0 when not even one row fits).
MemoryPlan gpu_memory_plan(const Model& model, const OptimizerConfig& opt, const StrategyConfig& strategy, int replicas,
                           int rows, int accumulation);
int largest_fitting_rows(const Model& model, const OptimizerConfig& opt, const StrategyConfig& strategy, int replicas,
                         int accumulation, uint64_t capacity_bytes);

// The planning checklist's total cost of a run: GPU hours x price, the part of it spent waiting on
// communication, and the expected rework after failures. First order: the job fails at 1/MTBF
// (any GPU failing stops it), each failure loses half a checkpoint interval and a restart, and
// each checkpoint costs its write; the expected wall time W then solves
//   W = (work + checkpoints) + (W / MTBF) x (interval / 2 + restart).
struct CostInputs {
    double work_s = 0;              // the run's steps x the step time: no failures, no checkpoints
    double exposed_comm_share = 0;  // of the step time: communication not hidden behind compute
    int gpus = 1;
    double price_per_gpu_hour = 0;
    double job_mtbf_s = 0;                                                    // 0: no failures
    double checkpoint_interval_s = 0, checkpoint_write_s = 0, restart_s = 0;  // interval 0: none
};
struct CostEstimate {
    double wall_s = 0, checkpoint_s = 0, rework_s = 0;  // expected; wall = work + checkpoint + rework
    double expected_failures = 0;
    double gpu_hours = 0, cost = 0, comm_cost = 0, checkpoint_cost = 0, rework_cost = 0;
    double young_daly_s = 0;  // sqrt(2 x write x MTBF): the interval that minimises the expected wall time
    bool finishes = true;     // false: a failure comes sooner, on average, than an interval's work is kept
};
CostEstimate estimate_cost(const CostInputs& in);

// The link between replicas of a device list, measured: alpha from a 4 KiB all-reduce, B from one
// of `bytes` (on CPU replicas B is the memory system's - caches make it depend on the size, so
// calibrate at the size that matters - and alpha is the replica barrier's).
LinkModel measure_link(const std::string& devices, const std::string& op, DType wire, size_t bytes = size_t(64) << 20);
// The measured time of one all-reduce of `bytes` (median of a few) on a device list.
double measure_allreduce_seconds(const std::string& devices, const std::string& op, DType wire, size_t bytes);

// The compute time per sample of a profile measured on the target GPU: scaling.json (`scale`)
// or bench-step --json, as text; its one-replica point (step_ms over global_batch). `source`
// names it in errors. Anything else - not JSON, fields of the wrong type, a time or batch that
// is no measurement (not finite, <= 0, absurdly large) - is a ConfigError saying what.
double profile_seconds_per_sample(const std::string& json_text, const std::string& source);

}  // namespace mirrored
