// Causal attention's CUDA kernels (attention.h): the causal softmax one warp per row of a [t, t]
// score matrix, and the fused attention.
#include "kernels/cuda/kernel_util.cuh"
#include "kernels/ops/attention.h"

namespace mirrored::cuda {

namespace {

// One warp per row of a [t, t] score matrix; row i keeps columns 0..i. The warp's butterflies fix
// the order of the sums, so results repeat bit for bit.
__device__ __forceinline__ float warp_max(float v) {
    for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
    return v;
}

template <typename T>
__global__ void causal_softmax_kernel(int64_t rows, int t, float scale, const T* z, T* p) {
    const int64_t row = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32;
    if (row >= rows) return;
    const int keep = int(row % t) + 1;
    const size_t base = size_t(row) * t;
    float mx = -INFINITY;
    for (int j = lane; j < keep; j += 32) mx = fmaxf(mx, ld(z, base + j));
    mx = warp_max(mx);
    float sum = 0.0f;
    for (int j = lane; j < keep; j += 32) sum += exp_poly(scale * (ld(z, base + j) - mx));  // the CPU's exp
    const float inv = 1.0f / warp_sum(sum);
    for (int j = lane; j < t; j += 32)
        st(p, base + j, j < keep ? exp_poly(scale * (ld(z, base + j) - mx)) * inv : 0.0f);
}

template <typename T>
__global__ void causal_softmax_backward_kernel(int64_t rows, int t, float scale, const T* p, const T* dp, T* ds) {
    const int64_t row = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32;
    if (row >= rows) return;
    const int keep = int(row % t) + 1;
    const size_t base = size_t(row) * t;
    float dot = 0.0f;
    for (int j = lane; j < keep; j += 32) dot += ld(p, base + j) * ld(dp, base + j);
    dot = warp_sum(dot);
    for (int j = lane; j < t; j += 32)
        st(ds, base + j, j < keep ? scale * ld(p, base + j) * (ld(dp, base + j) - dot) : 0.0f);
}

int softmax(const Device::NativeLaunch& l, int batches, int t, float scale, const void* scores, void* probs) {
    const int64_t rows = int64_t(batches) * t;
    if (rows <= 0) return 0;
    const cudaStream_t s = stream_of(l);
    DISPATCH(l.act, causal_softmax_kernel<<<warp_rows_grid(rows), kThreads, 0, s>>>(rows, t, scale, as<T>(scores),
                                                                                    as<T>(probs)));
    CUDA_LAUNCH_CHECK(l.device);
    return 1;
}

int softmax_backward(const Device::NativeLaunch& l, int batches, int t, float scale, const void* probs,
                     const void* dprobs, void* dscores) {
    const int64_t rows = int64_t(batches) * t;
    if (rows <= 0) return 0;
    const cudaStream_t s = stream_of(l);
    DISPATCH(l.act, causal_softmax_backward_kernel<<<warp_rows_grid(rows), kThreads, 0, s>>>(
                        rows, t, scale, as<T>(probs), as<T>(dprobs), as<T>(dscores)));
    CUDA_LAUNCH_CHECK(l.device);
    return 1;
}

// ---- fused causal attention (attention_forward/backward) ----------------------------------------
// One warp per row of one head: lane l holds elements l, l + 32, ... of the row (E of them, the
// head's width d <= 32 E), dot products are warp butterflies (a fixed order), and the online
// softmax's running max, sum and output stay in registers - no [t, t] matrix anywhere, no atomics.
// Rows are numbered (sample, head, position) with the position fastest, so a block's warps read
// the same keys and values, from L1. The straightforward form: every row streams its keys from
// L1/L2 instead of sharing shared-memory tiles (FlashAttention's blocking), which is the next step.
struct AttentionRow {
    int64_t n;  // sample
    int h, i;   // head, position
    __device__ AttentionRow(int64_t w, int t, int heads)
        : n(w / (int64_t(t) * heads)), h(int((w / t) % heads)), i(int(w % t)) {}
};

template <int E, typename T>
__device__ void load_row(const T* p, size_t at, int d, int lane, float (&v)[E]) {
    for (int r = 0; r < E; ++r) v[r] = lane + 32 * r < d ? ld(p, at + lane + 32 * r) : 0.0f;
}
template <int E, typename T>
__device__ float row_dot(const float (&a)[E], const T* p, size_t at, int d, int lane) {
    float part = 0.0f;
    for (int r = 0; r < E; ++r)
        if (lane + 32 * r < d) part += a[r] * ld(p, at + lane + 32 * r);
    return warp_sum(part);
}

// Query i (of the rows from `base`) and head h over keys 0..i: the output row at `o`; returns the
// log-sum-exp (in every lane).
template <typename T, int E>
__device__ float attend_row(const T* qkv, size_t base, const AttentionHeads& a, float scale, int h, int i, int lane,
                            T* out, size_t o) {
    const int d = a.d;
    const size_t stride = a.qkv_width();
    float q[E], acc[E];
    load_row(qkv, (base + i) * stride + a.q_at(h), d, lane, q);
    for (int e = 0; e < E; ++e) acc[e] = 0.0f;
    float m = -INFINITY, l = 0.0f;
    for (int j = 0; j <= i; ++j) {
        const size_t k = (base + j) * stride + a.k_at(h), v = (base + j) * stride + a.v_at(h);
        const float sc = scale * row_dot(q, qkv, k, d, lane), mn = fmaxf(m, sc);
        const float corr = exp_poly(m - mn), p = exp_poly(sc - mn);  // the CPU's exp
        l = l * corr + p;
        for (int e = 0; e < E; ++e)
            if (lane + 32 * e < d) acc[e] = acc[e] * corr + p * ld(qkv, v + lane + 32 * e);
        m = mn;
    }
    for (int e = 0; e < E; ++e)
        if (lane + 32 * e < d) st(out, o + lane + 32 * e, acc[e] / l);
    return m + logf(l);
}

template <typename T, int E>
__global__ void attention_forward_kernel(int64_t rows, int t, AttentionHeads a, float scale, const T* qkv, T* out,
                                         float* lse) {
    const int64_t w = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32;
    if (w >= rows) return;  // a whole warp at once: rows are per warp
    const AttentionRow r(w, t, a.heads);
    const size_t base = size_t(r.n) * t;
    const float ls =
        attend_row<T, E>(qkv, base, a, scale, r.h, r.i, lane, out, (base + r.i) * a.out_width() + size_t(r.h) * a.d);
    if (lane == 0) lse[(size_t(r.n) * a.heads + r.h) * t + r.i] = ls;
}

// One warp per head: the last of t positions' query.
template <typename T, int E>
__global__ void attention_decode_kernel(int t, AttentionHeads a, float scale, const T* qkv, T* out) {
    const int h = int((blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32);
    if (h >= a.heads) return;
    attend_row<T, E>(qkv, 0, a, scale, h, t - 1, threadIdx.x % 32, out, size_t(h) * a.d);
}

template <typename T, int E>
__global__ void attention_delta_kernel(int64_t rows, int t, AttentionHeads a, const T* out, const T* dout,
                                       float* delta) {
    const int64_t w = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32;
    if (w >= rows) return;
    const AttentionRow r(w, t, a.heads);
    const size_t at = (size_t(r.n) * t + r.i) * a.out_width() + size_t(r.h) * a.d;
    float g[E];
    load_row(dout, at, a.d, lane, g);
    const float sum = row_dot(g, out, at, a.d, lane);
    if (lane == 0) delta[(size_t(r.n) * a.heads + r.h) * t + r.i] = sum;
}

// dq_i = scale sum_{j <= i} p_ij (dout_i . v_j - delta_i) k_j: one warp per query row.
template <typename T, int E>
__global__ void attention_dq_kernel(int64_t rows, int t, AttentionHeads a, float scale, const T* qkv, const T* dout,
                                    const float* lse, const float* delta, T* dqkv) {
    const int64_t w = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32;
    if (w >= rows) return;
    const AttentionRow r(w, t, a.heads);
    const int d = a.d;
    const size_t base = size_t(r.n) * t, stride = a.qkv_width(), stat = (size_t(r.n) * a.heads + r.h) * t + r.i;
    float q[E], g[E], dq[E];
    load_row(qkv, (base + r.i) * stride + a.q_at(r.h), d, lane, q);
    load_row(dout, (base + r.i) * a.out_width() + size_t(r.h) * d, d, lane, g);
    for (int e = 0; e < E; ++e) dq[e] = 0.0f;
    const float ls = lse[stat], dl = delta[stat];
    for (int j = 0; j <= r.i; ++j) {
        const size_t k = (base + j) * stride + a.k_at(r.h), v = (base + j) * stride + a.v_at(r.h);
        const float p = exp_poly(scale * row_dot(q, qkv, k, d, lane) - ls);
        const float ds = scale * p * (row_dot(g, qkv, v, d, lane) - dl);
        for (int e = 0; e < E; ++e)
            if (lane + 32 * e < d) dq[e] += ds * ld(qkv, k + lane + 32 * e);
    }
    for (int e = 0; e < E; ++e)
        if (lane + 32 * e < d) st(dqkv, (base + r.i) * stride + a.q_at(r.h) + lane + 32 * e, dq[e]);
}

// dk_j = scale sum_h sum_{i >= j} ds_ij q_i, dv_j = sum_h sum_{i >= j} p_ij dout_i over the query
// heads h of the key/value head's group: one warp per key row of one key/value head.
template <typename T, int E>
__global__ void attention_dkv_kernel(int64_t rows, int t, AttentionHeads a, float scale, const T* qkv, const T* dout,
                                     const float* lse, const float* delta, T* dqkv) {
    const int64_t w = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32;
    if (w >= rows) return;
    const AttentionRow r(w, t, a.kv_heads);  // r.h: the key/value head, r.i: the key's position
    const int d = a.d, first = r.h * a.group();
    const size_t base = size_t(r.n) * t, stride = a.qkv_width();
    float k[E], v[E], dk[E], dv[E];
    const size_t kat = (base + r.i) * stride + a.k_at(first), vat = (base + r.i) * stride + a.v_at(first);
    load_row(qkv, kat, d, lane, k);
    load_row(qkv, vat, d, lane, v);
    for (int e = 0; e < E; ++e) dk[e] = dv[e] = 0.0f;
    for (int h = first; h < first + a.group(); ++h) {
        const size_t stats = (size_t(r.n) * a.heads + h) * t;
        for (int i = r.i; i < t; ++i) {
            const size_t q = (base + i) * stride + a.q_at(h), g = (base + i) * a.out_width() + size_t(h) * d;
            const float p = exp_poly(scale * row_dot(k, qkv, q, d, lane) - lse[stats + i]);
            const float ds = scale * p * (row_dot(v, dout, g, d, lane) - delta[stats + i]);
            for (int e = 0; e < E; ++e)
                if (lane + 32 * e < d) {
                    dk[e] += ds * ld(qkv, q + lane + 32 * e);
                    dv[e] += p * ld(dout, g + lane + 32 * e);
                }
        }
    }
    for (int e = 0; e < E; ++e)
        if (lane + 32 * e < d) {
            st(dqkv, kat + lane + 32 * e, dk[e]);
            st(dqkv, vat + lane + 32 * e, dv[e]);
        }
}

// Calls fn with E = ceil(d / 32) as a compile-time constant (1..4: d <= 128).
#define WITH_ROW_ELEMENTS(d, ...) \
    switch ((d + 31) / 32) {      \
        case 1: {                 \
            constexpr int E = 1;  \
            __VA_ARGS__;          \
        } break;                  \
        case 2: {                 \
            constexpr int E = 2;  \
            __VA_ARGS__;          \
        } break;                  \
        case 3: {                 \
            constexpr int E = 3;  \
            __VA_ARGS__;          \
        } break;                  \
        default: {                \
            constexpr int E = 4;  \
            __VA_ARGS__;          \
        }                         \
    }

int forward(const Device::NativeLaunch& l, int samples, int t, const AttentionHeads& a, float scale, const void* qkv,
            void* out, float* lse) {
    const int64_t rows = int64_t(samples) * a.heads * t;
    if (rows <= 0) return 0;
    const cudaStream_t s = stream_of(l);
    const DType dt = l.act;
    WITH_ROW_ELEMENTS(a.d, DISPATCH(dt, attention_forward_kernel<T, E><<<warp_rows_grid(rows), kThreads, 0, s>>>(
                                            rows, t, a, scale, as<T>(qkv), as<T>(out), lse)));
    CUDA_LAUNCH_CHECK(l.device);
    return 1;
}

int decode(const Device::NativeLaunch& l, int t, const AttentionHeads& a, float scale, const void* qkv, void* out) {
    const cudaStream_t s = stream_of(l);
    const DType dt = l.act;
    WITH_ROW_ELEMENTS(a.d, DISPATCH(dt, attention_decode_kernel<T, E><<<warp_rows_grid(a.heads), kThreads, 0, s>>>(
                                            t, a, scale, as<T>(qkv), as<T>(out))));
    CUDA_LAUNCH_CHECK(l.device);
    return 1;
}

int backward(const Device::NativeLaunch& l, int samples, int t, const AttentionHeads& a, float scale, const void* qkv,
             const void* out, const void* dout, const float* lse, float* delta, void* dqkv) {
    const int64_t rows = int64_t(samples) * a.heads * t, key_rows = int64_t(samples) * a.kv_heads * t;
    if (rows <= 0) return 0;
    const cudaStream_t s = stream_of(l);
    const DType dt = l.act;
    const int dev = l.device;
    WITH_ROW_ELEMENTS(a.d, DISPATCH(dt, attention_delta_kernel<T, E><<<warp_rows_grid(rows), kThreads, 0, s>>>(
                                            rows, t, a, as<T>(out), as<T>(dout), delta)));
    CUDA_LAUNCH_CHECK(dev);
    WITH_ROW_ELEMENTS(a.d, DISPATCH(dt, attention_dq_kernel<T, E><<<warp_rows_grid(rows), kThreads, 0, s>>>(
                                            rows, t, a, scale, as<T>(qkv), as<T>(dout), lse, delta, as<T>(dqkv))));
    CUDA_LAUNCH_CHECK(dev);
    WITH_ROW_ELEMENTS(a.d, DISPATCH(dt, attention_dkv_kernel<T, E><<<warp_rows_grid(key_rows), kThreads, 0, s>>>(
                                            key_rows, t, a, scale, as<T>(qkv), as<T>(dout), lse, delta, as<T>(dqkv))));
    CUDA_LAUNCH_CHECK(dev);
    return 3;
}

const struct Register {
    Register() { attention_cuda = {softmax, softmax_backward, forward, decode, backward}; }
} registered;

}  // namespace

}  // namespace mirrored::cuda
