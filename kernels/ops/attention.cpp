#include "kernels/ops/attention.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "base/error.h"
#include "kernels/cpu/loop_clones.h"
#include "kernels/op_math.h"

namespace mirrored {

AttentionKernels attention_cuda;

namespace cpu {

// p[0, keep) = softmax(scale z[0, keep)), p[keep, t) = 0.
CPU_LOOP_CLONES void causal_softmax_row(DType dt, int keep, int t, float scale, const float* __restrict z,
                                        float* __restrict p) {
    with_storage_type(
        dt, [&](auto T) __attribute__((always_inline)) {
            const float mx = row_max(keep, z);
            // up to a multiple of 16 past `keep` where the row goes on (values never read): a row of
            // any length would otherwise end in a scalar loop costing as much as the rest
            const int n = std::min(t, (keep + 15) / 16 * 16);
            for (int j = 0; j < n; ++j) p[j] = exp_poly(scale * (z[j] - mx));
            const float inv = 1.0f / row_sum(keep, p);
            for (int j = 0; j < t; ++j) p[j] = j < keep ? round_to(T, p[j] * inv) : 0.0f;
        });
}

// ds[0, keep) = scale p (dp - sum p dp), ds[keep, t) = 0.
CPU_LOOP_CLONES void causal_softmax_backward_row(DType dt, int keep, int t, float scale, const float* __restrict p,
                                                 const float* __restrict dp, float* __restrict ds) {
    with_storage_type(
        dt, [&](auto T) __attribute__((always_inline)) {
            const float dot = row_dot(keep, p, dp);
            for (int j = 0; j < keep; ++j) ds[j] = round_to(T, scale * p[j] * (dp[j] - dot));
            for (int j = keep; j < t; ++j) ds[j] = 0.0f;
        });
}

}  // namespace cpu

namespace {

// Query i of one sample's rows (x: the sample's qkv) and head h over keys 0..i, keys in order (the
// CUDA kernels' warps sum the same terms in another order): the output row into o, rounded to dt;
// returns the row's log-sum-exp. acc: d floats.
float attend_row(DType dt, const float* x, const AttentionHeads& a, float scale, int h, int i, float* o, float* acc) {
    const size_t width = a.qkv_width();
    const int d = a.d;
    const float* q = x + size_t(i) * width + a.q_at(h);
    float m = -INFINITY, l = 0.0f;
    std::fill(acc, acc + d, 0.0f);
    for (int j = 0; j <= i; ++j) {
        const float* k = x + size_t(j) * width + a.k_at(h);
        const float* v = x + size_t(j) * width + a.v_at(h);
        float dot = 0.0f;
        for (int e = 0; e < d; ++e) dot += q[e] * k[e];
        const float sc = scale * dot, mn = std::max(m, sc);
        const float corr = exp_poly(m - mn), p = exp_poly(sc - mn);  // exp_poly(-inf) clamps to ~0
        l = l * corr + p;
        for (int e = 0; e < d; ++e) acc[e] = acc[e] * corr + p * v[e];
        m = mn;
    }
    for (int e = 0; e < d; ++e) o[e] = round_to(dt, acc[e] / l);
    return m + std::log(l);
}

void attention_forward_rows(DType dt, int samples, int t, const AttentionHeads& a, float scale, const void* qkv,
                            void* out, float* lse) {
    const size_t ow = a.out_width();
    float acc[kMaxFusedHeadWidth];
    for (int n = 0; n < samples; ++n)
        for (int h = 0; h < a.heads; ++h)
            for (int i = 0; i < t; ++i)
                lse[(size_t(n) * a.heads + h) * t + i] =
                    attend_row(dt, as_floats(qkv) + size_t(n) * t * a.qkv_width(), a, scale, h, i,
                               as_floats(out) + (size_t(n) * t + i) * ow + size_t(h) * a.d, acc);
}

void attention_backward_rows(DType dt, int samples, int t, const AttentionHeads& a, float scale, const void* qkv,
                             const void* out, const void* dout, const float* lse, float* delta, void* dqkv) {
    const size_t width = a.qkv_width(), ow = a.out_width();
    const int d = a.d;
    const float* x = as_floats(qkv);
    float* dx = as_floats(dqkv);
    std::fill(dx, dx + size_t(samples) * t * width, 0.0f);
    for (int n = 0; n < samples; ++n)
        for (int h = 0; h < a.heads; ++h) {
            const size_t row0 = size_t(n) * t;
            float* dl = delta + (size_t(n) * a.heads + h) * t;
            const float* ls = lse + (size_t(n) * a.heads + h) * t;
            for (int i = 0; i < t; ++i) {
                const float* o = as_floats(out) + (row0 + i) * ow + size_t(h) * d;
                const float* g = as_floats(dout) + (row0 + i) * ow + size_t(h) * d;
                float sum = 0.0f;
                for (int e = 0; e < d; ++e) sum += g[e] * o[e];
                dl[i] = sum;
            }
            // ds_ij = p_ij (dout_i . v_j - delta_i); dq_i += scale ds_ij k_j, dk_j += scale ds_ij q_i,
            // dv_j += p_ij dout_i - sums in f32 here (a key/value head's over its group's query heads
            // in turn), rounded once at the end
            for (int i = 0; i < t; ++i) {
                const float* q = x + (row0 + i) * width + a.q_at(h);
                const float* g = as_floats(dout) + (row0 + i) * ow + size_t(h) * d;
                float* dq = dx + (row0 + i) * width + a.q_at(h);
                for (int j = 0; j <= i; ++j) {
                    const float* k = x + (row0 + j) * width + a.k_at(h);
                    const float* v = x + (row0 + j) * width + a.v_at(h);
                    float* dk = dx + (row0 + j) * width + a.k_at(h);
                    float* dv = dx + (row0 + j) * width + a.v_at(h);
                    float dot = 0.0f, dp = 0.0f;
                    for (int e = 0; e < d; ++e) dot += q[e] * k[e];
                    for (int e = 0; e < d; ++e) dp += g[e] * v[e];
                    const float p = exp_poly(scale * dot - ls[i]);
                    const float ds = scale * p * (dp - dl[i]);
                    for (int e = 0; e < d; ++e) {
                        dq[e] += ds * k[e];
                        dk[e] += ds * q[e];
                        dv[e] += p * g[e];
                    }
                }
            }
        }
    if (dt != DType::f32)
        for (size_t i = 0; i < size_t(samples) * t * width; ++i) dx[i] = round_to(dt, dx[i]);
}

}  // namespace

void check_fused_heads(const AttentionHeads& a) {
    if (a.heads <= 0 || a.kv_heads <= 0 || a.heads % a.kv_heads || a.d <= 0 || a.d > kMaxFusedHeadWidth)
        throw Error(kExitFailure, "fused attention: " + std::to_string(a.heads) + " heads (" +
                                      std::to_string(a.kv_heads) + " key/value heads) of width " + std::to_string(a.d) +
                                      " (key/value heads must divide the heads; each at most " +
                                      std::to_string(kMaxFusedHeadWidth) + " wide)");
}

void causal_softmax(Device& d, Stream s, int batches, int t, float scale, const void* scores, void* probs) {
    if (d.runs_cuda_kernels())
        return launch_cuda(d, s, attention_cuda.softmax, "causal_softmax", batches, t, scale, scores, probs);
    run_on_host(d, s, "causal_softmax", [=](const Device& h) {
        for (int64_t r = 0; r < int64_t(batches) * t; ++r)  // row i attends to positions 0..i
            cpu::causal_softmax_row(h.value_dtype(), int(r % t) + 1, t, scale, as_floats(scores) + r * t,
                                    as_floats(probs) + r * t);
    });
}

void causal_softmax_backward(Device& d, Stream s, int batches, int t, float scale, const void* probs,
                             const void* dprobs, void* dscores) {
    if (d.runs_cuda_kernels())
        return launch_cuda(d, s, attention_cuda.softmax_backward, "causal_softmax_backward", batches, t, scale, probs,
                           dprobs, dscores);
    run_on_host(d, s, "causal_softmax_backward", [=](const Device& h) {
        for (int64_t r = 0; r < int64_t(batches) * t; ++r)
            cpu::causal_softmax_backward_row(h.value_dtype(), int(r % t) + 1, t, scale, as_floats(probs) + r * t,
                                             as_floats(dprobs) + r * t, as_floats(dscores) + r * t);
    });
}

void attention_forward(Device& d, Stream s, int samples, int t, const AttentionHeads& a, float scale, const void* qkv,
                       void* out, float* lse) {
    check_fused_heads(a);  // on the caller's thread: an error it reports
    if (d.runs_cuda_kernels())
        return launch_cuda(d, s, attention_cuda.forward, "attention_forward", samples, t, a, scale, qkv, out, lse);
    run_on_host(d, s, "attention_forward",
                [=](const Device& h) { attention_forward_rows(h.value_dtype(), samples, t, a, scale, qkv, out, lse); });
}

void attention_decode(Device& d, Stream s, int t, const AttentionHeads& a, float scale, const void* qkv, void* out) {
    check_fused_heads(a);
    if (t <= 0) throw Error(kExitFailure, "attention_decode: no positions");
    if (d.runs_cuda_kernels())
        return launch_cuda(d, s, attention_cuda.decode, "attention_decode", t, a, scale, qkv, out);
    run_on_host(d, s, "attention_decode", [=](const Device& h) {
        float acc[kMaxFusedHeadWidth];
        for (int head = 0; head < a.heads; ++head)
            attend_row(h.value_dtype(), as_floats(qkv), a, scale, head, t - 1, as_floats(out) + size_t(head) * a.d,
                       acc);
    });
}

void attention_backward(Device& d, Stream s, int samples, int t, const AttentionHeads& a, float scale, const void* qkv,
                        const void* out, const void* dout, const float* lse, float* delta, void* dqkv) {
    check_fused_heads(a);
    if (d.runs_cuda_kernels())
        return launch_cuda(d, s, attention_cuda.backward, "attention_backward", samples, t, a, scale, qkv, out, dout,
                           lse, delta, dqkv);
    run_on_host(d, s, "attention_backward", [=](const Device& h) {
        attention_backward_rows(h.value_dtype(), samples, t, a, scale, qkv, out, dout, lse, delta, dqkv);
    });
}

}  // namespace mirrored
