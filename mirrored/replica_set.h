// The replicas of one node and what they share: their devices (strategy.devices), the memory plan
// checked before anything is allocated, each replica's buffers and events, the replica threads,
// staging a batch's shard onto a replica, and the failure rule - a device error anywhere stops
// every replica. The training step (training_step.h) and the replicas' state (replica_state.h)
// work on a ReplicaSet; MirroredStrategy (strategy.h) puts the three together.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/error.h"
#include "data/loader.h"
#include "kernels/buffer.h"
#include "kernels/device.h"
#include "mirrored/memory_plan.h"
#include "mirrored/model.h"
#include "mirrored/nodes.h"
#include "mirrored/optimizer.h"
#include "mirrored/replica_sync.h"
#include "mirrored/replica_threads.h"
#include "mirrored/strategy_config.h"

namespace mirrored {

struct Metrics {
    double loss_sum = 0, correct = 0, count = 0;
    void add(const double* slots) {  // one replica's [kMetricSlots] sums
        loss_sum += slots[kMetricLossSum];
        correct += slots[kMetricCorrect];
        count += slots[kMetricCount];
    }
    double loss() const { return count ? loss_sum / count : 0.0; }
    double accuracy() const { return count ? correct / count : 0.0; }
};

struct TimeSplit {
    double data_wait_s = 0, compute_s = 0, comm_s = 0;  // comm: not hidden behind compute
    double device_step_s = 0;  // GPUs: one sampled step's device time, start of compute to update
};

// What the host issued per replica, and the barriers it crossed, over some steps.
struct StepWork {
    HostWork device;        // replica 0's device calls
    HostWork all;           // every replica's device calls, summed
    uint64_t barriers = 0;  // arrive_and_wait calls per replica
};

struct Replica {
    int index = 0;
    std::unique_ptr<Device> device;
    DeviceBuffer<float> params;                        // [flat_size]
    DeviceBuffer<float> grads;                         // [flat_size], or staged (ReplicaSet::grad_at)
    DeviceBuffer<float> owned_grads;                   // shard: gradients - the own chunks' sums
    DeviceBuffer<unsigned char> weights;               // [trainable] compute copy in the activation type (bf16, fp16)
    std::unique_ptr<Optimizer> optimizer;              // state in the trainable layout
    Activations acts;                                  // [max micro-batch rows, ...]
    DeviceBuffer<float> inputs[2];                     // [shard rows, features], double-buffered
    DeviceBuffer<unsigned char> inputs_act;            // [shard rows, features] in the activation type (bf16, fp16)
    DeviceBuffer<unsigned char> labels[2];             // [shard rows] class indexes or [shard rows, outputs] targets
    DeviceBuffer<double> train_metrics, eval_metrics;  // [kMetricSlots]
    DeviceBuffer<float> grad_stats;                    // [2]: squared norm, non-finite count
    DeviceBuffer<float> grad_total;  // [2]: shared: grad_stats of every slice, summed; sharded: one range's
    DeviceBuffer<float> loss_scale;  // [2]: scale, good steps in a row (fp16)
    DeviceBuffer<float> stats;       // synchronised batch statistics (model.stats_floats())
    std::unique_ptr<StatsSync> sync;
    DeviceBuffer<uint64_t> checksums;            // [tensors + 1]: per tensor, then whole buffer
    HostBuffer<double> metrics_host, eval_host;  // [kMetricSlots], pinned
    HostBuffer<float> loss_scale_host;           // [2], copied with the metrics
    HostBuffer<uint64_t> checksums_host;
    Event input_ready[2], input_free[2], bucket_ready, reduced, metrics_copied, stats_ready, stats_done;
    // A hang's trail (ReplicaSet::inputs_consumed, lagging_device): an event recorded as each of
    // the last kTrail uses of the inputs ends, with the use's number (-1: not yet), read by the
    // watchdog's thread. Longer than the host can run ahead of a stopped device (the loader's
    // slots), so the use the device stopped in is still among them.
    static constexpr int kTrail = 16;
    Event trail[kTrail];
    std::atomic<int64_t> trail_use[kTrail];
    int64_t input_uses = 0;
    Event t_begin, t_backward, t_reduced, t_end;  // timing, sampled steps only
    Event t_gather, t_gathered;                   // and, sharded, the all-gather's span
    std::vector<Event> slot_free;                 // shard: gradients - per staging slot, its bucket reduced
    std::vector<char> slot_used;                  // and whether the step has used it yet (host)
    DeviceBuffer<StepValues> step_values[2];      // cuda_graph: this step's values, with inputs[b]
    // cuda_graph: step_ready - staged, the launch may start; graph_done - replica 0: the launched
    // graph has ended; the others: their part has ended (the join inside the capture)
    Event step_ready, graph_done;
    int next_buffer = 0;
    double compute_s = 0, comm_s = 0;  // host-measured (CPU replicas)
    // CPU replicas: the kernels' per-thread scratch its thread grew while it ran this replica (the
    // plan's workspace), which the measured memory counts with its allocations; scratch_base is
    // what the thread held before (replica 0 runs on the caller's thread)
    uint64_t scratch_bytes = 0, scratch_base = 0;
    // What the replica has held at most: its device's allocations and its kernels' scratch.
    uint64_t peak_memory_bytes() const { return device->peak_allocated_bytes() + scratch_bytes; }
    ~Replica();
};

// After a device failure every method throws this at once: the replicas cannot be trusted.
struct StrategyFailed : DeviceError {
    StrategyFailed() : DeviceError("the replicas stopped after a device failure (the first error was reported)") {}
};

class ReplicaSet {
public:
    static constexpr float kInitialLossScale = 65536.0f;  // fp16: 2^16, as PyTorch's GradScaler

    // Parses the devices, checks the batch and the memory plan, and builds every replica (its
    // device calls in a fixed order, which the simulated device's fault tests count). nodes: the
    // other nodes of a multi-node run (nullptr: this node alone). label_bytes: one sample's
    // label on the device. batches: the global rows of every batch the run computes (full ones and
    // the partial last ones of an epoch and of evaluation), for the memory plan; empty where they
    // are not known (any count up to global_batch).
    ReplicaSet(const StrategyConfig& cfg, const Model& model, const OptimizerConfig& opt, int global_batch,
               int accumulation_steps, Nodes* nodes, size_t label_bytes, const std::vector<int>& batches = {});
    ~ReplicaSet();

    int replicas() const { return int(replicas_.size()); }          // on this node
    int all_replicas() const { return replicas() * node_count(); }  // in the job
    int first_replica() const { return node_rank() * replicas(); }  // this node's first, in the job
    int node_count() const { return nodes_ ? nodes_->count() : 1; }
    int node_rank() const { return nodes_ ? nodes_->rank() : 0; }
    Nodes* nodes() const { return nodes_; }
    // The strategy section as it runs: `auto`'s op choice is written back into it.
    StrategyConfig& config() { return cfg_; }
    const StrategyConfig& config() const { return cfg_; }
    const Model& model() const { return model_; }
    const DeviceList& devices() const { return devices_; }
    const DeviceTraits& traits() const { return devices_.traits(); }
    int accumulation() const { return accumulation_; }
    bool shared() const { return shared_; }  // one parameter copy (shared_parameters)
    // strategy.shard: optimizer, on replicas that keep their own parameter copies: each keeps the
    // optimizer state of owned_ranges() only.
    bool sharded() const { return sharded_; }
    // strategy.shard: gradients, with more than one replica on this node: gradients are staged
    // (GradientStaging) and each replica keeps only its own chunks' sums (Replica::owned_grads).
    bool staged() const { return staged_; }
    const GradientStaging& staging() const { return staging_; }
    // Where a gradient of the flat layout lies in R's gradient buffer, and that buffer's size.
    float* grad_at(Replica& R, size_t offset) const { return R.grads.data() + grad_index(offset); }
    size_t grad_index(size_t offset) const { return staged_ ? staging_.index(offset) : offset; }
    size_t grad_elements() const { return staged_ ? staging_.buffer : model_.grad_size(); }
    const std::vector<Bucket>& buckets() const { return buckets_; }  // the gradients' buckets
    bool low_precision() const { return low_precision_; }            // bf16/fp16 activations and weight copies
    bool loss_scaling() const { return loss_scaling_; }              // fp16
    size_t label_bytes() const { return label_bytes_; }
    Replica& replica(int r) { return *replicas_[size_t(r)]; }
    const std::vector<std::unique_ptr<Replica>>& members() { return replicas_; }
    const Replica& replica(int r) const { return *replicas_[size_t(r)]; }
    // Shared parameters: the replica that holds the parameters, 16-bit weights and optimizer state
    // R computes with (replica 0); otherwise R itself.
    Replica& holder(Replica& R) { return shared_ ? *replicas_[0] : R; }
    std::vector<Device*> device_list() const;
    const std::vector<float*>& grad_ptrs() const { return grad_ptrs_; }  // every replica's gradients
    ReplicaThreads& threads() { return *threads_; }
    const MemoryPlan& memory_plan() const { return plan_; }  // per replica
    uint64_t peak_memory_bytes() const;
    // The mean over this node's replicas of each one's peak (CPU replicas: their kernels' scratch
    // included): what the plan's per-replica figure predicts, one parameter copy counted in shares.
    uint64_t memory_per_replica_bytes() const;
    StepWork host_work() const;
    std::string topology_report() const;  // peer access / host path notes, one line per note
    HostAllocator host_allocator();       // pinned when replicas are GPUs
    bool gathers_input() const { return !traits().asynchronous; }

    // ---- failure: a device error anywhere stops every replica ---------------------------------
    bool failed() const { return failed_; }
    // Runs fn; any exception marks the set failed (on_failure's hooks run, devices abandoned).
    template <typename F>
    auto guarded(F&& fn) -> decltype(fn()) {
        if (failed_) throw StrategyFailed();
        try {
            return fn();
        } catch (...) {
            fail();
            throw;
        }
    }
    void fail() noexcept;
    // After s's work so far (this replica's forward and backward of buffer buf): the buffer is free.
    void inputs_consumed(Replica& R, int buf, Stream s);
    // A hang's device: the one whose replicas' oldest unconsumed inputs are older than every other
    // replica's (its own step stopped; the others wait for it), or one whose query fails; "" when
    // the replicas do not single one device out (all idle, or all stopped at the same point).
    // Never blocks; safe from another thread while the host is stuck in a wait.
    std::string lagging_device() const;
    // What must stop when a device fails besides the devices (the collectives: they abort).
    void on_failure(std::function<void()> hook) { failure_hooks_.push_back(std::move(hook)); }
    void forget_failure_hooks() { failure_hooks_.clear(); }  // their owner is going
    // The host waits until every device is idle, polling all of them, so that a failure on any
    // device surfaces as its own error instead of a hang on a healthy one waiting for it.
    void synchronize();
    void wait_until(const std::function<bool()>& done);  // polls done(), checking every device
    // For teardown (never throws): waits for the devices unless something failed.
    bool shutdown() noexcept;

    // ---- a batch onto the replicas ----------------------------------------------------------------
    // The loader's next batch, checking every device while it waits.
    const Batch& next_batch(Loader& loader);
    // Replica r's shard of the global batch (rows of the job's batch) and where it lies in this
    // node's part of it.
    Shard global_shard(const Batch& batch, int r) const {
        return shard_of(batch.global_rows, all_replicas(), first_replica() + r);
    }
    static Shard local_shard(const Batch& batch, const Shard& global) {
        return {global.begin - batch.first_row, global.rows};
    }
    // The shard's rows and labels into R's next input buffer on its copy stream; returns the
    // buffer. values: also copies the step's values into the buffer's step_values (cuda_graph).
    int stage_input(Replica& R, const Batch& batch, const Shard& shard, const StepValues* values = nullptr);
    // The staged inputs as the model reads them: f32, or converted to the activation type.
    const void* stage_for_compute(Replica& R, int buf, size_t rows);
    size_t input_row_bytes(const Replica& R) const;  // of stage_for_compute's rows
    const void* labels_at(const Replica& R, int buf, int row) const {
        return R.labels[buf].data() + size_t(row) * label_bytes_;
    }
    Pass make_pass(Replica& R, Stream s, int rows, int global_rows, int64_t row_offset, uint64_t seed, uint32_t step,
                   bool training, const StepValues* values = nullptr);
    // After the parameters change (init, restore, optimizer step): the compute copy follows.
    void refresh_weights(Replica& R, Stream s, bool all = false);  // all: the frozen tensors too
    // Rows of micro-batch m summed over every replica's shard (synchronised statistics).
    int global_micro_rows(int global_rows, int m) const;
    // A replica's [kMetricSlots] accumulators cleared, on s.
    static void zero_metrics(Device& d, Stream s, double* metrics);
    // Multi-node: metrics summed over every node's replicas (a collective; `what` names it).
    void sum_over_nodes(Metrics& m, const char* what) const;

private:
    // The global batch against all replicas of the job and the accumulation steps: ConfigError
    // if they do not fit.
    void check_batch(int global_batch, int all) const;
    void check_device_memory(const OptimizerConfig& opt, int shard_rows, int micro_rows) const;
    void build_replica(int r, int shard_rows, int micro_rows, const OptimizerConfig& opt);
    void allocate_model_state(Replica& R, const OptimizerConfig& opt, int micro_rows);
    void allocate_inputs(Replica& R, int shard_rows);
    void allocate_step_state(Replica& R);
    void create_step_events(Replica& R);

    StrategyConfig cfg_;
    const Model& model_;
    Nodes* nodes_ = nullptr;
    DeviceList devices_;
    int accumulation_ = 1;
    size_t label_bytes_ = sizeof(int32_t);
    bool shared_ = false;
    bool sharded_ = false;
    bool staged_ = false;
    std::vector<Bucket> buckets_;
    GradientStaging staging_;
    bool low_precision_ = false;
    bool convert_inputs_ = false;  // low precision, and inputs that are values (not token ids)
    bool loss_scaling_ = false;
    MemoryPlan plan_;
    std::vector<int> rows_met_;  // micro_batch_rows of the run's batches (empty: not known)
    std::vector<StagedPair> staged_pairs_;
    std::vector<std::unique_ptr<Replica>> replicas_;
    std::unique_ptr<ReplicaThreads> threads_;  // after the replicas: stopped before they go
    std::vector<float*> grad_ptrs_;
    std::vector<std::function<void()>> failure_hooks_;
    bool failed_ = false;
};

}  // namespace mirrored
