// RMSNorm's CUDA kernels (rmsnorm.h): one warp per row, lanes striding it and a butterfly summing
// (the same sum in every lane); dgamma by the fixed-order column reduction.
#include "kernels/cuda/kernel_util.cuh"
#include "kernels/ops/rmsnorm.h"

namespace mirrored::cuda {

namespace {

template <typename T>
__global__ void rmsnorm_forward_kernel(int rows, int c, float eps, const T* x, const float* gamma, T* y, float* rstd) {
    const int row = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
    if (row >= rows) return;
    const size_t base = size_t(row) * c;
    float q = 0.0f;
    for (int j = lane; j < c; j += 32) {
        const float v = ld(x, base + j);
        q += v * v;
    }
    const float rs = bn_invstd(warp_sum(q) / float(c), eps);
    if (lane == 0) rstd[row] = rs;
    for (int j = lane; j < c; j += 32) st(y, base + j, gamma[j] * (ld(x, base + j) * rs));
}

int forward(const Device::NativeLaunch& l, int rows, int c, float eps, const void* x, const float* gamma, void* y,
            float* rstd) {
    if (rows <= 0 || c <= 0) return 0;
    const cudaStream_t s = stream_of(l);
    DISPATCH(l.act, rmsnorm_forward_kernel<<<warp_rows_grid(rows), kThreads, 0, s>>>(rows, c, eps, as<T>(x), gamma,
                                                                                     as<T>(y), rstd));
    CUDA_LAUNCH_CHECK(l.device);
    return 1;
}

template <typename T>
__global__ void rmsnorm_dx_kernel(int rows, int c, const T* dy, const T* x, const float* rstd, const float* gamma,
                                  T* dx) {
    const int row = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
    if (row >= rows) return;
    const size_t base = size_t(row) * c;
    const float rs = rstd[row];
    float b = 0.0f;
    for (int j = lane; j < c; j += 32) b += gamma[j] * ld(dy, base + j) * (ld(x, base + j) * rs);
    const float mb = warp_sum(b) / float(c);
    for (int j = lane; j < c; j += 32)
        st(dx, base + j, rs * (gamma[j] * ld(dy, base + j) - (ld(x, base + j) * rs) * mb));
}

template <typename T>
struct RmsGammaGrad {
    const T* dy;
    const T* x;
    int c;
    const float* rstd;
    __device__ void operator()(int r, int ch, float& a, float&) const {
        const size_t e = size_t(r) * c + ch;
        a += ld(dy, e) * (ld(x, e) * rstd[r]);
    }
};

int backward(const Device::NativeLaunch& l, int rows, int c, const void* dy, const void* x, const float* rstd,
             const float* gamma, void* dx, float* dgamma, bool accumulate) {
    if (rows <= 0 || c <= 0) return 0;
    const cudaStream_t s = stream_of(l);
    DISPATCH(l.act, {
        int launches = 0;
        if (dx) {
            rmsnorm_dx_kernel<<<warp_rows_grid(rows), kThreads, 0, s>>>(rows, c, as<T>(dy), as<T>(x), rstd, gamma,
                                                                        as<T>(dx));
            CUDA_LAUNCH_CHECK(l.device);
            ++launches;
        }
        return launches + column_reduce(s, l.device, rows, c, RmsGammaGrad<T>{as<T>(dy), as<T>(x), c, rstd}, l.scratch,
                                        dgamma, nullptr, accumulate);
    });
    return 0;
}

const struct Register {
    Register() { rmsnorm_cuda = {forward, backward}; }
} registered;

}  // namespace

}  // namespace mirrored::cuda
