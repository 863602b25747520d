// The sums over every replica's buffer that run as one kernel on one device: the direct
// all-reduce's slice (sum_to_all) and the reduce-scatter half for replicas sharing one parameter
// copy (sum_into). Every buffer must be loadable from the device (Device::can_load_from): the same
// GPU, a peer with access enabled, or host memory. The CPU loops (peer_sums.cpp, the reference)
// and the CUDA launchers (peer_sums.cu) side by side; both sum in buffer order, bit for bit alike.
#pragma once

#include <cstddef>

#include "kernels/device.h"

namespace mirrored {

// For i in [0, n), the sum over k = 0, 1, ... in that order of buffers.ptr[k][offset + i] -
// elements of type t (f32, or bf16 summed in f32 and rounded once) - written back into every buffer.
void sum_to_all(Device& d, Stream s, const PeerBuffers& buffers, size_t offset, size_t n, DType t);
// In place into buffers[into][offset, offset + n): the sum over `count` f32 buffers - its own
// value first, then the others in buffer order - written only there (at most PeerBuffers::kMax
// buffers on CUDA).
void sum_into(Device& d, Stream s, float* const* buffers, int count, int into, size_t offset, size_t n);

// The CUDA launchers, set by peer_sums.cu where the CUDA backend is built; each returns the
// kernels it launched.
struct PeerSumKernels {
    int (*sum_to_all)(const Device::NativeLaunch& l, const PeerBuffers& b, size_t offset, size_t n, DType t) = nullptr;
    int (*sum_into)(const Device::NativeLaunch& l, const PeerBuffers& b, int into, size_t offset, size_t n) = nullptr;
};
extern PeerSumKernels peer_sum_cuda;

}  // namespace mirrored
