// The optimizers' update ops: SGD (momentum, Nesterov, L2 weight decay, as torch.optim.SGD) and
// AdamW (decoupled weight decay, as torch.optim.AdamW), each one fused pass over flat f32 buffers
// that also applies clipping, the loss scale and the skip of a non-finite step (SgdArgs and
// AdamWArgs, kernels/device.h, read those from device memory); the shared-parameter forms that
// sum the replicas' gradients as they update; and fp16's dynamic loss scale. The CPU loops
// (optimizer.cpp, the reference) and the CUDA kernels (optimizer.cu) side by side.
#pragma once

#include "kernels/device.h"

namespace mirrored {

void sgd_update(Device& d, Stream s, size_t n, float* param, const float* grad, float* momentum, const SgdArgs& a);
void adamw_update(Device& d, Stream s, size_t n, float* param, const float* grad, float* m, float* v,
                  const AdamWArgs& a);

// The shared-parameter update of [offset, offset + n) in one call: the gradient is what
// sum_into(grads, count, into, offset, n) sums, the step what sgd_update (adamw_update)
// takes with it; param and the optimizer state point at the slice. Whether grads[into] holds the
// sum afterwards is unspecified: a GPU makes the two calls, a CPU replica one pass that never
// stores the sum (the same bits).
void summed_sgd_update(Device& d, Stream s, float* const* grads, int count, int into, size_t offset, size_t n,
                       float* param, float* momentum, const SgdArgs& a);
void summed_adamw_update(Device& d, Stream s, float* const* grads, int count, int into, size_t offset, size_t n,
                         float* param, float* m, float* v, const AdamWArgs& a);

// Dynamic loss scaling: state = [scale, good steps]. An overflow (grad_stats[1] > 0) halves the
// scale and restarts the count; growth_interval good steps in a row double it.
void loss_scale_update(Device& d, Stream s, float* state, const float* grad_stats, int growth_interval);

// The CUDA launchers, set by optimizer.cu where the CUDA backend is built; each returns the
// kernels it launched.
struct OptimizerKernels {
    int (*sgd)(const Device::NativeLaunch& l, size_t n, float* p, const float* g, float* m, const SgdArgs& a) = nullptr;
    int (*adamw)(const Device::NativeLaunch& l, size_t n, float* p, const float* g, float* m, float* v,
                 const AdamWArgs& a) = nullptr;
    int (*loss_scale)(const Device::NativeLaunch& l, float* state, const float* grad_stats,
                      int growth_interval) = nullptr;
};
extern OptimizerKernels optimizer_cuda;

}  // namespace mirrored
