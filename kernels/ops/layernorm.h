// Layer normalisation over the last axis (torch.nn.LayerNorm(c)): each row of c values becomes
// y = gamma xhat + beta, xhat = (x - mean) rstd; the row's mean and rstd are kept for backward.
// The CPU loops (layernorm.cpp, the reference) and the CUDA kernels (layernorm.cu) side by side.
#pragma once

#include "kernels/device.h"

namespace mirrored {

void layernorm_forward(Device& d, Stream s, int rows, int c, float eps, const void* x, const float* gamma,
                       const float* beta, void* y, float* mean, float* rstd);
// dx (may be null: not needed), and dgamma/dbeta (+)= their column sums.
void layernorm_backward(Device& d, Stream s, int rows, int c, const void* dy, const void* x, const float* mean,
                        const float* rstd, const float* gamma, void* dx, float* dgamma, float* dbeta, bool accumulate);

// The CUDA launchers, set by layernorm.cu where the CUDA backend is built; each returns the
// kernels it launched.
struct LayernormKernels {
    int (*forward)(const Device::NativeLaunch& l, int rows, int c, float eps, const void* x, const float* gamma,
                   const float* beta, void* y, float* mean, float* rstd) = nullptr;
    int (*backward)(const Device::NativeLaunch& l, int rows, int c, const void* dy, const void* x, const float* mean,
                    const float* rstd, const float* gamma, void* dx, float* dgamma, float* dbeta,
                    bool accumulate) = nullptr;
};
extern LayernormKernels layernorm_cuda;

}  // namespace mirrored
