// MirroredStrategy: one process drives N replicas, each a full copy of the model on its own
// device, each computing on its contiguous shard of the global batch. Gradients are summed
// across replicas (the loss is the mean over the global batch, so the sum is the mean gradient)
// by the cross-device ops, in buckets that start while backward is still running; every replica
// then applies the same optimizer update, so the replicas stay bit-identical.
//
// A training step, per replica thread:
//   stage shard (async H2D on the copy stream) -> forward/backward on the compute stream,
//   each finished bucket handed to the comm stream by an event -> compute waits for comm ->
//   clip -> optimizer.
// Nothing in a step synchronises the host with a device or allocates.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "data/loader.h"
#include "kernels/buffer.h"
#include "kernels/device.h"
#include "base/error.h"
#include "mirrored/cross_device_ops.h"
#include "mirrored/loss.h"
#include "mirrored/model.h"
#include "mirrored/optimizer.h"
#include "mirrored/replica_sync.h"
#include "mirrored/replica_threads.h"

namespace mirrored {

class StepProfile;  // mirrored/step_profile.h

struct StrategyConfig {
    std::string devices = "auto";
    std::string cross_device_ops = "ring";  // or "auto": measured at start-up
    // auto, resuming: the op the checkpoint was written with (not a config key; the trainer reads
    // it). Kept when these devices can run it: a resume then sums in the order of the run it continues.
    std::string resume_cross_device_ops;
    double bucket_mb = 4.0;       // 0: one all-reduce after backward
    int verify_every_steps = 0;   // 0: off
    Precision precision = Precision::fp32;  // train.precision, applied to every device
    int loss_scale_growth_interval = 2000;  // fp16
    DType allreduce_dtype = DType::f32;     // gradients on the links: f32 or bf16
    double collective_timeout_s = 600;      // multi-node: a collective waiting longer aborts the job
    double step_timeout_s = 1800;           // no step (evaluation, checkpoint) finished for this long: a hang, exit 5; 0: off
    // Replicas in one memory - CPU replicas, or replicas sharing one GPU (cuda:0,0,0,0) on one
    // node - keep one parameter copy (and optimizer state) that every replica reads; after
    // backward each replica sums its slice of the gradients over all replicas and updates that
    // slice - no all-gather, the update done once. Replicas on distinct GPUs keep their copies.
    bool shared_parameters = false;
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
    bool operator==(const StrategyConfig&) const = default;
};

// A contiguous range of the flat gradient buffer, reduced as one unit.
struct Bucket {
    size_t begin = 0, end = 0;  // floats
    int ready_after_layer = 0;  // backward has produced all of it once this layer is done
};
// Buckets of about bucket_bytes in reverse layer order (0: one bucket for everything).
// The trainable region in buckets of about bucket_mb in reverse layer order (0: one bucket), then
// the state region (batch statistics) as a last bucket reduced after backward
// (ready_after_layer -1).
std::vector<Bucket> make_buckets(const Model& model, double bucket_mb);

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

// The memory one replica will allocate, by purpose, in bytes: checked against what the machine
// has before anything is allocated, and reported at start-up.
struct MemoryPlan {
    uint64_t params = 0, grads = 0, optimizer = 0, activations = 0, inputs = 0, workspace = 0;
    uint64_t weight_copy = 0;  // bf16/fp16: the weights in the activation type
    uint64_t wire = 0;         // allreduce_dtype bf16: the gradients' 16-bit copy
    uint64_t total() const {
        return params + grads + optimizer + activations + inputs + workspace + weight_copy + wire;
    }
    std::string describe() const;  // "params 1.2 MiB, grads ..., total ..."
};
// Whether strategy.shared_parameters applies to these devices: several CPU replicas, or several
// replicas of one GPU (one node).
bool parameters_shared(const StrategyConfig& strategy, const DeviceList& devices, bool several_nodes = false);
// shared: parameters_shared() for the devices (one copy, counted in shares).
// label_bytes: one sample's label on the device (loss.h's label_bytes).
MemoryPlan plan_memory(const Model& model, const OptimizerConfig& opt, const StrategyConfig& strategy,
                       const Backend& backend, int replicas, int shard_rows, int micro_rows, bool shared = false,
                       size_t label_bytes = sizeof(int32_t));

// What the host issued per replica, and the barriers it crossed, over some steps.
struct StepWork {
    HostWork device;        // replica 0's device calls
    HostWork all;           // every replica's device calls, summed
    uint64_t barriers = 0;  // arrive_and_wait calls per replica
};

struct Replica {
    int index = 0;
    std::unique_ptr<Device> device;
    DeviceBuffer<float> params, grads;          // [flat_size], identical layouts
    DeviceBuffer<unsigned char> weights;        // [trainable] compute copy in the activation type (bf16, fp16)
    std::unique_ptr<Optimizer> optimizer;       // state in the trainable layout
    Activations acts;                           // [max micro-batch rows, ...]
    DeviceBuffer<float> inputs[2];              // [shard rows, features], double-buffered
    DeviceBuffer<unsigned char> inputs_act;     // [shard rows, features] in the activation type (bf16, fp16)
    DeviceBuffer<unsigned char> labels[2];      // [shard rows] class indexes or [shard rows, outputs] targets
    DeviceBuffer<double> train_metrics, eval_metrics;  // [kMetricSlots]
    DeviceBuffer<float> grad_stats;             // [2]: squared norm, non-finite count
    DeviceBuffer<float> grad_total;             // [2]: shared parameters: grad_stats of every slice, summed
    DeviceBuffer<float> loss_scale;             // [2]: scale, good steps in a row (fp16)
    DeviceBuffer<float> stats;                  // synchronised batch statistics (model.stats_floats())
    std::unique_ptr<StatsSync> sync;
    DeviceBuffer<uint64_t> checksums;           // [tensors + 1]: per tensor, then whole buffer
    HostBuffer<double> metrics_host, eval_host;  // [kMetricSlots], pinned
    HostBuffer<float> loss_scale_host;          // [2], copied with the metrics
    HostBuffer<uint64_t> checksums_host;
    Event input_ready[2], input_free[2], bucket_ready, reduced, metrics_copied, stats_ready, stats_done;
    Event t_begin, t_backward, t_reduced, t_end;  // timing, sampled steps only
    DeviceBuffer<StepValues> step_values[2];    // cuda_graph: this step's values, with inputs[b]
    // cuda_graph: step_ready - staged, the launch may start; graph_done - replica 0: the launched
    // graph has ended; the others: their part has ended (the join inside the capture)
    Event step_ready, graph_done;
    int next_buffer = 0;
    double compute_s = 0, comm_s = 0;  // host-measured (CPU replicas)
    ~Replica();
};

// After a device failure every method throws this at once: the replicas cannot be trusted.
struct StrategyFailed : DeviceError {
    StrategyFailed() : DeviceError("the replicas stopped after a device failure (the first error was reported)") {}
};

class MirroredStrategy {
public:
    static constexpr float kInitialLossScale = 65536.0f;  // fp16: 2^16, as PyTorch's GradScaler

    // nodes: the other nodes of a multi-node run (nullptr: this node alone). Every node builds
    // the same number of replicas; node k's replica r is the job's replica k x replicas() + r.
    MirroredStrategy(const StrategyConfig& cfg, const Model& model, const OptimizerConfig& opt,
                     int global_batch, int accumulation_steps, Nodes* nodes = nullptr, const LossConfig& loss = {});
    ~MirroredStrategy();

    int replicas() const { return int(replicas_.size()); }  // on this node
    int all_replicas() const { return replicas() * node_count(); }  // in the job
    int first_replica() const { return node_rank() * replicas(); }  // this node's first, in the job
    int node_count() const { return nodes_ ? nodes_->count() : 1; }
    int node_rank() const { return nodes_ ? nodes_->rank() : 0; }
    Nodes* nodes() const { return nodes_; }
    const DeviceTraits& device_traits() const { return devices_.traits(); }
    const Backend& backend() const { return *devices_.backend; }
    bool failed() const { return failed_; }
    const DeviceList& devices() const { return devices_; }
    const char* cross_device_ops_name() const { return shared_ ? "shared" : ops_->name(); }
    // CPU replicas sharing one parameter copy (strategy.shared_parameters).
    bool shared_parameters() const { return shared_; }
    // Steps replayed from captured graphs (strategy.cuda_graph), and why graphs are off when the
    // config asked for them ("" otherwise).
    bool cuda_graph() const { return graphs_on_; }
    const std::string& cuda_graph_note() const { return graph_note_; }
    // How `auto` chose the ops ("auto, measured: ring 1.2 ms, direct 0.4 ms per step"); empty
    // when the config named them.
    const std::string& cross_device_ops_choice() const { return ops_choice_; }
    const std::vector<Bucket>& buckets() const { return buckets_; }
    const MemoryPlan& memory_plan() const { return plan_; }  // per replica
    // The most device memory any replica has held through its own allocations (measured).
    uint64_t peak_memory_bytes() const;
    const Model& model() const { return model_; }
    Replica& replica(int r) { return *replicas_[r]; }
    std::string topology_report() const;  // peer access / host path notes, one line per note
    // Memory the loader should assemble batches in (pinned when replicas are GPUs).
    HostAllocator host_allocator();
    // CPU replicas copy their own rows from the data set into their input buffers (the loader's
    // gather_by_consumers): one copy instead of two, on the replica's own core.
    bool gathers_input() const { return !devices_.traits().asynchronous; }

    // The loader's next batch. While it waits (its slots are freed by the devices' release
    // callbacks) it checks every device, so a failed one surfaces instead of a hang.
    const Batch& next_batch(Loader& loader);
    // Replica 0 initialises the parameters; every other replica receives a copy.
    void init_and_broadcast();
    // One optimizer step on one global batch; the batch is released to the loader by every
    // replica once its shard is on the device. `sample_timing` records device timing events.
    void train_step(const Batch& batch, int64_t step, float lr, uint64_t seed, bool sample_timing);
    // Adds the sampled step's device times (CUDA) or the host-measured times (CPU) to split.
    void collect_timing(TimeSplit& split, int64_t steps_since_last);

    // fp16: the dynamic loss scale as of the last metrics request (1 otherwise), and its state
    // for checkpoints (scale, good steps in a row) and their restore.
    float loss_scale() const;
    std::array<float, 2> loss_scale_state();
    void restore_loss_scale(const std::array<float, 2>& state);
    // Train metrics accumulated since the last request: enqueue their copy (async) ...
    void request_train_metrics();
    bool train_metrics_ready();
    Metrics take_train_metrics();  // ... and read them (waits if not ready)
    // Per-replica accumulators since the last request, without resetting them (checkpoints), for
    // every replica of the job, and their restore (resume: per replica when the count matches,
    // else summed into the job's replica 0).
    std::vector<std::array<double, 3>> peek_train_metrics();
    void restore_train_metrics(const std::vector<std::array<double, 3>>& m);
    // Loss and accuracy over one pass of an unshuffled loader, computed across replicas.
    Metrics evaluate(Loader& loader);

    // The model's logits [rows, classes] for inputs x [rows, features] (host), on replica 0, in
    // evaluation mode: what the exported model must reproduce.
    std::vector<float> predict(const float* x, size_t rows);

    uint64_t checksum(int r);                 // whole parameter buffer of replica r
    std::vector<uint64_t> all_checksums();    // every replica of the job, in job order (collective)
    // Compares per-tensor checksums of every replica (of every node); throws DeviceError naming
    // the first tensor and replica that differ from replica 0.
    void verify_replicas();

    // Host copies for checkpoints (from replica 0) and restore (to every replica).
    std::vector<float> download_params();
    std::vector<std::pair<std::string, std::vector<float>>> download_optimizer_state();
    void upload_state(const std::vector<float>& params,
                      const std::vector<std::pair<std::string, std::vector<float>>>& optimizer_state);
    // The host waits until every device is idle, polling all of them, so that a failure on any
    // device surfaces as its own error instead of a hang on a healthy one waiting for it.
    void synchronize();
    // For teardown (never throws): waits for the devices unless something failed; after a
    // failure, aborts the collectives and abandons every device. Returns false after a failure.
    bool shutdown() noexcept;
    // Host calls and barrier crossings per replica since construction (tests and benchmarks
    // divide differences by the steps).
    StepWork host_work() const;
    // Profiling (bench-step --layers): while set, replica 0's steps mark their layers and phases
    // in `profile` (StepProfile, on replica 0's device) and run uncaptured; null turns it off.
    void set_profile(StepProfile* profile) { profile_ = profile; }
    int accumulation_steps() const { return accumulation_; }
    // Test hook: in the next step, replica r's gradients overflow (an inf is written into them
    // after backward, before the all-reduce), as an fp16 overflow in one replica would.
    void test_inject_overflow(int r) { inject_overflow_ = r; }

private:
    // The global batch against all replicas of the job, the accumulation steps and the buckets'
    // size: ConfigError if they do not fit.
    void check_batch(int global_batch, int all) const;
    // The cross-device ops of the gradients (ops_, state_ops_) over grad_ptrs_, chosen by
    // measurement for "auto".
    void make_gradient_ops(const std::vector<Device*>& devs);
    void make_stats_ops(const std::vector<Device*>& devs);
    void choose_graphs();  // strategy.cuda_graph: on, or why not (graph_note_)
    void build_replica(int r, int max_shard_rows, int max_micro_rows, const OptimizerConfig& opt);
    void allocate_model_state(Replica& R, const OptimizerConfig& opt, int max_micro_rows);
    void allocate_inputs(Replica& R, int max_shard_rows);
    void allocate_step_state(Replica& R);
    void create_step_events(Replica& R);
    // values: also copies the step's values into the buffer's step_values (cuda_graph).
    int stage_input(Replica& R, const Batch& batch, const Shard& shard, const StepValues* values = nullptr);
    // Replica r's shard of the global batch (rows of the job's batch) and where it lies in this
    // node's part of it.
    Shard global_shard(const Batch& batch, int r) const { return shard_of(batch.global_rows, all_replicas(), first_replica() + r); }
    static Shard local_shard(const Batch& batch, const Shard& global) { return {global.begin - batch.first_row, global.rows}; }
    void join_nodes();
    void replica_step(int r, const Batch& batch, int64_t step, float lr, uint64_t seed, bool sample_timing);
    // What one step's work depends on besides the device state: the rows, replica r's shard and
    // the input buffer it was staged in.
    struct StepShape {
        int global_rows = 0;
        Shard shard;
        int buf = 0;
    };
    // Forward, backward, all-reduce and update of replica r, staged input given. values (device):
    // a captured step's lr and counters; then the host's step and lr are not read by the work.
    void replica_compute(int r, const StepShape& shape, int64_t step, float lr, uint64_t seed, bool timing,
                         const StepValues* values);
    // cuda_graph: the step from a graph (captured now if its shape is new and warmed up); false
    // when this step must run uncaptured.
    bool graph_step(const Batch& batch, int64_t step, float lr, uint64_t seed);
    // Replica r's shard staged (values: with the step's values, for a graph).
    StepShape stage_step(int r, const Batch& batch, const StepValues* values);
    Graph capture_step(const std::vector<StepShape>& shapes, int64_t step, float lr, uint64_t seed);
    void destroy_graphs() noexcept;
    // Runs fn; any exception marks the strategy failed (collectives aborted, devices abandoned).
    template <typename F>
    auto guarded(F&& fn) -> decltype(fn());
    void fail() noexcept;
    void check_device_memory() const;
    // After the parameters change (init, restore, optimizer step): the compute copy follows.
    void refresh_weights(Replica& R, Stream s);
    void apply_update(Replica& R, int64_t step, float lr, const StepValues* values);
    // Shared parameters: the replica that holds the parameters, 16-bit weights and optimizer
    // state R computes with (replica 0), and R's slice of the flat buffer, which R reduces and updates.
    Replica& holder(Replica& R) { return shared_ ? *replicas_[0] : R; }
    Shard slice(int r) const;
    void shared_update(Replica& R, int64_t step, float lr, const StepValues* values, bool timing, double& comm);
    // Every replica's work so far comes before any replica's next work: the barrier on CPU
    // replicas; on a GPU, each compute stream waits for the others' events.
    void join_replicas(Replica& R) { joins_->wait_for(R.index, all_indices_); }
    Pass make_pass(Replica& R, Stream s, int rows, int global_rows, int64_t row_offset, uint64_t seed,
                   uint32_t step, bool training, const StepValues* values = nullptr);
    class ReplicaStatsSync;
    std::unique_ptr<StatsSync> make_stats_sync(int r);
    // Rows of micro-batch m summed over every replica's shard (synchronised statistics).
    int global_micro_rows(int global_rows, int m) const;
    const void* stage_for_compute(Replica& R, int buf, size_t rows);
    void wait_until(const std::function<bool()>& done);  // polls done(), checking every device
    StrategyConfig cfg_;
    const Model& model_;
    std::unique_ptr<Loss> loss_;
    size_t label_bytes_ = sizeof(int32_t);  // one sample's label on the device
    Nodes* nodes_ = nullptr;
    DeviceList devices_;
    int accumulation_ = 1;
    std::vector<std::unique_ptr<Replica>> replicas_;
    std::unique_ptr<ReplicaThreads> threads_;
    std::unique_ptr<CrossDeviceOps> ops_;        // the trainable region, in allreduce_dtype
    std::unique_ptr<CrossDeviceOps> state_ops_;  // the state region in f32 when ops_ is not
    std::unique_ptr<CrossDeviceOps> stats_ops_;  // synchronised batch statistics
    std::vector<Bucket> buckets_;
    std::string ops_choice_;
    std::vector<StagedPair> staged_pairs_;
    MemoryPlan plan_;
    std::vector<const TensorInfo*> state_;  // running statistics: updated after every step
    bool timing_sampled_ = false;
    bool failed_ = false;
    bool shared_ = false;
    // cuda_graph: one graph per step shape (input buffer, rows), captured on a shape's second step
    // (the first warms the libraries up), at most kMaxGraphs; other shapes run uncaptured.
    static constexpr size_t kMaxGraphs = 8;
    struct StepGraph {
        int buf = 0, global_rows = 0;
        Graph graph;
    };
    bool graphs_on_ = false;
    std::string graph_note_;
    std::vector<StepGraph> graphs_;
    std::vector<std::pair<int, int>> graph_warm_;  // shapes that have run once, uncaptured
    std::vector<StepShape> graph_shapes_;          // per replica, this step's
    Event graph_fork_;                             // replica 0's: the other replicas join the capture
    std::vector<float*> grad_ptrs_;  // every replica's gradients (the gradient ops; shared parameters' sums)
    std::unique_ptr<ReplicaSync> joins_;  // shared parameters: on the compute streams
    std::vector<int> all_indices_;        // 0 .. replicas - 1
    bool low_precision_ = false;  // bf16/fp16 activations: weight copies and input conversion
    bool loss_scaling_ = false;   // fp16
    int inject_overflow_ = -1;
    StepProfile* profile_ = nullptr;
    void profile_mark(const Replica& R, Stream s, int label);
};

}  // namespace mirrored
