// The training step of MirroredStrategy, per replica thread:
//   stage the shard (async H2D on the copy stream) -> forward, loss and backward on the compute
//   stream, each finished bucket of gradients handed to the comm stream by an event and summed
//   across replicas there -> compute waits for comm -> clip -> the optimizer's update,
// or, with shared parameters, every replica sums and updates its slice of the one copy. The same
// step captured once per shape and replayed with one launch (strategy.cuda_graph), and the
// forward-only passes of evaluation and prediction. Nothing in a step synchronises the host with
// a device or allocates.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "mirrored/cross_device_ops.h"
#include "mirrored/loss.h"
#include "mirrored/replica_set.h"

namespace mirrored {

class TrainingStep {
public:
    // After the replicas exist: the gradients' cross-device ops (chosen by measurement for
    // `auto`), synchronised batchnorm's, the nodes joined, graphs on or why not.
    TrainingStep(ReplicaSet& set, const LossConfig& loss);
    ~TrainingStep();

    // One optimizer step on one global batch; the batch is released to the loader by every
    // replica once its shard is on the device. `sample_timing` records device timing events.
    void train_step(const Batch& batch, int64_t step, float lr, uint64_t seed, bool sample_timing);
    // Adds the sampled step's device times (GPUs) or the host-measured times (CPU) to split.
    void collect_timing(TimeSplit& split, int64_t steps_since_last);
    // Loss and accuracy over one pass of an unshuffled loader, computed across replicas.
    Metrics evaluate(Loader& loader);
    // The model's outputs [rows, outputs] for inputs x [rows, features] (host), on replica 0, in
    // evaluation mode: what the exported model must reproduce.
    std::vector<float> predict(const float* x, size_t rows);

    const char* ops_name() const { return set_.shared() ? "shared" : ops_->name(); }
    const std::string& ops_choice() const { return ops_choice_; }
    const std::vector<Bucket>& buckets() const { return buckets_; }
    bool cuda_graph() const { return graphs_on_; }
    const std::string& cuda_graph_note() const { return graph_note_; }
    void set_profile(LayerProbe* profile) { profile_ = profile; }
    void test_inject_overflow(int r) { inject_overflow_ = r; }
    // Test hook: in the next step, replica r fails as its device would (a DeviceError naming it).
    void test_inject_fault(int r) { inject_fault_ = r; }

private:
    // What one step's work depends on besides the device state: the rows, replica r's shard and
    // the input buffer it was staged in.
    struct StepShape {
        int global_rows = 0;
        Shard shard;
        int buf = 0;
    };
    // The cross-device ops of the gradients (ops_, state_ops_), chosen by measurement for "auto".
    void make_gradient_ops(const std::vector<Device*>& devs);
    void make_stats_ops(const std::vector<Device*>& devs);
    void join_nodes();
    void choose_graphs();  // strategy.cuda_graph: on, or why not (graph_note_)
    void abort_ops() noexcept;

    void replica_step(int r, const Batch& batch, int64_t step, float lr, uint64_t seed, bool sample_timing);
    // Replica r's shard staged (values: with the step's values, for a graph).
    StepShape stage_step(int r, const Batch& batch, const StepValues* values);
    // Forward, loss, backward, all-reduce and update of replica r, staged input given. values
    // (device): a captured step's lr and counters; then the host's step and lr are not read.
    void replica_compute(int r, const StepShape& shape, int64_t step, float lr, uint64_t seed, bool timing,
                         const StepValues* values);
    // The update from the summed gradients: statistics when clipping or loss scaling needs them,
    // the optimizer (skipped by an fp16 overflow), the loss scale, running statistics, the 16-bit copy.
    void apply_update(Replica& R, int64_t step, float lr, const StepValues* values);
    // The loss scale and the running statistics, after the optimizer (apply_update, sharded_update).
    void finish_update(Replica& R);
    // strategy.shard: gradients - bucket k's own chunk out of its slot into the own store.
    void keep_own_chunk(Replica& R, size_t k, bool add);
    void find_own_chunks();
    float* owned_grads(Replica& R, const Optimizer::Owned& o) const;  // an own range's summed gradients
    // strategy.shard: R updates its own chunks (reduce-scattered) and gathers everyone's.
    // comm: its communication's host time (CPU replicas); timing: the all-gather's events.
    void sharded_update(Replica& R, int64_t step, float lr, const StepValues* values, bool timing, double& comm);
    // Shared parameters: R sums its slice over every replica and updates it in the one copy.
    void shared_update(Replica& R, int64_t step, float lr, const StepValues* values, bool timing, double& comm);
    // Replica r's slice [begin, end) of the flat buffer (shared parameters): in size_t, as a
    // model may have more than 2^31 values.
    std::pair<size_t, size_t> slice(int r) const;
    // Every replica's work so far comes before any replica's next work (shared parameters).
    void join_replicas(Replica& R) { joins_->wait_for(R.index, all_indices_); }

    // cuda_graph: the step from a graph (captured now if its shape is new and warmed up); false
    // when this step must run uncaptured.
    bool graph_step(const Batch& batch, int64_t step, float lr, uint64_t seed);
    Graph capture_step(const std::vector<StepShape>& shapes, int64_t step, float lr, uint64_t seed);
    void destroy_graphs() noexcept;
    void profile_mark(const Replica& R, Stream s, int label);

    class ReplicaStatsSync;
    ReplicaSet& set_;
    const Model& model_;
    std::unique_ptr<Loss> loss_;
    std::vector<Bucket> buckets_;
    std::unique_ptr<CrossDeviceOps> ops_;        // the trainable region, in allreduce_dtype
    std::unique_ptr<CrossDeviceOps> state_ops_;  // the state region in f32 when ops_ is not
    std::unique_ptr<CrossDeviceOps> stats_ops_;  // synchronised batch statistics
    // strategy.shard: the updated parameters' all-gather, and the gradient statistics' sum
    std::unique_ptr<CrossDeviceOps> param_ops_, grad_stats_ops_;
    std::string ops_choice_;
    std::unique_ptr<ReplicaSync> joins_;       // shared parameters: on the compute streams
    std::vector<int> all_indices_;             // 0 .. replicas - 1
    std::vector<const TensorInfo*> state_;     // running statistics: updated after every step
    std::vector<std::vector<size_t>> own_at_;  // shard: gradients - [replica][bucket]: its own chunk in the own store
    bool timing_sampled_ = false;
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
    int inject_overflow_ = -1;
    int inject_fault_ = -1;
    LayerProbe* profile_ = nullptr;  // bench-step --layers: replica 0's steps marked
};

}  // namespace mirrored
