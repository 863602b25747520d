// Layer normalisation's CUDA kernels (layernorm.h): one warp per row; lanes stride the row and a
// butterfly sums it (the same sum in every lane); dgamma and dbeta by the fixed-order column
// reduction.
#include "kernels/cuda/kernel_util.cuh"
#include "kernels/ops/layernorm.h"

namespace mirrored::cuda {

namespace {

template <typename T>
__global__ void layernorm_forward_kernel(int rows, int c, float eps, const T* x, const float* gamma, const float* beta,
                                         T* y, float* mean, float* rstd) {
    const int row = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
    if (row >= rows) return;
    const size_t base = size_t(row) * c;
    float s = 0.0f;
    for (int j = lane; j < c; j += 32) s += ld(x, base + j);
    const float m = warp_sum(s) / float(c);
    float q = 0.0f;
    for (int j = lane; j < c; j += 32) {
        const float d = ld(x, base + j) - m;
        q += d * d;
    }
    const float rs = bn_invstd(warp_sum(q) / float(c), eps);
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = rs;
    }
    for (int j = lane; j < c; j += 32) st(y, base + j, gamma[j] * ((ld(x, base + j) - m) * rs) + beta[j]);
}

int forward(const Device::NativeLaunch& l, int rows, int c, float eps, const void* x, const float* gamma,
            const float* beta, void* y, float* mean, float* rstd) {
    if (rows <= 0 || c <= 0) return 0;
    const cudaStream_t s = stream_of(l);
    DISPATCH(l.act, layernorm_forward_kernel<<<warp_rows_grid(rows), kThreads, 0, s>>>(rows, c, eps, as<T>(x), gamma,
                                                                                       beta, as<T>(y), mean, rstd));
    CUDA_LAUNCH_CHECK(l.device);
    return 1;
}

template <typename T>
__global__ void layernorm_dx_kernel(int rows, int c, const T* dy, const T* x, const float* mean, const float* rstd,
                                    const float* gamma, T* dx) {
    const int row = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
    if (row >= rows) return;
    const size_t base = size_t(row) * c;
    float a = 0.0f, b = 0.0f;
    for (int j = lane; j < c; j += 32) {
        const float gd = gamma[j] * ld(dy, base + j);
        a += gd;
        b += gd * ((ld(x, base + j) - mean[row]) * rstd[row]);
    }
    const float ma = warp_sum(a) / float(c), mb = warp_sum(b) / float(c);
    for (int j = lane; j < c; j += 32) {
        const float xhat = (ld(x, base + j) - mean[row]) * rstd[row];
        st(dx, base + j, rstd[row] * (gamma[j] * ld(dy, base + j) - ma - xhat * mb));
    }
}

template <typename T>
struct LnParamGrads {
    const T* dy;
    const T* x;
    int c;
    const float* mean;
    const float* rstd;
    __device__ void operator()(int r, int ch, float& a, float& b) const {
        const size_t e = size_t(r) * c + ch;
        const float d = ld(dy, e);
        a += d * ((ld(x, e) - mean[r]) * rstd[r]);  // dgamma
        b += d;                                     // dbeta
    }
};

int backward(const Device::NativeLaunch& l, int rows, int c, const void* dy, const void* x, const float* mean,
             const float* rstd, const float* gamma, void* dx, float* dgamma, float* dbeta, bool accumulate) {
    if (rows <= 0 || c <= 0) return 0;
    const cudaStream_t s = stream_of(l);
    const int dev = l.device;
    DISPATCH(l.act, {
        int launches = 0;
        if (dx) {
            layernorm_dx_kernel<<<warp_rows_grid(rows), kThreads, 0, s>>>(rows, c, as<T>(dy), as<T>(x), mean, rstd,
                                                                          gamma, as<T>(dx));
            CUDA_LAUNCH_CHECK(dev);
            ++launches;
        }
        return launches + column_reduce(s, dev, rows, c, LnParamGrads<T>{as<T>(dy), as<T>(x), c, mean, rstd}, l.scratch,
                                        dgamma, dbeta, accumulate);
    });
    return 0;
}

const struct Register {
    Register() { layernorm_cuda = {forward, backward}; }
} registered;

}  // namespace

}  // namespace mirrored::cuda
