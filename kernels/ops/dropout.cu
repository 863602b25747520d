// Dropout's CUDA kernel (dropout.h): one thread per element, its draw recomputed from its index.
#include "kernels/cuda/kernel_util.cuh"
#include "kernels/ops/dropout.h"

namespace mirrored::cuda {

namespace {

template <typename T>
__global__ void dropout_kernel(DropoutArgs a, int rows, int cols, const T* x, T* y) {
    const float keep_scale = 1.0f / (1.0f - a.rate);
    const uint32_t step = dropout_step(a);
    GRID_LOOP(i, size_t(rows) * cols) {
        const int row = static_cast<int>(i / cols), col = static_cast<int>(i % cols);
        st(y, i,
           dropout_keep(a.seed, a.layer_id, step, a.row_offset + row, cols, col, a.rate) ? ld(x, i) * keep_scale
                                                                                         : 0.0f);
    }
}

int apply(const Device::NativeLaunch& l, const DropoutArgs& a, int rows, int cols, const void* x, void* y) {
    if (rows <= 0 || cols <= 0) return 0;
    const cudaStream_t s = stream_of(l);
    DISPATCH(l.act,
             dropout_kernel<<<grid_for(size_t(rows) * cols), kThreads, 0, s>>>(a, rows, cols, as<T>(x), as<T>(y)));
    CUDA_LAUNCH_CHECK(l.device);
    return 1;
}

const struct Register {
    Register() { dropout_cuda = {apply}; }
} registered;

}  // namespace

}  // namespace mirrored::cuda
