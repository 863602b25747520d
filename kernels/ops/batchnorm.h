// Batch normalisation's per-channel passes over rows of [rows, c] (channels last): the sums a
// batch's statistics come from, the statistics, the affine map and its backward, and the running
// statistics' moving average. Statistics in f32; a stored result rounded once to the storage type.
// The CPU loops (batchnorm.cpp over kernels/cpu/cnn_loops.h, the reference) and the CUDA kernels
// (batchnorm.cu; the sums by the fixed-order column reduction) side by side.
#pragma once

#include "kernels/device.h"

namespace mirrored {

// out[c] = sum over rows of (x - shift[c]) (shift may be null), squared when `squares`.
void channel_sums(Device& d, Stream s, int rows, int c, const void* x, const float* shift, bool squares, float* out);
// Batch statistics from sums over a.count values: mean = sum / count and, when sqsum is given
// (squares about that mean), invstd = 1 / sqrt(sqsum / count + eps); the running statistics'
// contributions (may be null) += a.weight * mean and a.weight * unbiased var.
void bn_finalize(Device& d, Stream s, const BnStats& a, const float* sum, const float* sqsum, float* mean,
                 float* invstd, float* run_mean, float* run_var);
// invstd = 1 / sqrt(var + eps) (evaluation with running statistics)
void rsqrt_eps(Device& d, Stream s, int c, const float* var, float eps, float* invstd);
// y = act(gamma * (x - mean) * invstd + beta), per channel; the activation by bias_act_forward in
// place, except on CPU replicas in f32 with ReLU: one pass, the same arithmetic.
void channel_affine(Device& d, Stream s, Activation act, int rows, int c, const void* x, const float* mean,
                    const float* invstd, const float* gamma, const float* beta, void* y);
// out[0..c) = sum dy, out[c..2c) = sum dy * (x - mean) * invstd
void bn_backward_sums(Device& d, Stream s, int rows, int c, const void* dy, const void* x, const float* mean,
                      const float* invstd, float* out);
// dx = gamma * invstd * (dy - sums[ch] / count - xhat * sums[c + ch] / count)
void bn_backward_dx(Device& d, Stream s, int rows, int c, const void* dy, const void* x, const float* mean,
                    const float* invstd, const float* gamma, const float* sums, double count, void* dx);
// running = (1 - momentum) * running + momentum * batch (running statistics)
void ema_update(Device& d, Stream s, size_t n, float momentum, const float* batch, float* running);

// The CUDA launchers, set by batchnorm.cu where the CUDA backend is built; each returns the
// kernels it launched.
struct BatchnormKernels {
    int (*channel_sums)(const Device::NativeLaunch& l, int rows, int c, const void* x, const float* shift, bool squares,
                        float* out) = nullptr;
    int (*finalize)(const Device::NativeLaunch& l, const BnStats& a, const float* sum, const float* sqsum, float* mean,
                    float* invstd, float* run_mean, float* run_var) = nullptr;
    int (*rsqrt_eps)(const Device::NativeLaunch& l, int c, const float* var, float eps, float* invstd) = nullptr;
    int (*affine)(const Device::NativeLaunch& l, int rows, int c, const void* x, const float* mean, const float* invstd,
                  const float* gamma, const float* beta, void* y) = nullptr;
    int (*backward_sums)(const Device::NativeLaunch& l, int rows, int c, const void* dy, const void* x,
                         const float* mean, const float* invstd, float* out) = nullptr;
    int (*backward_dx)(const Device::NativeLaunch& l, int rows, int c, const void* dy, const void* x, const float* mean,
                       const float* invstd, const float* gamma, const float* sums, double count, void* dx) = nullptr;
    int (*ema_update)(const Device::NativeLaunch& l, size_t n, float momentum, const float* batch,
                      float* running) = nullptr;
};
extern BatchnormKernels batchnorm_cuda;

}  // namespace mirrored
