#include "kernels/peer_staging.h"

namespace mirrored {

PeerStaging::PeerStaging(Device& dev, Stream aux) : dev_(dev), aux_(aux), slots_(dev, 2 * kSliceBytes / sizeof(float)) {
    for (Event* e : {&copied_[0], &copied_[1], &added_[0], &added_[1], &entry_, &exit_}) *e = dev_.event_create();
}

PeerStaging::~PeerStaging() {
    for (Event e : {copied_[0], copied_[1], added_[0], added_[1], entry_, exit_}) dev_.event_destroy(e);
}

void PeerStaging::reduce(Stream s, void* dst, const Device& peer, const void* src, DType t, size_t n) {
    if (n == 0) return;
    const size_t elem = dtype_size(t), slice = kSliceBytes / elem;
    char* to = static_cast<char*>(dst);
    const char* from = static_cast<const char*>(src);
    // The previous call's adds, whatever stream it came on, have left the slots. Across a capture's
    // edge the event may not be waited on (CUDA's isolation rule): the graph's launch stream
    // orders the two instead, as it orders everything before and after the graph.
    if (dev_.capture_id(s) == exit_capture_) dev_.stream_wait_event(s, exit_);
    dev_.event_record(entry_, s);  // dst's earlier writes on s come first
    dev_.stream_wait_event(aux_, entry_);
    size_t done = 0;
    for (int i = 0; done < n; ++i) {
        const int b = i % 2;
        const size_t len = n - done < slice ? n - done : slice;
        void* slot = reinterpret_cast<char*>(slots_.data()) + size_t(b) * kSliceBytes;
        if (i >= 2) dev_.stream_wait_event(s, added_[b]);  // the slot's previous slice is added
        dev_.copy_from_peer(s, slot, peer, from + done * elem, len * elem);
        dev_.event_record(copied_[b], s);
        dev_.stream_wait_event(aux_, copied_[b]);
        dev_.reduce_from_peer(aux_, to + done * elem, dev_, slot, t, len);  // local: the direct path's sum
        dev_.event_record(added_[b], aux_);
        done += len;
    }
    dev_.event_record(exit_, aux_);  // later work on s sees every add
    exit_capture_ = dev_.capture_id(aux_);
    dev_.stream_wait_event(s, exit_);
}

}  // namespace mirrored
