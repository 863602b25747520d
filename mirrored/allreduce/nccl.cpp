// nccl: ncclAllReduce, grouped over the replicas (CUDA, one replica per GPU; simulated GPUs run a
// rendezvous with its semantics). Its halves for strategy.shard are the chunks' ncclReduce and
// ncclBroadcast, each rooted at the chunk's owner.
#include "mirrored/cross_device_ops.h"

namespace mirrored {

namespace {

// One NCCL rank per device: a backend that runs NCCL, every replica on its own GPU.
bool one_per_gpu(const std::vector<Device*>& devices) {
    if (devices.empty() || !devices[0]->traits().nccl) return false;
    for (size_t a = 0; a < devices.size(); ++a)
        for (size_t b = a + 1; b < devices.size(); ++b)
            if (devices[a]->ordinal() == devices[b]->ordinal()) return false;
    return true;
}

class NcclAllReduce final : public CrossDeviceOps {
public:
    NcclAllReduce(std::vector<Device*> d, std::vector<float*> b, size_t elements, DType wire, ReplicaBarrier& barrier)
        : CrossDeviceOps(d, std::move(b), elements, wire),
          group_(shared_nccl_group(d)),
          barrier_(barrier),
          views_(d.size()) {}
    const char* name() const override { return "nccl"; }
    void abort() noexcept override {
        CrossDeviceOps::abort();
        group_->abort();
    }

    void run(int r, size_t offset, size_t count) override {
        collective(r, offset, count, [&] { group_->all_reduce_sum(views_, wire_dtype(), count); });
    }
    bool shards() const override { return true; }
    // The chunks are owned()'s: chunk k of the range is replica k's.
    void run_reduce_scatter(int r, size_t offset, size_t count) override {
        collective(r, offset, count,
                   [&] { group_->reduce_scatter_sum(views_, Chunks(count, replicas(), DType::f32)); });
    }
    void run_all_gather(int r, size_t offset, size_t count) override {
        collective(r, offset, count, [&] { group_->all_gather(views_, Chunks(count, replicas(), DType::f32)); });
    }

private:
    // Replica 0's thread issues every rank's call (NCCL's group, one thread for all ranks).
    template <typename Issue>
    void collective(int r, size_t offset, size_t count, Issue issue) {
        if (replicas() == 1 || count == 0) return;
        barrier_.arrive_and_wait();  // every comm stream already waits for its data
        if (r == 0) {
            for (int i = 0; i < replicas(); ++i) views_[size_t(i)] = data(i, offset);
            issue();
        }
        barrier_.arrive_and_wait();  // enqueued on every stream before anyone records after it
    }

    std::shared_ptr<NcclGroup> group_;  // one per device list: the run's other nccl ops use it too
    ReplicaBarrier& barrier_;
    std::vector<void*> views_;
};

}  // namespace

extern const CrossDeviceOpsKind kNcclKind{"nccl", "ncclAllReduce over the replicas (CUDA, one replica per GPU)",
                                          one_per_gpu, true, create_cross_device_ops<NcclAllReduce>};

}  // namespace mirrored
