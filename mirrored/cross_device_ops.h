// Cross-device ops: in-place sum of one flat buffer per replica, over any sub-range. Each op
// lives in its own file in mirrored/allreduce/ (ring, direct, nccl, reduce_to_one) and registers
// a CrossDeviceOpsKind; cross_device_ops_kinds() lists them.
//
// all_reduce(r, ...) is called by every replica's own thread, the same calls in the same order.
// Work goes on the replicas' comm streams: the caller makes the comm stream wait for the data
// first, and waits for the comm stream before using the result. The same code serves CPU
// replicas (where "streams" are the calling thread and synchronisation is the barrier).
//
// The wire type (strategy.allreduce_dtype): f32, or bf16 - each replica packs the range into its
// own 16-bit copy, the ops move and add those (each add in f32, rounded once to bf16: half the
// bytes on the links), and every replica unpacks the identical result.
//
// A failure inside an all-reduce (a device error, a replica that broke the barrier) leaves the
// ops broken: how far each replica got, and so which event slot each expects next, is unknown,
// so every later call throws rather than pair the wrong events.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "base/registry.h"
#include "kernels/buffer.h"
#include "kernels/device.h"
#include "kernels/nccl.h"
#include "kernels/chunks.h"
#include "mirrored/nodes.h"
#include "mirrored/replica_sync.h"
#include "mirrored/replica_threads.h"

namespace mirrored {

class NodeLink;

class CrossDeviceOps {
public:
    // buffers[r]: replica r's f32 buffer of `elements`; wire: f32 or bf16.
    CrossDeviceOps(std::vector<Device*> devices, std::vector<float*> buffers, size_t elements, DType wire);
    virtual ~CrossDeviceOps();
    virtual const char* name() const = 0;
    // Sum buffers[*][offset, offset + count) in place; every replica ends bit-identical.
    void all_reduce(int r, size_t offset, size_t count);
    // The two halves of all_reduce, for sharded optimizer state (strategy.shard), on the f32 wire:
    // after reduce_scatter(r, ...) replica r's buffer holds the sum over replicas - of every node,
    // once joined - of its own chunk of the range (owned(); the rest of the range is scratch);
    // all_gather(r, ...) copies every other local replica's chunk into r's buffer (replica r of
    // every node owns the same chunk). Together they sum as all_reduce does, bit for bit. Only
    // ops with shards() split.
    virtual bool shards() const { return false; }
    void reduce_scatter(int r, size_t offset, size_t count);
    void all_gather(int r, size_t offset, size_t count);
    // Replica r's chunk [begin, end) of the range [offset, offset + count) of n replicas' buffers.
    static std::pair<size_t, size_t> owned(int r, int n, size_t offset, size_t count) {
        const Chunks c(count, n, DType::f32);
        return {offset + c.begin(r), offset + c.begin(r) + c.length(r)};
    }
    // Multi-node (f32 wire): every all_reduce becomes hierarchical - the node's sum by this op,
    // then each local replica sums its slice of the range across the nodes (replica r of every
    // node: MPI channel r for CPU and simulated replicas, an NCCL communicator for GPUs, on the
    // comm stream), then gathers the other local replicas' slices. Channel r of `nodes` must be
    // open. Collective over the nodes (NCCL communicators are built here).
    void join_nodes(Nodes* nodes, ReplicaBarrier& barrier);
    // The error path: stop now (NCCL: abort the communicators). Unusable afterwards.
    virtual void abort() noexcept;
    bool broken() const { return broken_; }
    DType wire_dtype() const { return wire_; }

protected:
    // Sum in place over replicas the elements [offset, offset + count) of data(r), elements of
    // wire_dtype(), on the comm streams.
    virtual void run(int r, size_t offset, size_t count) = 0;
    virtual void run_reduce_scatter(int, size_t, size_t) {}  // ops with shards()
    virtual void run_all_gather(int, size_t, size_t) {}
    // Replica r's buffer as the ops see it: the f32 buffer, or its bf16 copy; offset in elements.
    void* data(int r, size_t offset) const {
        return static_cast<char*>(views_[size_t(r)]) + offset * dtype_size(wire_);
    }
    int replicas() const { return int(devices_.size()); }

    std::vector<Device*> devices_;

private:
    void across_nodes(int r, size_t offset, size_t count);
    // Throws unless [offset, offset + count) lies in the buffers and the ops can still run.
    void check_call(size_t offset, size_t count) const;
    void check_splittable() const;
    std::vector<float*> buffers_;
    std::vector<std::unique_ptr<NodeLink>> links_;  // per replica, multi-node only
    std::unique_ptr<ReplicaSync> node_sync_;
    std::vector<int> all_;
    std::vector<DeviceBuffer<uint16_t>> packed_;  // per replica, bf16 wire only
    std::vector<void*> views_;
    size_t elements_;
    DType wire_;
    std::atomic<bool> broken_{false};
};

// `strategy.cross_device_ops: auto`: times every op these devices can run - ring; direct where
// every replica loads every other's memory; nccl for one replica per GPU where built - on the
// given buffers over the given ranges (a step's buckets), and picks the fastest. The choice is
// cached per machine, device list and bucket layout (base/machine_cache.h), so a restarted run
// - a resume - makes the same one. The buffers' contents are overwritten (with zeros). `keep`: the
// op of the checkpoint a run resumes from; when these devices can run it, it is the choice and
// nothing is measured (another op sums in another order: the resume would not be exact). `split`
// (strategy.shard): only the ops that split, timed as a reduce-scatter then an all-gather of every
// range; where one alone splits, it is the choice unmeasured.
struct OpsChoice {
    std::string name;  // "direct"
    std::string how;   // "measured: ring 1.21 ms, direct 0.43 ms per step" or "cached: ..."
};
OpsChoice choose_cross_device_ops(const std::vector<Device*>& devices, const std::vector<float*>& buffers,
                                  size_t elements, const std::vector<std::pair<size_t, size_t>>& ranges,
                                  ReplicaThreads& threads, DType wire, const std::string& keep = {},
                                  bool split = false);

// An op: its name (strategy.cross_device_ops), a line for --help, whether `auto` may time it for
// these devices (it runs them), whether it splits into reduce-scatter and all-gather, and how it is made: devices[r], buffers[r] are replica r's device
// and buffer of `elements` floats; barrier the replica threads'; wire the type on the links.
struct CrossDeviceOpsKind {
    const char* name;
    const char* summary;
    bool (*candidate)(const std::vector<Device*>& devices);
    bool shards;  // runs its halves alone: sharded optimizer state (strategy.shard) can use it
    std::unique_ptr<CrossDeviceOps> (*create)(std::vector<Device*> devices, std::vector<float*> buffers,
                                              size_t elements, DType wire, ReplicaBarrier& barrier);
};
template <typename Op>
std::unique_ptr<CrossDeviceOps> create_cross_device_ops(std::vector<Device*> devices, std::vector<float*> buffers,
                                                        size_t elements, DType wire, ReplicaBarrier& barrier) {
    return std::make_unique<Op>(std::move(devices), std::move(buffers), elements, wire, barrier);
}
const Registry<CrossDeviceOpsKind>& cross_device_ops_kinds();  // cross_device_ops.cpp lists every op
// Why strategy.shard cannot run on op ("" where it can, or where auto will pick one that can).
std::string shard_refusal(const std::string& op);
std::unique_ptr<CrossDeviceOps> make_cross_device_ops(const std::string& kind, std::vector<Device*> devices,
                                                      std::vector<float*> buffers, size_t elements,
                                                      ReplicaBarrier& barrier, DType wire = DType::f32);

}  // namespace mirrored
