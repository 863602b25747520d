// Elementwise passes over activations in their storage type: a type conversion, y += x, the sum of
// two tensors through an activation (a residual join), and the all-reduce's f32 <-> bf16 wire
// packing. The CPU loops (elementwise.cpp, the reference) and the CUDA launchers (elementwise.cu,
// over kernels/cuda/cuda_kernels.cu's kernels, which the peer reduction also uses) side by side.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/device.h"

namespace mirrored {

// y[i] = x[i] converted from xt to yt (on a CPU replica both are f32 storage: y rounded to yt).
void convert_values(Device& d, Stream s, size_t n, const void* x, DType xt, void* y, DType yt);
// y += x, activations (stored in the device's activation type, rounded to its value type).
void add_values(Device& d, Stream s, size_t n, const void* x, void* y);
// y = act(a + b) over rows x cols activations; y may be a.
void add_act_values(Device& d, Stream s, Activation act, int rows, int cols, const void* a, const void* b, void* y);
// f32 <-> bf16 bits (round to nearest even): the all-reduce's halved wire.
void pack_bf16_values(Device& d, Stream s, size_t n, const float* x, uint16_t* y);
void unpack_bf16_values(Device& d, Stream s, size_t n, const uint16_t* x, float* y);

// The CUDA launchers, set by elementwise.cu where the CUDA backend is built; each returns the
// kernels it launched.
struct ElementwiseKernels {
    int (*convert)(const Device::NativeLaunch& l, size_t n, const void* x, DType xt, void* y, DType yt) = nullptr;
    int (*add)(const Device::NativeLaunch& l, size_t n, const void* x, void* y) = nullptr;
};
extern ElementwiseKernels elementwise_cuda;

}  // namespace mirrored
