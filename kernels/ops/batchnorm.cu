// Batch normalisation's CUDA kernels (batchnorm.h): the sums by the fixed-order column reduction
// (the same order on every GPU and replica count), the element-wise passes one thread per value.
#include "kernels/cuda/kernel_util.cuh"
#include "kernels/op_math.h"
#include "kernels/ops/batchnorm.h"

namespace mirrored::cuda {

namespace {

template <typename T>
struct ShiftedSum {
    const T* x;
    int c;
    const float* shift;
    bool squares;
    __device__ void operator()(int r, int ch, float& a, float&) const {
        const float v = ld(x, size_t(r) * c + ch) - (shift ? shift[ch] : 0.0f);
        a += squares ? v * v : v;
    }
};

int sums(const Device::NativeLaunch& l, int rows, int c, const void* x, const float* shift, bool squares, float* out) {
    const cudaStream_t s = stream_of(l);
    DISPATCH(l.act, return column_reduce(s, l.device, rows, c, ShiftedSum<T>{as<T>(x), c, shift, squares}, l.scratch,
                                         out, nullptr, false));
    return 0;
}

__global__ void bn_finalize_kernel(BnStats a, const float* sum, const float* sqsum, float* mean, float* invstd,
                                   float* run_mean, float* run_var) {
    GRID_LOOP(ch, size_t(a.channels)) bn_finalize_channel(a, int(ch), sum, sqsum, mean, invstd, run_mean, run_var);
}

int finalize(const Device::NativeLaunch& l, const BnStats& a, const float* sum, const float* sqsum, float* mean,
             float* invstd, float* run_mean, float* run_var) {
    if (a.channels <= 0) return 0;
    const cudaStream_t s = stream_of(l);
    bn_finalize_kernel<<<grid_for(size_t(a.channels)), kThreads, 0, s>>>(a, sum, sqsum, mean, invstd, run_mean,
                                                                         run_var);
    CUDA_LAUNCH_CHECK(l.device);
    return 1;
}

__global__ void rsqrt_eps_kernel(int c, const float* var, float eps, float* invstd) {
    GRID_LOOP(ch, size_t(c)) invstd[ch] = bn_invstd(var[ch], eps);
}

int rsqrt(const Device::NativeLaunch& l, int c, const float* var, float eps, float* invstd) {
    if (c <= 0) return 0;
    rsqrt_eps_kernel<<<grid_for(size_t(c)), kThreads, 0, stream_of(l)>>>(c, var, eps, invstd);
    CUDA_LAUNCH_CHECK(l.device);
    return 1;
}

template <typename T>
__global__ void channel_affine_kernel(int rows, int c, const T* x, const float* mean, const float* invstd,
                                      const float* gamma, const float* beta, T* y) {
    GRID_LOOP(i, size_t(rows) * c) {
        const int ch = int(i % c);
        st(y, i, gamma[ch] * ((ld(x, i) - mean[ch]) * invstd[ch]) + beta[ch]);
    }
}

int affine(const Device::NativeLaunch& l, int rows, int c, const void* x, const float* mean, const float* invstd,
           const float* gamma, const float* beta, void* y) {
    if (rows <= 0 || c <= 0) return 0;
    const cudaStream_t s = stream_of(l);
    DISPATCH(l.act, channel_affine_kernel<<<grid_for(size_t(rows) * c), kThreads, 0, s>>>(
                        rows, c, as<T>(x), mean, invstd, gamma, beta, as<T>(y)));
    CUDA_LAUNCH_CHECK(l.device);
    return 1;
}

template <typename T>
struct BnGradSums {
    const T* dy;
    const T* x;
    int c;
    const float* mean;
    const float* invstd;
    __device__ void operator()(int r, int ch, float& a, float& b) const {
        const size_t e = size_t(r) * c + ch;
        const float d = ld(dy, e);
        a += d;
        b += d * ((ld(x, e) - mean[ch]) * invstd[ch]);
    }
};

int backward_sums(const Device::NativeLaunch& l, int rows, int c, const void* dy, const void* x, const float* mean,
                  const float* invstd, float* out) {
    const cudaStream_t s = stream_of(l);
    DISPATCH(l.act, return column_reduce(s, l.device, rows, c, BnGradSums<T>{as<T>(dy), as<T>(x), c, mean, invstd},
                                         l.scratch, out, out + c, false));
    return 0;
}

template <typename T>
__global__ void bn_backward_dx_kernel(int rows, int c, const T* dy, const T* x, const float* mean, const float* invstd,
                                      const float* gamma, const float* sums, float inv_count, T* dx) {
    GRID_LOOP(i, size_t(rows) * c) {
        const int ch = int(i % c);
        const float xhat = (ld(x, i) - mean[ch]) * invstd[ch];
        st(dx, i, gamma[ch] * invstd[ch] * (ld(dy, i) - sums[ch] * inv_count - xhat * (sums[c + ch] * inv_count)));
    }
}

int backward_dx(const Device::NativeLaunch& l, int rows, int c, const void* dy, const void* x, const float* mean,
                const float* invstd, const float* gamma, const float* sums, double count, void* dx) {
    if (rows <= 0 || c <= 0) return 0;
    const cudaStream_t s = stream_of(l);
    DISPATCH(l.act, bn_backward_dx_kernel<<<grid_for(size_t(rows) * c), kThreads, 0, s>>>(
                        rows, c, as<T>(dy), as<T>(x), mean, invstd, gamma, sums, float(1.0 / count), as<T>(dx)));
    CUDA_LAUNCH_CHECK(l.device);
    return 1;
}

__global__ void ema_kernel(size_t n, float momentum, const float* batch, float* running) {
    GRID_LOOP(i, n) running[i] = ema(running[i], batch[i], momentum);
}

int ema_update(const Device::NativeLaunch& l, size_t n, float momentum, const float* batch, float* running) {
    if (n == 0) return 0;
    ema_kernel<<<grid_for(n), kThreads, 0, stream_of(l)>>>(n, momentum, batch, running);
    CUDA_LAUNCH_CHECK(l.device);
    return 1;
}

const struct Register {
    Register() { batchnorm_cuda = {sums, finalize, rsqrt, affine, backward_sums, backward_dx, ema_update}; }
} registered;

}  // namespace

}  // namespace mirrored::cuda
