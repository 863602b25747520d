#include "kernels/ops/optimizer.h"

#include <algorithm>
#include <cmath>

#include "kernels/cpu/loop_clones.h"
#include "kernels/op_math.h"
#include "kernels/ops/peer_sums.h"

namespace mirrored {

OptimizerKernels optimizer_cuda;

namespace {

// The optimizers' passes over the flat buffers, one branch-free loop per variant (the buffers
// never overlap, so they vectorise), built for each vector width (loop_clones.h), as are the
// shared-parameter sums.
CPU_LOOP_CLONES void sgd_loop(size_t n, float* __restrict p, const float* __restrict g, float* __restrict m, float f,
                              const SgdArgs& a) {
    const float wd = a.weight_decay, mom = a.momentum, lr = sgd_lr(a);
    if (mom == 0.0f) {
        for (size_t i = 0; i < n; ++i) p[i] -= lr * (g[i] * f + wd * p[i]);
    } else if (!a.nesterov) {
        for (size_t i = 0; i < n; ++i) {
            m[i] = mom * m[i] + (g[i] * f + wd * p[i]);
            p[i] -= lr * m[i];
        }
    } else {
        for (size_t i = 0; i < n; ++i) {
            const float d = g[i] * f + wd * p[i];
            m[i] = mom * m[i] + d;
            p[i] -= lr * (d + mom * m[i]);
        }
    }
}

// One AdamW step's scalars, resolved once per call (the bias corrections take two pow()s).
struct AdamWStep {
    float step_size, decay, b1, b2, eps, bc2_sqrt;
};

AdamWStep adamw_step(const AdamWArgs& a) {
    const auto [bc1, bc2_sqrt] =
        a.values ? AdamWCorrections{a.values->adamw_bc1, a.values->adamw_bc2_sqrt} : adamw_corrections(a);
    const float lr = a.values ? a.values->lr : a.lr;
    return {lr / bc1, 1.0f - lr * a.weight_decay, a.beta1, a.beta2, a.eps, bc2_sqrt};
}

CPU_LOOP_CLONES void adamw_loop(size_t n, float* __restrict p, const float* __restrict g, float* __restrict m,
                                float* __restrict v, float f, const AdamWStep& st) {
    const float step_size = st.step_size, decay = st.decay, b1 = st.b1, b2 = st.b2, eps = st.eps,
                bc2_sqrt = st.bc2_sqrt;
    for (size_t i = 0; i < n; ++i) {
        const float gi = g[i] * f;
        const float mi = b1 * m[i] + (1.0f - b1) * gi;
        const float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        p[i] = p[i] * decay - step_size * mi / (std::sqrt(vi) / bc2_sqrt + eps);
    }
}

// sum[0, n) = what host_sum_into stores at [at, at + n): the own buffer's value first, then the
// others' in buffer order.
CPU_LOOP_CLONES void sum_block(size_t n, float* __restrict sum, float* const* ptr, int count, int into, size_t at) {
    const float* own = ptr[into] + at;
    const int first = into == 0 ? 1 : 0;  // the first other buffer, added in the same pass
    if (first >= count) {
        for (size_t i = 0; i < n; ++i) sum[i] = own[i];
        return;
    }
    const float* x0 = ptr[first] + at;
    for (size_t i = 0; i < n; ++i) sum[i] = own[i] + x0[i];
    for (int k = first + 1; k < count; ++k) {
        if (k == into) continue;
        const float* x = ptr[k] + at;
        for (size_t i = 0; i < n; ++i) sum[i] += x[i];
    }
}

// Calls update(first, length, gradient) for the blocks of [offset, offset + n), the gradient being
// the replicas' sum over that block, held on the stack: the update reads it from L1, and the sum
// is never written to memory and read back (as sum_into followed by the update would).
template <typename Update>
void for_summed_blocks(float* const* grads, int count, int into, size_t offset, size_t n, Update&& update) {
    alignas(64) float sum[kHostSumBlock];
    for (size_t at = 0; at < n; at += kHostSumBlock) {
        const size_t len = std::min(kHostSumBlock, n - at);
        sum_block(len, sum, grads, count, into, offset + at);
        update(at, len, static_cast<const float*>(sum));
    }
}

}  // namespace

void sgd_update(Device& d, Stream s, size_t n, float* p, const float* g, float* m, const SgdArgs& a) {
    if (d.runs_cuda_kernels()) return launch_cuda(d, s, optimizer_cuda.sgd, "sgd_update", n, p, g, m, a);
    run_on_host(d, s, "sgd_update", [=](const Device&) {
        if (skip_step(a.skip_nonfinite, a.grad_stats)) return;
        sgd_loop(n, p, g, m, grad_factor(a.clip_norm, a.grad_stats, a.loss_scale), a);
    });
}

void adamw_update(Device& d, Stream s, size_t n, float* p, const float* g, float* m, float* v, const AdamWArgs& a) {
    if (d.runs_cuda_kernels()) return launch_cuda(d, s, optimizer_cuda.adamw, "adamw_update", n, p, g, m, v, a);
    run_on_host(d, s, "adamw_update", [=](const Device&) {
        if (skip_step(a.skip_nonfinite, a.grad_stats)) return;
        adamw_loop(n, p, g, m, v, grad_factor(a.clip_norm, a.grad_stats, a.loss_scale), adamw_step(a));
    });
}

void summed_sgd_update(Device& d, Stream s, float* const* grads, int count, int into, size_t offset, size_t n, float* p,
                       float* m, const SgdArgs& a) {
    if (d.asynchronous()) {  // a GPU (or a simulated one): the reduce-scatter half, then the update
        sum_into(d, s, grads, count, into, offset, n);
        return sgd_update(d, s, n, p, grads[into] + offset, m, a);
    }
    if (skip_step(a.skip_nonfinite, a.grad_stats)) return;
    const float f = grad_factor(a.clip_norm, a.grad_stats, a.loss_scale);
    for_summed_blocks(grads, count, into, offset, n, [&](size_t at, size_t len, const float* g) {
        sgd_loop(len, p + at, g, m ? m + at : nullptr, f, a);
    });
}

void summed_adamw_update(Device& d, Stream s, float* const* grads, int count, int into, size_t offset, size_t n,
                         float* p, float* m, float* v, const AdamWArgs& a) {
    if (d.asynchronous()) {
        sum_into(d, s, grads, count, into, offset, n);
        return adamw_update(d, s, n, p, grads[into] + offset, m, v, a);
    }
    if (skip_step(a.skip_nonfinite, a.grad_stats)) return;
    const float f = grad_factor(a.clip_norm, a.grad_stats, a.loss_scale);
    const AdamWStep st = adamw_step(a);
    for_summed_blocks(grads, count, into, offset, n, [&](size_t at, size_t len, const float* g) {
        adamw_loop(len, p + at, g, m + at, v + at, f, st);
    });
}

void loss_scale_update(Device& d, Stream s, float* state, const float* grad_stats, int growth_interval) {
    if (d.runs_cuda_kernels())
        return launch_cuda(d, s, optimizer_cuda.loss_scale, "loss_scale_update", state, grad_stats, growth_interval);
    run_on_host(d, s, "loss_scale_update", [=](const Device&) { loss_scale_step(state, grad_stats, growth_interval); });
}

}  // namespace mirrored
