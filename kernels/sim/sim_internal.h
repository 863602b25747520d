// What the simulated NCCL (sim_nccl.cpp) needs of the simulated GPUs (sim_device.cpp). Private to
// kernels/sim/.
#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>

#include "kernels/device.h"

namespace mirrored::sim {

// The one lock and wake-up every simulated stream, marker and waiter shares.
std::mutex& world_mutex();
std::condition_variable& world_wakeup();

// Issues task on d's comm stream as the host call `api`: counted, failing as the GPU's calls fail,
// and refused inside a capture (a collective's rendezvous belongs to one call). On the stream,
// dropping() - asked with world_mutex() held - says whether d's queued work is being dropped (the
// device abandoned or its GPU failed), so that a rank waiting for the others can give up.
using CollectiveTask = std::function<void(const std::function<bool()>& dropping)>;
void launch_collective(Device& d, const char* api, CollectiveTask task);

}  // namespace mirrored::sim
