// Activations and biases over rows of activations: z += bias, out = act(z) (the forward of a dense,
// convolution or embedding layer, and the activation after a join or a normalisation); the
// activation's backward; a bias's gradient, the column sums. The CPU loops (activation.cpp, the
// reference, in kernels/cpu/act_loops.h) and the CUDA launchers (activation.cu, over
// kernels/cuda/cuda_kernels.cu's kernels, which the fused products fall back to) side by side.
#pragma once

#include <cstddef>

#include "kernels/device.h"

namespace mirrored {

// z[rows,cols] += bias[cols] (bias may be null); out = act(z) (out may equal z).
void bias_activation(Device& d, Stream s, Activation act, int rows, int cols, const float* bias, void* z, void* out);
// dz = dout * act'(z); dz may alias dout. ReLU may be given its output as z (the same sign test).
void activation_backward(Device& d, Stream s, Activation act, size_t n, const void* z, const void* dout, void* dz);
// db[cols] (+)= the column sums of dz[rows,cols], in a fixed order.
void bias_gradient(Device& d, Stream s, int rows, int cols, const void* dz, float* db, bool accumulate);

namespace cpu {  // the same on f32 host memory, stored values rounded to t
void bias_activation(DType t, Activation act, int rows, int cols, const float* bias, float* z, float* out);
void bias_gradient(int rows, int cols, const float* dz, float* db, bool accumulate);
}  // namespace cpu

// The CUDA launchers, set by activation.cu where the CUDA backend is built; each returns the
// kernels it launched.
struct ActivationKernels {
    int (*bias_act)(const Device::NativeLaunch& l, Activation act, int rows, int cols, const float* bias, void* z,
                    void* out) = nullptr;
    int (*backward)(const Device::NativeLaunch& l, Activation act, size_t n, const void* z, const void* dout,
                    void* dz) = nullptr;
    int (*bias_grad)(const Device::NativeLaunch& l, int rows, int cols, const void* dz, float* db,
                     bool accumulate) = nullptr;
};
extern ActivationKernels activation_cuda;

}  // namespace mirrored
