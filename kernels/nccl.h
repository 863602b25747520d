// NCCL as an alternative cross-device backend for CUDA replicas.
#pragma once

#include <memory>
#include <vector>

#include "kernels/device.h"

namespace mirrored {

class NcclGroup {
public:
    virtual ~NcclGroup() = default;
    // In-place sum of buffers[r][0..count) over all replicas, enqueued on each replica's comm
    // stream. One thread issues every rank between ncclGroupStart/End.
    virtual void all_reduce_sum(const std::vector<float*>& buffers, size_t count) = 0;
};

bool nccl_compiled();
// One communicator per device (ncclCommInitAll). NCCL cannot place two ranks on one GPU: a
// device list that repeats a GPU is refused with a ConfigError.
std::unique_ptr<NcclGroup> make_nccl_group(const std::vector<Device*>& devices);

}  // namespace mirrored
