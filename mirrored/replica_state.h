// What the replicas hold between steps, read and written by the host: the parameters' start (one
// replica initialises, the others receive a copy), the metric accumulators and the fp16 loss
// scale, checksums that prove the replicas identical, and the host copies a checkpoint saves and
// a resume restores.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "mirrored/replica_set.h"

namespace mirrored {

class ReplicaState {
public:
    explicit ReplicaState(ReplicaSet& set) : set_(set) {}

    // Replica 0 initialises the parameters; every other replica receives a copy.
    void init_and_broadcast();

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

    uint64_t checksum(int r);               // whole parameter buffer of replica r
    std::vector<uint64_t> all_checksums();  // every replica of the job, in job order (collective)
    // Compares per-tensor checksums of every replica (of every node); throws DeviceError naming
    // the first tensor and replica that differ from replica 0.
    void verify_replicas();

    // Host copies for checkpoints and restore: the parameters from replica 0, the optimizer state
    // in the parameters' layout, gathered from (scattered to) the replicas that hold its parts.
    std::vector<float> download_params();
    std::vector<std::pair<std::string, std::vector<float>>> download_optimizer_state();
    void upload_state(const std::vector<float>& params,
                      const std::vector<std::pair<std::string, std::vector<float>>>& optimizer_state);
    // New parameters (pretrained weights) under the optimizer state the replicas start with: a
    // range at a time into every replica (values may be reused on return), then the 16-bit
    // precisions' compute copies refreshed once; and a range read back from replica 0.
    void upload_param_range(size_t offset, const float* values, size_t count);
    void refresh_weights();
    void download_param_range(size_t offset, float* values, size_t count);

private:
    std::vector<Replica*> state_holders();
    ReplicaSet& set_;
};

}  // namespace mirrored
