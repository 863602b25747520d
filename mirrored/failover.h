// strategy.on_replica_failure: continue - a run that loses one of its devices goes on without it.
//
// The process that saw the fault replaces itself (exec) with one on the surviving devices, which
// resumes from the last checkpoint with the same global batch. Nothing of the failed GPU's state
// survives the exec (CUDA: after a sticky error "the process must be terminated and relaunched"),
// the healthy GPUs' memory comes back with their contexts, and the result is by construction that
// of a run started on the survivors from that checkpoint. The fault, the device and the steps
// redone go to metrics.jsonl (an alert of kind replica_failure) and summary.json.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "kernels/device.h"

namespace mirrored {

// What a run goes on with after a device failed, handed to the process that continues it.
struct Continuation {
    std::string devices;   // strategy.devices of the survivors ("sim:0,2", "cpu:3")
    int accumulation = 1;  // train.grad_accumulation_steps that keeps the global batch
    std::string failed;    // the device set aside ("sim:1")
    int64_t fault_ms = 0;  // when the fault surfaced, in ms since the epoch (for the time to the next step)
    // The replica count the learning rate is scaled by (optimizer.scale_lr_with_replicas): the
    // first process's, since the global batch does not change.
    int lr_replicas = 1;
    // The checkpoint to go on from (absolute): the newest the run wrote, else the one it resumed
    // from; "" when there is none (the survivors start at step 0).
    std::string resume;
};

// The environment variable a failing process hands its successor the continuation in (the
// fields separated by '|', the checkpoint's path last, whatever it holds); the
// successor reads it (decode_continuation) and clears it before anything else starts.
inline constexpr const char* kContinuationVar = "MIRRORED_CONTINUATION";
std::string encode_continuation(const Continuation& c);
Continuation decode_continuation(const std::string& text);  // ConfigError naming the variable when malformed

// Which replicas go on after `failed` faulted. replica_devices: each replica's device name in
// order ("sim:0", "sim:1", ...; CPU replicas "cpu:0", "cpu:1", ...). Every replica on the failed
// device is dropped; of the rest, the first m for the largest m that shares the global batch
// equally in micro-batches no larger than before (so they fit where the old ones did), with the
// fewest accumulation steps that allow it. Empty `keep` and a reason in `refused` when fewer than
// min_replicas can go on.
struct SurvivorPlan {
    std::vector<int> keep;  // replica indices, ascending
    int accumulation = 1;
    int survivors = 0;  // replicas on healthy devices (keep may use fewer: the batch must divide)
    std::string refused;
};
SurvivorPlan plan_survivors(const std::vector<std::string>& replica_devices, const std::string& failed,
                            int global_batch, int accumulation, int min_replicas);

// strategy.devices for the kept replicas of `list`: "sim:0,2", "cuda:0,0", "cpu:3".
std::string survivors_spec(const DeviceList& list, const std::vector<int>& keep);

}  // namespace mirrored
