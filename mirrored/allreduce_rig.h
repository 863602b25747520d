// Replicas of a device list, one f32 buffer each and a cross-device op over them: what
// bench-allreduce, its stress test and the planner's link measurement run on.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kernels/buffer.h"
#include "kernels/device.h"
#include "mirrored/cross_device_ops.h"
#include "mirrored/replica_threads.h"
#include "mirrored/strategy.h"

namespace mirrored {

struct AllReduceRig {
    DeviceList list;
    std::vector<StagedPair> staged;  // pairs without peer access (CUDA, sim)
    std::vector<std::unique_ptr<Device>> devs;
    std::vector<DeviceBuffer<float>> bufs;
    std::unique_ptr<ReplicaThreads> threads;
    std::unique_ptr<CrossDeviceOps> ops;

    AllReduceRig(const std::string& devices, const std::string& op, DType wire, size_t max_floats);
    int replicas() const { return int(devs.size()); }
    void zero();  // every buffer (timing on zeros: no overflow, no denormals)
    // Every replica all-reduces [0, floats) `iters` times back to back; the wall time of it all.
    double run(size_t floats, int iters);
    // Median over `rounds` (after a warm-up) of the mean time of one all-reduce in a round of at
    // most `max_iters` back to back, as many as take about `round_budget_s` (at least 3).
    double median_seconds(size_t floats, int max_iters, int rounds, double round_budget_s = 0.05);
};

}  // namespace mirrored
