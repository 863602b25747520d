// The staged peer reduce: dst += src where src lives on a GPU whose memory kernels here cannot
// load (no peer access). Slices of src are copied into two local staging slots on the caller's
// stream while a second stream adds the previous slice, the slots ping-ponging, ordered by
// events. Written against the Device interface, so the CUDA backend and the simulated device run
// the same ordering logic (and CI tests it on the simulated one).
#pragma once

#include <cstddef>

#include "kernels/buffer.h"
#include "kernels/device.h"

namespace mirrored {

class PeerStaging {
public:
    static constexpr size_t kSliceBytes = size_t(4) << 20;  // per slot

    // aux: a stream of `dev` that only this object uses.
    PeerStaging(Device& dev, Stream aux);
    ~PeerStaging();
    PeerStaging(const PeerStaging&) = delete;
    PeerStaging& operator=(const PeerStaging&) = delete;

    // Enqueues dst[0..n) += src[0..n) in type t (Device::reduce_from_peer's) on s, src on peer;
    // later work on s sees the sum.
    void reduce(Stream s, void* dst, const Device& peer, const void* src, DType t, size_t n);

private:
    Device& dev_;
    Stream aux_;
    DeviceBuffer<float> slots_;  // two slots of kSliceBytes
    Event copied_[2], added_[2], entry_, exit_;
    uint64_t exit_capture_ = 0;  // the capture exit_ was last recorded in (0: none)
};

}  // namespace mirrored
