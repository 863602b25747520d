// reduce_to_one: gather to replica 0, reduce, broadcast - TensorFlow's ReductionToOneDevice, kept
// as the baseline the others must beat (auto never chooses it).
#include "mirrored/cross_device_ops.h"

namespace mirrored {

namespace {

class ReduceToOne final : public CrossDeviceOps {
public:
    ReduceToOne(std::vector<Device*> d, std::vector<float*> b, size_t elements, DType wire, ReplicaBarrier& barrier)
        : CrossDeviceOps(std::move(d), std::move(b), elements, wire), sync_(devices_, barrier) {
        for (int r = 0; r < replicas(); ++r) all_.push_back(r);
    }
    const char* name() const override { return "reduce_to_one"; }

    void run(int r, size_t offset, size_t count) override {
        const int n = replicas();
        if (n == 1 || count == 0) return;
        const std::vector<int> root{0};
        const std::vector<int>& peers = r == 0 ? all_ : root;
        Device& me = *devices_[r];
        const DType t = wire_dtype();
        sync_.wait_for(r, peers);  // every replica's data is ready
        if (r == 0)
            for (int p = 1; p < n; ++p)
                me.reduce_from_peer(me.comm_stream(), data(0, offset), *devices_[p], data(p, offset), t, count);
        sync_.wait_for(r, peers);  // the sum is ready on replica 0
        if (r != 0)
            me.copy_from_peer(me.comm_stream(), data(r, offset), *devices_[0], data(0, offset), count * dtype_size(t));
        sync_.wait_for(r, peers);  // replica 0 keeps its buffer until every copy is done
    }

private:
    ReplicaSync sync_;
    std::vector<int> all_;
};

}  // namespace

extern const CrossDeviceOpsKind kReduceToOneKind{
    "reduce_to_one", "gather to replica 0, reduce, broadcast: the baseline the others must beat",
    [](const std::vector<Device*>&) { return false; }, false, create_cross_device_ops<ReduceToOne>};

}  // namespace mirrored
