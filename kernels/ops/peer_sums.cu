// The peer sums on CUDA (peer_sums.h), over cuda_kernels.cu's kernels.
#include "kernels/cuda/kernel_util.cuh"
#include "kernels/ops/peer_sums.h"

namespace mirrored::cuda {

namespace {

int launch_sum_to_all(const Device::NativeLaunch& l, const PeerBuffers& b, size_t offset, size_t n, DType t) {
    sum_to_all(stream_of(l), l.device, b, offset, n, t);
    return 1;
}

int launch_sum_into(const Device::NativeLaunch& l, const PeerBuffers& b, int into, size_t offset, size_t n) {
    sum_into(stream_of(l), l.device, b, into, offset, n);
    return 1;
}

const struct Register {
    Register() { peer_sum_cuda = {launch_sum_to_all, launch_sum_into}; }
} registered;

}  // namespace

}  // namespace mirrored::cuda
