#include "kernels/cpu/row_loops.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/cpu/loop_clones.h"
#include "kernels/op_math.h"

namespace mirrored::cpu {

namespace {

constexpr int kLanes = 8;
// Rows whose per-channel sums layernorm's backward keeps in floats before adding them to doubles.
constexpr int kLayernormRowBlock = 32;

// f(i, lane) for i in [0, n): element i in lane i % 8, in blocks of 8 and then the tail, so that
// the blocks' lanes vectorise.
template <typename F>
[[gnu::always_inline]] inline void for_lanes(int n, F&& f) {
    int j = 0;
    for (; j + kLanes <= n; j += kLanes)
        for (int l = 0; l < kLanes; ++l) f(j + l, l);
    for (int l = 0; j + l < n; ++l) f(j + l, l);
}

// The lanes' fixed tree: (0 + 4, 1 + 5, 2 + 6, 3 + 7), then pairs, then the last two.
template <typename V>
[[gnu::always_inline]] inline V lanes_sum(const V* v) {
    const V a = v[0] + v[4], b = v[1] + v[5], c = v[2] + v[6], d = v[3] + v[7];
    return (a + c) + (b + d);
}

// The largest of x[0, n), n >= 1, in eight lanes (a NaN is kept only where x[0] is one).
[[gnu::always_inline]] inline float row_max(int n, const float* __restrict x) {
    float m[kLanes];
    std::fill(m, m + kLanes, x[0]);
    for_lanes(
        n, [&](int j, int l) __attribute__((always_inline)) { m[l] = m[l] < x[j] ? x[j] : m[l]; });
    float mx = m[0];
    for (int l = 1; l < kLanes; ++l) mx = mx < m[l] ? m[l] : mx;
    return mx;
}

// The sum over x[0, n) of x[j] - shift, or (squares) of its square, in eight lanes (element j in
// lane j % 8, the lanes added in lanes_sum's tree): whole groups of eight as one vector, the rest
// one by one.
[[gnu::always_inline]] inline float lanes_sum_of(int n, const float* __restrict x, float shift, bool squares) {
    f32x8 acc = {};
    int j = 0;
    for (; j + kLanes <= n; j += kLanes) {
        f32x8 v;
        std::memcpy(&v, x + j, sizeof v);
        const f32x8 d = v - shift;
        acc += squares ? d * d : d;
    }
    for (int l = 0; j < n; ++j, ++l) {
        const float d = x[j] - shift;
        acc[l] += squares ? d * d : d;
    }
    float lanes[kLanes];
    std::memcpy(lanes, &acc, sizeof lanes);
    return lanes_sum(lanes);
}

// Layernorm backward's row sums in eight lanes: of gamma dy, or (times_xhat) of gamma dy xhat.
[[gnu::always_inline]] inline float lanes_sum_of2(int n, const float* __restrict gamma, const float* __restrict dy,
                                                  const float* __restrict x, float m, float rs, bool times_xhat) {
    f32x8 acc = {};
    int j = 0;
    for (; j + kLanes <= n; j += kLanes) {
        f32x8 g, d, v;
        std::memcpy(&g, gamma + j, sizeof g);
        std::memcpy(&d, dy + j, sizeof d);
        std::memcpy(&v, x + j, sizeof v);
        acc += times_xhat ? (g * d) * ((v - m) * rs) : g * d;
    }
    for (int l = 0; j < n; ++j, ++l) acc[l] += times_xhat ? (gamma[j] * dy[j]) * ((x[j] - m) * rs) : gamma[j] * dy[j];
    float lanes[kLanes];
    std::memcpy(lanes, &acc, sizeof lanes);
    return lanes_sum(lanes);
}

}  // namespace

CPU_LOOP_CLONES void causal_softmax_row(DType dt, int keep, int t, float scale, const float* __restrict z,
                                        float* __restrict p) {
    with_storage_type(
        dt, [&](auto T) __attribute__((always_inline)) {
            const float mx = row_max(keep, z);
            // up to a multiple of 16 past `keep` where the row goes on (values never read): a row of
            // any length would otherwise end in a scalar loop costing as much as the rest
            const int n = std::min(t, (keep + 15) / 16 * 16);
            for (int j = 0; j < n; ++j) p[j] = exp_poly(scale * (z[j] - mx));
            float s[kLanes] = {};
            for_lanes(
                keep, [&](int j, int l) __attribute__((always_inline)) { s[l] += p[j]; });
            const float inv = 1.0f / lanes_sum(s);
            for (int j = 0; j < t; ++j) p[j] = j < keep ? round_to(T, p[j] * inv) : 0.0f;
        });
}

CPU_LOOP_CLONES void causal_softmax_backward_row(DType dt, int keep, int t, float scale, const float* __restrict p,
                                                 const float* __restrict dp, float* __restrict ds) {
    with_storage_type(
        dt, [&](auto T) __attribute__((always_inline)) {
            float s[kLanes] = {};
            for_lanes(
                keep, [&](int j, int l) __attribute__((always_inline)) { s[l] += p[j] * dp[j]; });
            const float dot = lanes_sum(s);
            for (int j = 0; j < keep; ++j) ds[j] = round_to(T, scale * p[j] * (dp[j] - dot));
            for (int j = keep; j < t; ++j) ds[j] = 0.0f;
        });
}

CPU_LOOP_CLONES float softmax_xent_row(DType dt, int classes, int y, float gs, const float* __restrict z,
                                       float* __restrict d, int* argmax) {
    float loss = 0.0f;
    with_storage_type(
        dt, [&](auto T) __attribute__((always_inline)) {
            const float mx = row_max(classes, z);
            int arg = 0;  // the first index of the largest, as a running argmax finds it
            while (arg < classes && !(z[arg] == mx)) ++arg;
            *argmax = arg < classes ? arg : 0;  // NaN logits: no index equals the maximum
            float s[kLanes] = {};
            if (d) {
                for (int j = 0; j < classes; ++j) d[j] = exp_poly(z[j] - mx);
                for_lanes(
                    classes, [&](int j, int l) __attribute__((always_inline)) { s[l] += d[j]; });
            } else {
                for_lanes(
                    classes, [&](int j, int l) __attribute__((always_inline)) { s[l] += exp_poly(z[j] - mx); });
            }
            const float sum = lanes_sum(s);  // >= 1: the maximum's own term is 1
            // cppcheck-suppress invalidFunctionArg
            loss = std::log(sum) + mx - z[y];
            if (!d) return;
            const float inv = 1.0f / sum, e_y = d[y];
            for (int j = 0; j < classes; ++j) d[j] = round_to(T, d[j] * inv * gs);
            d[y] = round_to(T, (e_y * inv - 1.0f) * gs);
        });
    return loss;
}

CPU_LOOP_CLONES void layernorm_forward_row(DType dt, int c, float eps, const float* __restrict x,
                                           const float* __restrict gamma, const float* __restrict beta,
                                           float* __restrict y, float* mean, float* rstd) {
    with_storage_type(
        dt, [&](auto T) __attribute__((always_inline)) {
            const float m = lanes_sum_of(c, x, 0.0f, false) / float(c);
            const float var = lanes_sum_of(c, x, m, true) / float(c);  // about the mean: no cancellation
            const float rs = bn_invstd(var, eps);
            *mean = m;
            *rstd = rs;
            for (int j = 0; j < c; ++j) y[j] = round_to(T, gamma[j] * ((x[j] - m) * rs) + beta[j]);
        });
}

CPU_LOOP_CLONES void layernorm_backward_rows(DType dt, int rows, int c, const float* __restrict dy,
                                             const float* __restrict x, const float* __restrict mean,
                                             const float* __restrict rstd, const float* __restrict gamma,
                                             float* __restrict dx, double* __restrict dgamma_sum,
                                             double* __restrict dbeta_sum, float* __restrict partial) {
    with_storage_type(
        dt, [&](auto T) __attribute__((always_inline)) {
            float* __restrict pg = partial;  // this block's sums of dy xhat, then of dy, per channel
            float* __restrict pb = partial + c;
            for (int r0 = 0; r0 < rows; r0 += kLayernormRowBlock) {
                std::fill(partial, partial + 2 * size_t(c), 0.0f);
                for (int r = r0; r < std::min(rows, r0 + kLayernormRowBlock); ++r) {
                    const float* __restrict d = dy + size_t(r) * c;
                    const float* __restrict xr = x + size_t(r) * c;
                    const float m = mean[r], rs = rstd[r];
                    for (int ch = 0; ch < c; ++ch) {
                        pg[ch] += d[ch] * ((xr[ch] - m) * rs);
                        pb[ch] += d[ch];
                    }
                    if (!dx) continue;
                    // the row's means of gamma dy and of gamma dy xhat
                    const float ma = lanes_sum_of2(c, gamma, d, xr, m, rs, false) / float(c);
                    const float mb = lanes_sum_of2(c, gamma, d, xr, m, rs, true) / float(c);
                    float* __restrict out = dx + size_t(r) * c;
                    for (int j = 0; j < c; ++j)
                        out[j] = round_to(T, rs * (gamma[j] * d[j] - ma - ((xr[j] - m) * rs) * mb));
                }
                for (int ch = 0; ch < c; ++ch) {
                    dgamma_sum[ch] += double(pg[ch]);
                    dbeta_sum[ch] += double(pb[ch]);
                }
            }
        });
}

}  // namespace mirrored::cpu
