// The optimizers' CUDA kernels (optimizer.h): one fused pass over the flat buffers each.
#include "kernels/cuda/kernel_util.cuh"
#include "kernels/ops/optimizer.h"

namespace mirrored::cuda {

namespace {

cudaStream_t stream(const Device::NativeLaunch& l) { return stream_of(l); }

__global__ void sgd_kernel(size_t n, float* p, const float* g, float* m, SgdArgs a) {
    if (skip_step(a.skip_nonfinite, a.grad_stats)) return;  // an overflow: every thread skips
    const float f = grad_factor(a.clip_norm, a.grad_stats, a.loss_scale);
    const float lr = sgd_lr(a);
    GRID_LOOP(i, n) {
        float d = g[i] * f + a.weight_decay * p[i];
        if (a.momentum != 0.0f) {
            const float mi = a.momentum * m[i] + d;
            m[i] = mi;
            d = a.nesterov ? d + a.momentum * mi : mi;
        }
        p[i] -= lr * d;
    }
}

int sgd(const Device::NativeLaunch& l, size_t n, float* p, const float* g, float* m, const SgdArgs& a) {
    if (n == 0) return 0;
    sgd_kernel<<<grid_for(n), kThreads, 0, stream(l)>>>(n, p, g, m, a);
    CUDA_LAUNCH_CHECK(l.device);
    return 1;
}

__global__ void adamw_kernel(size_t n, float* p, const float* g, float* m, float* v, AdamWArgs a, float bc1,
                             float bc2_sqrt) {
    if (skip_step(a.skip_nonfinite, a.grad_stats)) return;
    const float f = grad_factor(a.clip_norm, a.grad_stats, a.loss_scale);
    if (a.values) {  // a replayed step: this step's values are in device memory
        bc1 = a.values->adamw_bc1;
        bc2_sqrt = a.values->adamw_bc2_sqrt;
    }
    const float lr = a.values ? a.values->lr : a.lr;
    const float step_size = lr / bc1;
    const float decay = 1.0f - lr * a.weight_decay;
    GRID_LOOP(i, n) {
        const float gi = g[i] * f;
        const float mi = a.beta1 * m[i] + (1.0f - a.beta1) * gi;
        const float vi = a.beta2 * v[i] + (1.0f - a.beta2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        p[i] = p[i] * decay - step_size * mi / (sqrtf(vi) / bc2_sqrt + a.eps);
    }
}

int adamw(const Device::NativeLaunch& l, size_t n, float* p, const float* g, float* m, float* v, const AdamWArgs& a) {
    if (n == 0) return 0;
    const AdamWCorrections c = adamw_corrections(a);  // on the host: two pow()s per call, not per thread
    adamw_kernel<<<grid_for(n), kThreads, 0, stream(l)>>>(n, p, g, m, v, a, c.bc1, c.bc2_sqrt);
    CUDA_LAUNCH_CHECK(l.device);
    return 1;
}

__global__ void loss_scale_kernel(float* state, const float* grad_stats, int growth_interval) {
    if (threadIdx.x == 0 && blockIdx.x == 0) loss_scale_step(state, grad_stats, growth_interval);
}

int loss_scale(const Device::NativeLaunch& l, float* state, const float* grad_stats, int growth_interval) {
    loss_scale_kernel<<<1, 32, 0, stream(l)>>>(state, grad_stats, growth_interval);
    CUDA_LAUNCH_CHECK(l.device);
    return 1;
}

const struct Register {
    Register() { optimizer_cuda = {sgd, adamw, loss_scale}; }
} registered;

}  // namespace

}  // namespace mirrored::cuda
