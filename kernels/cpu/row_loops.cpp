#include "kernels/cpu/row_loops.h"

#include <algorithm>
#include <cmath>

#include "kernels/cpu/loop_clones.h"
#include "kernels/op_math.h"

namespace mirrored::cpu {

namespace {

constexpr int kLanes = 8;

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

}  // namespace

CPU_LOOP_CLONES void causal_softmax_row(DType dt, int keep, int t, float scale, const float* __restrict z,
                                        float* __restrict p) {
    with_storage_type(
        dt, [&](auto T) __attribute__((always_inline)) {
            const float mx = row_max(keep, z);
            for (int j = 0; j < keep; ++j) p[j] = exp_poly(scale * (z[j] - mx));
            float s[kLanes] = {};
            for_lanes(
                keep, [&](int j, int l) __attribute__((always_inline)) { s[l] += p[j]; });
            const float inv = 1.0f / lanes_sum(s);
            for (int j = 0; j < keep; ++j) p[j] = round_to(T, p[j] * inv);
            for (int j = keep; j < t; ++j) p[j] = 0.0f;
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
            double s[kLanes] = {};
            for_lanes(
                c, [&](int j, int l) __attribute__((always_inline)) { s[l] += double(x[j]); });
            const float m = float(lanes_sum(s) / c);
            double q[kLanes] = {};
            for_lanes(
                c, [&](int j, int l) __attribute__((always_inline)) {
                    const double d = double(x[j] - m);
                    q[l] += d * d;
                });
            const float rs = bn_invstd(float(lanes_sum(q) / c), eps);
            *mean = m;
            *rstd = rs;
            for (int j = 0; j < c; ++j) y[j] = round_to(T, gamma[j] * ((x[j] - m) * rs) + beta[j]);
        });
}

CPU_LOOP_CLONES void layernorm_backward_row(DType dt, int c, const float* __restrict dy, const float* __restrict x,
                                            float mean, float rstd, const float* __restrict gamma, float* __restrict dx,
                                            double* __restrict dgamma_sum, double* __restrict dbeta_sum) {
    with_storage_type(
        dt, [&](auto T) __attribute__((always_inline)) {
            double a[kLanes] = {}, b[kLanes] = {};  // sums of gamma dy and gamma dy xhat over the row
            for_lanes(
                c, [&](int ch, int l) __attribute__((always_inline)) {
                    const float xhat = (x[ch] - mean) * rstd;
                    const float gd = gamma[ch] * dy[ch];
                    a[l] += double(gd);
                    b[l] += double(gd) * double(xhat);
                    dgamma_sum[ch] += double(dy[ch]) * double(xhat);
                    dbeta_sum[ch] += double(dy[ch]);
                });
            if (!dx) return;
            const float ma = float(lanes_sum(a) / c), mb = float(lanes_sum(b) / c);
            for (int j = 0; j < c; ++j) {
                const float xhat = (x[j] - mean) * rstd;
                dx[j] = round_to(T, rstd * (gamma[j] * dy[j] - ma - xhat * mb));
            }
        });
}

}  // namespace mirrored::cpu
