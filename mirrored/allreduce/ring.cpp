// ring: reduce-scatter then all-gather, N-1 peer steps each (the default). Each step waits only
// for the neighbours it reads from and that read from it. The halves run alone too (strategy.shard).
#include <array>

#include "mirrored/cross_device_ops.h"

namespace mirrored {

namespace {

class RingAllReduce final : public CrossDeviceOps {
public:
    RingAllReduce(std::vector<Device*> d, std::vector<float*> b, size_t elements, DType wire, ReplicaBarrier& barrier)
        : CrossDeviceOps(std::move(d), std::move(b), elements, wire), sync_(devices_, barrier) {}
    const char* name() const override { return "ring"; }

    void run(int r, size_t offset, size_t count) override {
        if (replicas() == 1 || count == 0) return;
        reduce_scatter_phase(r, offset, count);
        all_gather_phase(r, offset, count);
        sync_.wait_for(r, neighbours(r));  // nobody overwrites its buffer while the next replica copies from it
    }
    bool shards() const override { return true; }
    void run_reduce_scatter(int r, size_t offset, size_t count) override {
        if (replicas() == 1 || count == 0) return;
        reduce_scatter_phase(r, offset, count);
        sync_.wait_for(r, neighbours(r));
    }
    void run_all_gather(int r, size_t offset, size_t count) override {
        if (replicas() == 1 || count == 0) return;
        all_gather_phase(r, offset, count);
        sync_.wait_for(r, neighbours(r));
    }

private:
    std::array<int, 2> neighbours(int r) const {
        const int n = replicas();
        return {(r + n - 1) % n, (r + 1) % n};
    }
    int mod(int k) const { return ((k % replicas()) + replicas()) % replicas(); }
    // At step s replica r adds the previous replica's partial sum of chunk r-s-2 into its own:
    // after n-1 steps it holds the full sum of chunk r, the chunk it owns.
    void reduce_scatter_phase(int r, size_t offset, size_t count) {
        const int prev = mod(r - 1);
        Device& me = *devices_[r];
        const Chunks c(count, replicas(), wire_dtype());
        for (int s = 0; s < replicas() - 1; ++s) {
            sync_.wait_for(r, neighbours(r));
            const int k = mod(r - s - 2);
            me.reduce_from_peer(me.comm_stream(), data(r, offset + c.begin(k)), *devices_[prev],
                                data(prev, offset + c.begin(k)), wire_dtype(), c.length(k));
        }
    }
    // At step s replica r copies the finished chunk r-s-1 from the previous replica.
    void all_gather_phase(int r, size_t offset, size_t count) {
        const int prev = mod(r - 1);
        Device& me = *devices_[r];
        const Chunks c(count, replicas(), wire_dtype());
        for (int s = 0; s < replicas() - 1; ++s) {
            sync_.wait_for(r, neighbours(r));
            const int k = mod(r - s - 1);
            me.copy_from_peer(me.comm_stream(), data(r, offset + c.begin(k)), *devices_[prev],
                              data(prev, offset + c.begin(k)), c.length(k) * dtype_size(wire_dtype()));
        }
    }

private:
    ReplicaSync sync_;
};

}  // namespace

extern const CrossDeviceOpsKind kRingKind{
    "ring", "reduce-scatter then all-gather over peer copies, N-1 steps each (the default)",
    [](const std::vector<Device*>&) { return true; }, true, create_cross_device_ops<RingAllReduce>};

}  // namespace mirrored
