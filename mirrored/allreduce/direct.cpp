// direct: every replica sums its slice (chunk r) over all replicas' buffers in one op and writes
// the sum into every buffer: one launch and two joins per bucket instead of the ring's 2(N-1)
// dependent steps. Needs every buffer loadable from every replica: replicas sharing a GPU (where a
// ring would move each byte through the same memory 2(N-1) times), CPU replicas, or GPUs with peer
// access (NVSwitch). Each element is summed in replica order 0, 1, ..., whichever replica sums it.
#include "kernels/ops/peer_sums.h"
#include "mirrored/cross_device_ops.h"

namespace mirrored {

namespace {

bool all_load(const std::vector<Device*>& devices) {
    if (devices.size() > size_t(PeerBuffers::kMax)) return false;
    for (const Device* a : devices)
        for (const Device* b : devices)
            if (!a->can_load_from(*b)) return false;
    return true;
}

class DirectAllReduce final : public CrossDeviceOps {
public:
    DirectAllReduce(std::vector<Device*> d, std::vector<float*> b, size_t elements, DType wire, ReplicaBarrier& barrier)
        : CrossDeviceOps(std::move(d), std::move(b), elements, wire), sync_(devices_, barrier) {
        if (replicas() > PeerBuffers::kMax)
            throw ConfigError("strategy.cross_device_ops",
                              "direct sums at most " + std::to_string(PeerBuffers::kMax) + " replicas; use ring");
        for (int r = 0; r < replicas(); ++r) {
            all_.push_back(r);
            for (int p = 0; p < replicas(); ++p)
                if (!devices_[r]->can_load_from(*devices_[p]))
                    throw ConfigError("strategy.cross_device_ops",
                                      "direct needs every replica to load every other's memory, but " +
                                          devices_[r]->name() + " cannot load " + devices_[p]->name() +
                                          "'s (no peer access); use ring or nccl");
            buffers_.ptr[r] = data(r, 0);
        }
        buffers_.count = replicas();
    }
    const char* name() const override { return "direct"; }

    void run(int r, size_t offset, size_t count) override {
        const int n = replicas();
        if (n == 1 || count == 0) return;
        Device& me = *devices_[r];
        const Chunks c(count, n, wire_dtype());
        sync_.wait_for(r, all_);  // every replica's data is ready
        sum_to_all(me, me.comm_stream(), buffers_, offset + c.begin(r), c.length(r), wire_dtype());
        sync_.wait_for(r, all_);  // every slice is summed into every buffer
    }

private:
    ReplicaSync sync_;
    std::vector<int> all_;
    PeerBuffers buffers_;
};

}  // namespace

extern const CrossDeviceOpsKind kDirectKind{
    "direct",
    "each replica sums its slice over every buffer in one op: replicas of one GPU, CPU replicas, "
    "or GPUs with all-to-all peer access",
    all_load, false, create_cross_device_ops<DirectAllReduce>};

}  // namespace mirrored
