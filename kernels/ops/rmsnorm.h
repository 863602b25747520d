// Root-mean-square normalisation over the last axis (Llama's RMSNorm, torch.nn.RMSNorm(c)): each
// row of c values becomes y = gamma (x rstd), rstd = 1 / sqrt(mean(x^2) + eps), with no mean
// subtracted and no bias; the row's rstd is kept for backward. Statistics in f32; y rounded once
// to the storage type (Hugging Face's LlamaRMSNorm in bf16 rounds x rstd before the gamma product,
// one rounding more). The CPU loops (rmsnorm.cpp, the reference) and the CUDA kernels
// (rmsnorm.cu) side by side.
#pragma once

#include "kernels/device.h"

namespace mirrored {

void rmsnorm_forward(Device& d, Stream s, int rows, int c, float eps, const void* x, const float* gamma, void* y,
                     float* rstd);
// dx (may be null: not needed) = rstd (gamma dy - xhat mean(gamma dy xhat)), xhat = x rstd;
// dgamma (+)= the column sums of dy xhat.
void rmsnorm_backward(Device& d, Stream s, int rows, int c, const void* dy, const void* x, const float* rstd,
                      const float* gamma, void* dx, float* dgamma, bool accumulate);

// The CUDA launchers, set by rmsnorm.cu where the CUDA backend is built; each returns the kernels
// it launched.
struct RmsnormKernels {
    int (*forward)(const Device::NativeLaunch& l, int rows, int c, float eps, const void* x, const float* gamma,
                   void* y, float* rstd) = nullptr;
    int (*backward)(const Device::NativeLaunch& l, int rows, int c, const void* dy, const void* x, const float* rstd,
                    const float* gamma, void* dx, float* dgamma, bool accumulate) = nullptr;
};
extern RmsnormKernels rmsnorm_cuda;

}  // namespace mirrored
