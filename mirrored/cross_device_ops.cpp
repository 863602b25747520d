#include "mirrored/cross_device_ops.h"

#include <algorithm>
#include <array>

#include "kernels/error.h"

namespace mirrored {

namespace {

// Ordering between replicas. On CPU the barrier alone orders everything. On GPUs (CUDA, sim)
// each replica records an event on its comm stream, the barrier guarantees every event is recorded, and then
// a replica's comm stream waits for the events of the replicas it reads from or that read from
// it - device-side ordering, no host round trip. Two event slots alternate: a slot is recorded
// again only two barriers later, after every waiter has enqueued its wait.
class ReplicaSync {
public:
    ReplicaSync(std::vector<Device*> devices, ReplicaBarrier& barrier)
        : devices_(std::move(devices)), barrier_(barrier), events_(devices_.size()), turn_(devices_.size(), 0) {
        async_ = !devices_.empty() && devices_[0]->asynchronous();
        if (async_)
            for (size_t r = 0; r < devices_.size(); ++r)
                for (auto& e : events_[r]) e = devices_[r]->event_create();
    }
    ~ReplicaSync() {
        for (size_t r = 0; r < events_.size(); ++r)
            for (Event e : events_[r])
                if (e.handle) devices_[r]->event_destroy(e);
    }
    // Replica r continues once the listed replicas' comm streams have reached this point.
    template <typename Peers>
    void wait_for(int r, const Peers& peers) {
        if (!async_) {
            barrier_.arrive_and_wait();
            return;
        }
        Device& me = *devices_[r];
        const int slot = turn_[r];
        turn_[r] ^= 1;
        me.event_record(events_[r][slot], me.comm_stream());
        barrier_.arrive_and_wait();
        for (int p : peers)
            if (p != r) me.stream_wait_event(me.comm_stream(), events_[p][slot]);
    }

private:
    std::vector<Device*> devices_;
    ReplicaBarrier& barrier_;
    std::vector<std::array<Event, 2>> events_;
    std::vector<int> turn_;  // per replica: only its own thread touches its entry
    bool async_ = false;
};

// Chunk k of `count` elements split n ways, in multiples of 4 floats (16-byte vector loads);
// trailing chunks may be empty when count is small.
struct Chunks {
    size_t count, size;
    Chunks(size_t c, int n) : count(c), size(((c + size_t(n) - 1) / size_t(n) + 3) / 4 * 4) {}
    size_t begin(int k) const { return std::min(count, size * size_t(k)); }
    size_t length(int k) const { return std::min(count, size * size_t(k + 1)) - begin(k); }
};

class RingAllReduce final : public CrossDeviceOps {
public:
    RingAllReduce(std::vector<Device*> d, std::vector<float*> b, ReplicaBarrier& barrier)
        : devices_(std::move(d)), buffers_(std::move(b)), sync_(devices_, barrier) {}
    const char* name() const override { return "ring"; }

    void run(int r, size_t offset, size_t count) override {
        const int n = int(devices_.size());
        if (n == 1 || count == 0) return;
        const int prev = (r + n - 1) % n, next = (r + 1) % n;
        const int neighbours[2] = {prev, next};
        Device& me = *devices_[r];
        const Device& from = *devices_[prev];
        float* mine = buffers_[r] + offset;
        const float* theirs = buffers_[prev] + offset;
        const Chunks c(count, n);
        auto mod = [n](int k) { return ((k % n) + n) % n; };
        // Reduce-scatter: at step s, add the previous replica's partial sum of chunk r-s-1 into
        // ours. After n-1 steps replica r holds the full sum of chunk r+1.
        for (int s = 0; s < n - 1; ++s) {
            sync_.wait_for(r, neighbours);
            const int k = mod(r - s - 1);
            me.reduce_from_peer(me.comm_stream(), mine + c.begin(k), from, theirs + c.begin(k), c.length(k));
        }
        // All-gather: at step s, copy the finished chunk r-s from the previous replica.
        for (int s = 0; s < n - 1; ++s) {
            sync_.wait_for(r, neighbours);
            const int k = mod(r - s);
            me.copy_from_peer(me.comm_stream(), mine + c.begin(k), from, theirs + c.begin(k), c.length(k));
        }
        // Nobody may overwrite its buffer while the next replica still copies from it.
        sync_.wait_for(r, neighbours);
    }

private:
    std::vector<Device*> devices_;
    std::vector<float*> buffers_;
    ReplicaSync sync_;
};

class ReduceToOne final : public CrossDeviceOps {
public:
    ReduceToOne(std::vector<Device*> d, std::vector<float*> b, ReplicaBarrier& barrier)
        : devices_(std::move(d)), buffers_(std::move(b)), sync_(devices_, barrier) {
        for (int r = 0; r < int(devices_.size()); ++r) all_.push_back(r);
    }
    const char* name() const override { return "reduce_to_one"; }

    void run(int r, size_t offset, size_t count) override {
        const int n = int(devices_.size());
        if (n == 1 || count == 0) return;
        const std::vector<int> root{0};
        const std::vector<int>& peers = r == 0 ? all_ : root;
        Device& me = *devices_[r];
        sync_.wait_for(r, peers);  // every replica's data is ready
        if (r == 0)
            for (int p = 1; p < n; ++p)
                me.reduce_from_peer(me.comm_stream(), buffers_[0] + offset, *devices_[p], buffers_[p] + offset, count);
        sync_.wait_for(r, peers);  // the sum is ready on replica 0
        if (r != 0) me.copy_from_peer(me.comm_stream(), buffers_[r] + offset, *devices_[0], buffers_[0] + offset, count);
        sync_.wait_for(r, peers);  // replica 0 keeps its buffer until every copy is done
    }

private:
    std::vector<Device*> devices_;
    std::vector<float*> buffers_;
    ReplicaSync sync_;
    std::vector<int> all_;
};

class NcclAllReduce final : public CrossDeviceOps {
public:
    NcclAllReduce(std::vector<Device*> d, std::vector<float*> b, ReplicaBarrier& barrier)
        : group_(make_nccl_group(d)), buffers_(std::move(b)), barrier_(barrier), views_(buffers_.size()) {}
    const char* name() const override { return "nccl"; }
    void abort() noexcept override {
        CrossDeviceOps::abort();
        group_->abort();
    }

    void run(int r, size_t offset, size_t count) override {
        if (buffers_.size() == 1 || count == 0) return;
        barrier_.arrive_and_wait();  // every comm stream already waits for its data
        if (r == 0) {
            for (size_t i = 0; i < buffers_.size(); ++i) views_[i] = buffers_[i] + offset;
            group_->all_reduce_sum(views_, count);
        }
        barrier_.arrive_and_wait();  // enqueued on every stream before anyone records after it
    }

private:
    std::unique_ptr<NcclGroup> group_;
    std::vector<float*> buffers_;
    ReplicaBarrier& barrier_;
    std::vector<float*> views_;
};

}  // namespace

void CrossDeviceOps::all_reduce(int r, size_t offset, size_t count) {
    if (broken_)
        throw DeviceError(std::string("cross-device ops (") + name() +
                          "): unusable after an aborted all-reduce; the replicas must be rebuilt");
    try {
        run(r, offset, count);
    } catch (...) {
        broken_ = true;
        throw;
    }
}

const char* cross_device_ops_names() { return "ring, nccl, reduce_to_one"; }

std::unique_ptr<CrossDeviceOps> make_cross_device_ops(const std::string& kind, std::vector<Device*> devices,
                                                      std::vector<float*> buffers, ReplicaBarrier& barrier) {
    if (devices.empty() || devices.size() != buffers.size())
        throw Error(kExitFailure, "cross-device ops need one buffer per replica");
    if (barrier.size() != int(devices.size()))
        throw Error(kExitFailure, "cross-device ops: barrier size differs from replica count");
    if (kind == "ring") return std::make_unique<RingAllReduce>(std::move(devices), std::move(buffers), barrier);
    if (kind == "reduce_to_one") return std::make_unique<ReduceToOne>(std::move(devices), std::move(buffers), barrier);
    if (kind == "nccl") return std::make_unique<NcclAllReduce>(std::move(devices), std::move(buffers), barrier);
    throw ConfigError("strategy.cross_device_ops", "unknown '" + kind + "' (known: " + cross_device_ops_names() + ")");
}

}  // namespace mirrored
