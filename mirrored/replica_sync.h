// Ordering the replicas' streams against each other through the replica threads' barrier: what
// the cross-device ops and the shared-parameter update use to say "replica r goes on once these
// replicas have got here".
#pragma once

#include <array>
#include <vector>

#include "kernels/device.h"
#include "mirrored/replica_threads.h"

namespace mirrored {

// Ordering between replicas. On CPU the barrier alone orders everything. On GPUs (CUDA, sim)
// each replica records an event on its stream (the comm stream for the cross-device ops, the
// compute stream for shared parameters' joins), the barrier guarantees every event is recorded,
// and then a replica's stream waits for the events of the replicas it reads from or that read
// from it - device-side ordering, no host round trip. Two event slots alternate: a slot is
// recorded again only two barriers later, after every waiter has enqueued its wait.
class ReplicaSync {
public:
    enum class On { comm, compute };
    ReplicaSync(std::vector<Device*> devices, ReplicaBarrier& barrier, On on = On::comm)
        : devices_(std::move(devices)),
          barrier_(barrier),
          events_(devices_.size()),
          turn_(devices_.size(), 0),
          on_(on) {
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
    ReplicaSync(const ReplicaSync&) = delete;
    ReplicaSync& operator=(const ReplicaSync&) = delete;
    // Replica r continues once the listed replicas' streams have reached this point.
    template <typename Peers>
    void wait_for(int r, const Peers& peers) {
        if (!async_) {
            barrier_.arrive_and_wait();
            return;
        }
        Device& me = *devices_[size_t(r)];
        const Stream s = on_ == On::comm ? me.comm_stream() : me.compute_stream();
        const int slot = turn_[size_t(r)];
        turn_[size_t(r)] ^= 1;
        me.event_record(events_[size_t(r)][size_t(slot)], s);
        barrier_.arrive_and_wait();
        for (int p : peers)
            if (p != r) me.stream_wait_event(s, events_[size_t(p)][size_t(slot)]);
    }

private:
    std::vector<Device*> devices_;
    ReplicaBarrier& barrier_;
    std::vector<std::array<Event, 2>> events_;
    std::vector<int> turn_;  // per replica: only its own thread touches its entry
    On on_;
    bool async_ = false;
};

}  // namespace mirrored
