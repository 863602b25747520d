// ring: reduce-scatter then all-gather, N-1 peer steps each (the default). Each step waits only
// for the neighbours it reads from and that read from it.
#include "mirrored/cross_device_ops.h"

namespace mirrored {

namespace {

class RingAllReduce final : public CrossDeviceOps {
public:
    RingAllReduce(std::vector<Device*> d, std::vector<float*> b, size_t elements, DType wire, ReplicaBarrier& barrier)
        : CrossDeviceOps(std::move(d), std::move(b), elements, wire), sync_(devices_, barrier) {}
    const char* name() const override { return "ring"; }

    void run(int r, size_t offset, size_t count) override {
        const int n = replicas();
        if (n == 1 || count == 0) return;
        const int prev = (r + n - 1) % n, next = (r + 1) % n;
        const int neighbours[2] = {prev, next};
        Device& me = *devices_[r];
        const Device& from = *devices_[prev];
        const DType t = wire_dtype();
        const size_t elem = dtype_size(t);
        const Chunks c(count, n, t);
        auto mod = [n](int k) { return ((k % n) + n) % n; };
        // Reduce-scatter: at step s, add the previous replica's partial sum of chunk r-s-1 into
        // ours. After n-1 steps replica r holds the full sum of chunk r+1.
        for (int s = 0; s < n - 1; ++s) {
            sync_.wait_for(r, neighbours);
            const int k = mod(r - s - 1);
            me.reduce_from_peer(me.comm_stream(), data(r, offset + c.begin(k)), from, data(prev, offset + c.begin(k)),
                                t, c.length(k));
        }
        // All-gather: at step s, copy the finished chunk r-s from the previous replica.
        for (int s = 0; s < n - 1; ++s) {
            sync_.wait_for(r, neighbours);
            const int k = mod(r - s);
            me.copy_from_peer(me.comm_stream(), data(r, offset + c.begin(k)), from, data(prev, offset + c.begin(k)),
                              c.length(k) * elem);
        }
        // Nobody may overwrite its buffer while the next replica still copies from it.
        sync_.wait_for(r, neighbours);
    }

private:
    ReplicaSync sync_;
};

}  // namespace

extern const CrossDeviceOpsKind kRingKind{
    "ring", "reduce-scatter then all-gather over peer copies, N-1 steps each (the default)",
    [](const std::vector<Device*>&) { return true; }, create_cross_device_ops<RingAllReduce>};

}  // namespace mirrored
