// Dropout (torch.nn.Dropout in training): element (row, col) kept, and scaled by 1 / (1 - rate),
// where its draw says so - a pure function of (seed, layer, step, global row, col) (Philox4x32-10,
// kernels/op_math.h dropout_keep), so N replicas draw exactly the masks one replica would for the
// same global batch, and the backward applies the forward's mask without storing it. In place
// (y == x) too. The CPU loops (dropout.cpp, the reference) and the CUDA kernel (dropout.cu).
#pragma once

#include "kernels/device.h"

namespace mirrored {

void dropout_forward(Device& d, Stream s, const DropoutArgs& a, int rows, int cols, const void* x, void* y);
void dropout_backward(Device& d, Stream s, const DropoutArgs& a, int rows, int cols, const void* dy, void* dx);

// The CUDA launcher, set by dropout.cu where the CUDA backend is built (forward and backward are
// the same mask and scale); returns the kernels it launched.
struct DropoutKernels {
    int (*apply)(const Device::NativeLaunch& l, const DropoutArgs& a, int rows, int cols, const void* x,
                 void* y) = nullptr;
};
extern DropoutKernels dropout_cuda;

}  // namespace mirrored
