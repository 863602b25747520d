// SwiGLU's CUDA kernels (swiglu.h): elementwise, one thread per output.
#include "kernels/cuda/kernel_util.cuh"
#include "kernels/ops/swiglu.h"

namespace mirrored::cuda {

namespace {

template <typename T>
__global__ void swiglu_forward_kernel(int64_t n, int w, const T* gu, T* out) {
    GRID_LOOP(i, size_t(n)) {
        const size_t g_at = (i / w) * 2 * w + i % w;
        const float g = ld(gu, g_at);
        st(out, i, g * swiglu_sigmoid(g) * ld(gu, g_at + w));
    }
}

template <typename T>
__global__ void swiglu_backward_kernel(int64_t n, int w, const T* gu, const T* dout, T* dgu) {
    GRID_LOOP(i, size_t(n)) {
        const size_t g_at = (i / w) * 2 * w + i % w;
        const float g = ld(gu, g_at), u = ld(gu, g_at + w), d = ld(dout, i), sg = swiglu_sigmoid(g);
        st(dgu, g_at, d * u * (sg * (1.0f + g * (1.0f - sg))));
        st(dgu, g_at + w, d * (g * sg));
    }
}

int forward(const Device::NativeLaunch& l, int rows, int w, const void* gate_up, void* out) {
    const int64_t n = int64_t(rows) * w;
    if (n <= 0) return 0;
    const cudaStream_t s = stream_of(l);
    DISPATCH(l.act, swiglu_forward_kernel<<<grid_for(size_t(n)), kThreads, 0, s>>>(n, w, as<T>(gate_up), as<T>(out)));
    CUDA_LAUNCH_CHECK(l.device);
    return 1;
}

int backward(const Device::NativeLaunch& l, int rows, int w, const void* gate_up, const void* dout, void* dgate_up) {
    const int64_t n = int64_t(rows) * w;
    if (n <= 0) return 0;
    const cudaStream_t s = stream_of(l);
    DISPATCH(l.act, swiglu_backward_kernel<<<grid_for(size_t(n)), kThreads, 0, s>>>(n, w, as<T>(gate_up), as<T>(dout),
                                                                                    as<T>(dgate_up)));
    CUDA_LAUNCH_CHECK(l.device);
    return 1;
}

const struct Register {
    Register() { swiglu_cuda = {forward, backward}; }
} registered;

}  // namespace

}  // namespace mirrored::cuda
