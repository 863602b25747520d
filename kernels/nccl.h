// NCCL as an alternative cross-device backend for GPU replicas: the real library for CUDA
// replicas (when the build found it), a rendezvous with the same semantics for simulated ones.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kernels/chunks.h"
#include "kernels/device.h"

namespace mirrored {

class NcclGroup {
public:
    virtual ~NcclGroup() = default;  // finalizes the communicators; after abort() only frees them
    // In-place sum of buffers[r][0..count) over all replicas, elements of type t (f32 or bf16),
    // enqueued on each replica's comm stream. One thread issues every rank between
    // ncclGroupStart/End.
    virtual void all_reduce_sum(const std::vector<void*>& buffers, DType t, size_t count) = 0;
    // The halves of all_reduce_sum for sharded optimizer state, f32, in place, over the chunks
    // of [0, chunks.count) (kernels/chunks.h; chunk k is rank k's). reduce_scatter_sum: rank k's
    // chunk k becomes the sum over every rank (the rest of its buffer is left as it was or is
    // scratch); all_gather: every rank's chunk k becomes rank k's. Grouped ncclReduce (root k) and
    // ncclBroadcast (root k) calls on CUDA - NCCL's reduce-scatter and all-gather take equal
    // chunks only, and padding every bucket would move the parameters.
    virtual void reduce_scatter_sum(const std::vector<void*>& buffers, const Chunks& chunks) = 0;
    virtual void all_gather(const std::vector<void*>& buffers, const Chunks& chunks) = 0;
    // The error path: abandon the communicators now (ncclCommAbort), so that no rank waits for
    // a failed one; the group is unusable afterwards.
    virtual void abort() noexcept = 0;
};

bool nccl_compiled();  // was the build linked against NCCL?
// One communicator per device. NCCL cannot place two ranks on one GPU: a device list that repeats
// a GPU is refused with a ConfigError, as is a build without NCCL (saying how to get it).
std::unique_ptr<NcclGroup> make_nccl_group(const std::vector<Device*>& devices);
// The group of these devices that callers share while any of them holds it (made by
// make_nccl_group on the first call): a run's gradient, parameter and statistics ops are one set
// of communicators, whose buffers NCCL allocates on every GPU, not three. Its calls must not
// overlap, as a run's ops, issued in turn by the replica threads, do not.
std::shared_ptr<NcclGroup> shared_nccl_group(const std::vector<Device*>& devices);

// Between processes (multi-node): one communicator per local replica index with one rank per
// node, joined through an id that node 0 creates and the others receive (over MPI).
class NcclNodeComm {
public:
    virtual ~NcclNodeComm() = default;  // finalizes; after abort() only frees
    // In-place sum over the nodes of data[0, count) (f32), enqueued on stream s.
    virtual void all_reduce_sum(Stream s, float* data, size_t count) = 0;
    virtual void abort() noexcept = 0;
};
std::string nccl_unique_id();  // ncclGetUniqueId's bytes
// Collective over the nodes: every node calls it with the same id, its rank and the node count,
// for the GPU that holds this channel's replica.
std::unique_ptr<NcclNodeComm> make_nccl_node_comm(const std::string& id, int rank, int ranks, Device& device);

// The implementations make_nccl_group picks from (devices already checked).
std::unique_ptr<NcclGroup> make_cuda_nccl_group(const std::vector<Device*>& devices);
std::unique_ptr<NcclGroup> make_sim_nccl_group(const std::vector<Device*>& devices);

}  // namespace mirrored
