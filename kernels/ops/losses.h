// The losses' ops: softmax cross-entropy against class labels, and element-wise losses against
// float targets (mse, bce). Each writes the logits' gradient (already scaled for the backward)
// and adds its sums to metrics on the device, read by the host only when logging. The CPU loops
// (losses.cpp, the reference) and the CUDA kernels (losses.cu) side by side.
#pragma once

#include "kernels/device.h"

namespace mirrored {

// Fused softmax + cross-entropy over logits[rows,classes] with int labels, in f32.
// dlogits = (softmax - onehot) * grad_scale * (*loss_scale) (skipped when dlogits is null;
// loss_scale, device memory, may be null; dlogits apart from logits); metrics[kMetricLossSum]
// += sum of per-row losses, [kMetricCorrect] += correct argmax, [kMetricCount] += rows.
void softmax_xent(Device& d, Stream s, int rows, int classes, const void* logits, const int32_t* labels,
                  float grad_scale, const float* loss_scale, void* dlogits, double* metrics);
// A loss of logits[rows, n] against float targets[rows, n], element by element (mse: (z - t)^2,
// gradient 2 (z - t); bce: max(z, 0) - z t + log(1 + exp(-|z|)), gradient sigmoid(z) - t). A
// row's loss is the mean over its n outputs, so that the sum over rows divided by the rows is
// PyTorch's mean over every element; dlogits = gradient / n * grad_scale * (*loss_scale)
// (skipped when null). metrics[kMetricLossSum] += row losses, [kMetricCorrect] += for bce the
// share of a row's outputs where (z > 0) == (t > 0.5) (0 for mse), [kMetricCount] += rows.
void target_loss(Device& d, Stream s, TargetLoss kind, int rows, int n, const void* logits, const float* targets,
                 float grad_scale, const float* loss_scale, void* dlogits, double* metrics);

// The CUDA launchers, set by losses.cu where the CUDA backend is built; each returns the kernels
// it launched (per-row sums in the compute stream's scratch: a DeviceError past its rows).
struct LossKernels {
    int (*softmax_xent)(const Device::NativeLaunch& l, int rows, int classes, const void* logits, const int32_t* labels,
                        float grad_scale, const float* loss_scale, void* dlogits, double* metrics) = nullptr;
    int (*target_loss)(const Device::NativeLaunch& l, TargetLoss kind, int rows, int n, const void* logits,
                       const float* targets, float grad_scale, const float* loss_scale, void* dlogits,
                       double* metrics) = nullptr;
};
extern LossKernels loss_cuda;

}  // namespace mirrored
