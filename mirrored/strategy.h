// MirroredStrategy: one process drives N replicas, each a full copy of the model on its own
// device, each computing on its contiguous shard of the global batch. Gradients are summed
// across replicas (the loss is the mean over the global batch, so the sum is the mean gradient)
// by the cross-device ops, in buckets that start while backward is still running; every replica
// then applies the same optimizer update, so the replicas stay bit-identical.
//
// The facade the trainer and the tools use, over three parts:
//   ReplicaSet    (replica_set.h)    devices, memory plan, the replicas' buffers, failure
//   TrainingStep  (training_step.h)  forward, loss, backward, all-reduce, update; captured steps
//   ReplicaState  (replica_state.h)  initialisation, metrics, checksums, checkpoint copies
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "mirrored/replica_set.h"
#include "mirrored/replica_state.h"
#include "mirrored/strategy_config.h"
#include "mirrored/training_step.h"

namespace mirrored {

class MirroredStrategy {
public:
    static constexpr float kInitialLossScale = ReplicaSet::kInitialLossScale;

    // nodes: the other nodes of a multi-node run (nullptr: this node alone). Every node builds
    // the same number of replicas; node k's replica r is the job's replica k x replicas() + r.
    // batches: the global rows of every batch the run computes, for the memory plan (ReplicaSet).
    MirroredStrategy(const StrategyConfig& cfg, const Model& model, const OptimizerConfig& opt, int global_batch,
                     int accumulation_steps, Nodes* nodes = nullptr, const LossConfig& loss = {},
                     const std::vector<int>& batches = {});
    ~MirroredStrategy();

    // ---- the replicas (ReplicaSet) -------------------------------------------------------------
    int replicas() const { return set_->replicas(); }          // on this node
    int all_replicas() const { return set_->all_replicas(); }  // in the job
    int first_replica() const { return set_->first_replica(); }
    int node_count() const { return set_->node_count(); }
    int node_rank() const { return set_->node_rank(); }
    Nodes* nodes() const { return set_->nodes(); }
    const DeviceList& devices() const { return set_->devices(); }
    const DeviceTraits& device_traits() const { return set_->traits(); }
    const Backend& backend() const { return *set_->devices().backend; }
    const Model& model() const { return set_->model(); }
    Replica& replica(int r) { return set_->replica(r); }
    const Replica& replica(int r) const { return set_->replica(r); }
    int accumulation_steps() const { return set_->accumulation(); }
    // CPU replicas, or replicas of one GPU, sharing one parameter copy (strategy.shared_parameters).
    bool shared_parameters() const { return set_->shared(); }
    // strategy.shard optimizer on replicas with their own parameter copies: each keeps the
    // optimizer state of its own chunks only.
    bool sharded_optimizer() const { return set_->sharded(); }
    // strategy.shard gradients, with several replicas on this node: each also keeps the summed
    // gradients of its own chunks only (the rest are staged in reused slots).
    bool sharded_gradients() const { return set_->staged(); }
    int gradient_slots() const { return set_->staging().slots; }
    size_t gradient_slot_floats() const {  // the slots together (the staging buffer less the state region)
        return set_->staging().buffer - (model().grad_size() - model().trainable_size());
    }
    const MemoryPlan& memory_plan() const { return set_->memory_plan(); }  // per replica
    // The most device memory any replica has held through its own allocations (measured).
    uint64_t peak_memory_bytes() const { return set_->peak_memory_bytes(); }
    uint64_t memory_per_replica_bytes() const { return set_->memory_per_replica_bytes(); }
    std::string topology_report() const { return set_->topology_report(); }
    // Memory the loader should assemble batches in (pinned when replicas are GPUs).
    HostAllocator host_allocator() { return set_->host_allocator(); }
    // CPU replicas copy their own rows from the data set into their input buffers (the loader's
    // gather_by_consumers): one copy instead of two, on the replica's own core.
    bool gathers_input() const { return set_->gathers_input(); }
    bool failed() const { return set_->failed(); }
    // A hang's device, or "" (ReplicaSet::lagging_device; safe from the watchdog's thread).
    std::string lagging_device() const { return set_->lagging_device(); }
    // The loader's next batch. While it waits (its slots are freed by the devices' release
    // callbacks) it checks every device, so a failed one surfaces instead of a hang.
    const Batch& next_batch(Loader& loader) { return set_->next_batch(loader); }
    void synchronize() { set_->synchronize(); }
    // For teardown (never throws): waits for the devices unless something failed; after a
    // failure, aborts the collectives and abandons every device. Returns false after a failure.
    bool shutdown() noexcept { return set_->shutdown(); }
    // Host calls and barrier crossings per replica since construction (tests and benchmarks
    // divide differences by the steps).
    StepWork host_work() const { return set_->host_work(); }

    // ---- the step (TrainingStep) --------------------------------------------------------------
    // One optimizer step on one global batch (and every strategy.verify_every_steps a check that
    // the replicas are identical).
    void train_step(const Batch& batch, int64_t step, float lr, uint64_t seed, bool sample_timing);
    void collect_timing(TimeSplit& split, int64_t steps_since_last) { step_->collect_timing(split, steps_since_last); }
    Metrics evaluate(Loader& loader) { return step_->evaluate(loader); }
    std::vector<float> predict(const float* x, size_t rows) { return step_->predict(x, rows); }
    const char* cross_device_ops_name() const { return step_->ops_name(); }
    // How `auto` chose the ops ("auto, measured: ring 1.2 ms, direct 0.4 ms per step"); empty
    // when the config named them.
    const std::string& cross_device_ops_choice() const { return step_->ops_choice(); }
    const std::vector<Bucket>& buckets() const { return step_->buckets(); }
    // Steps replayed from captured graphs (strategy.cuda_graph), and why graphs are off when the
    // config asked for them ("" otherwise).
    bool cuda_graph() const { return step_->cuda_graph(); }
    const std::string& cuda_graph_note() const { return step_->cuda_graph_note(); }
    // Profiling (bench-step --layers): while set, replica 0's steps mark their layers and phases
    // in `profile` (StepProfile, on replica 0's device) and run uncaptured; null turns it off.
    void set_profile(LayerProbe* profile) { step_->set_profile(profile); }
    // Test hook: in the next step, replica r's gradients overflow (an inf is written into them
    // after backward, before the all-reduce), as an fp16 overflow in one replica would.
    void test_inject_overflow(int r) { step_->test_inject_overflow(r); }
    // Test hook: in the next step, replica r fails as its device would (a DeviceError naming it).
    void test_inject_fault(int r) { step_->test_inject_fault(r); }

    // ---- the state (ReplicaState) -------------------------------------------------------------
    void init_and_broadcast() { state_->init_and_broadcast(); }
    float loss_scale() const { return state_->loss_scale(); }
    std::array<float, 2> loss_scale_state() { return state_->loss_scale_state(); }
    void restore_loss_scale(const std::array<float, 2>& s) { state_->restore_loss_scale(s); }
    void request_train_metrics() { state_->request_train_metrics(); }
    bool train_metrics_ready() { return state_->train_metrics_ready(); }
    Metrics take_train_metrics() { return state_->take_train_metrics(); }
    std::vector<std::array<double, 3>> peek_train_metrics() { return state_->peek_train_metrics(); }
    void restore_train_metrics(const std::vector<std::array<double, 3>>& m) { state_->restore_train_metrics(m); }
    uint64_t checksum(int r) { return state_->checksum(r); }
    std::vector<uint64_t> all_checksums() { return state_->all_checksums(); }
    void verify_replicas() { state_->verify_replicas(); }
    std::vector<float> download_params() { return state_->download_params(); }
    std::vector<std::pair<std::string, std::vector<float>>> download_optimizer_state() {
        return state_->download_optimizer_state();
    }
    void upload_state(const std::vector<float>& params,
                      const std::vector<std::pair<std::string, std::vector<float>>>& optimizer_state) {
        state_->upload_state(params, optimizer_state);
    }
    void upload_param_range(size_t offset, const float* values, size_t count) {
        state_->upload_param_range(offset, values, count);
    }
    void refresh_weights() { state_->refresh_weights(); }
    void download_param_range(size_t offset, float* values, size_t count) {
        state_->download_param_range(offset, values, count);
    }

private:
    std::unique_ptr<ReplicaSet> set_;
    std::unique_ptr<TrainingStep> step_;
    std::unique_ptr<ReplicaState> state_;
};

}  // namespace mirrored
