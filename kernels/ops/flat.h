// Passes over flat f32 buffers - parameters, gradients, optimizer state: fill, scale, y += a x,
// the squared norm with the overflow count, parameter initialisation, the replicas' checksum, and
// a step's values carried into device memory. The CPU loops (flat.cpp, the reference) and the CUDA
// launchers (flat.cu, over kernels/cuda/cuda_kernels.cu's kernels) side by side.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/device.h"

namespace mirrored {

void fill_floats(Device& d, Stream s, size_t n, float value, float* x);
void scale_floats(Device& d, Stream s, size_t n, float alpha, float* x);
void axpy_floats(Device& d, Stream s, size_t n, float alpha, const float* x, float* y);  // y += a x
// A step's values into device memory, carried by the call itself (a kernel argument on CUDA): no
// host memory is read after the call returns, so no pageable copy and no host wait.
void set_step_values(Device& d, Stream s, const StepValues& v, StepValues* dst);
// out[0] = sum of (x / loss_scale)^2 (loss_scale: device, may be null for 1), out[1] = the number
// of non-finite x: the gradient norm and the overflow test of loss scaling in one pass. The same
// summation order on every GPU (a grid fixed by n), so replicas on two GPU models clip alike.
void sum_squares(Device& d, Stream s, size_t n, const float* x, const float* loss_scale, float* out);
// out[i] = the initial value i of a tensor (kernels/op_math.h init_value: a function of seed,
// tensor and index, the same on every backend).
void init_param_values(Device& d, Stream s, const InitArgs& a, size_t n, float* out);
// Order-independent 64-bit fingerprint of the bits of x[0..n), written to *out (device).
void checksum_floats(Device& d, Stream s, size_t n, const float* x, uint64_t* out);

// The CUDA launchers, set by flat.cu where the CUDA backend is built; each returns the kernels it
// launched.
struct FlatKernels {
    int (*fill)(const Device::NativeLaunch& l, size_t n, float value, float* x) = nullptr;
    int (*scale)(const Device::NativeLaunch& l, size_t n, float alpha, float* x) = nullptr;
    int (*axpy)(const Device::NativeLaunch& l, size_t n, float alpha, const float* x, float* y) = nullptr;
    int (*step_values)(const Device::NativeLaunch& l, const StepValues& v, StepValues* dst) = nullptr;
    int (*sum_squares)(const Device::NativeLaunch& l, size_t n, const float* x, const float* loss_scale,
                       float* out) = nullptr;
    int (*init)(const Device::NativeLaunch& l, const InitArgs& a, size_t n, float* out) = nullptr;
    int (*checksum)(const Device::NativeLaunch& l, size_t n, const float* x, uint64_t* out) = nullptr;
};
extern FlatKernels flat_cuda;

}  // namespace mirrored
