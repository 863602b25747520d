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

// Eight lanes over [0, n): element j in lane j % 8. vec(j) for each whole group of eight from j,
// then one(l, j) for the tail's element j in lane l; the lanes are the callers' GCC vectors
// (loop_clones.h): loops over an array of eight lanes do not vectorise.
template <typename Vec, typename One>
[[gnu::always_inline]] inline void over_lanes(int n, Vec&& vec, One&& one) {
    int j = 0;
    for (; j + kLanes <= n; j += kLanes) vec(j);
    for (int l = 0; j < n; ++j, ++l) one(l, j);
}

// x[j, j + 8) into v.
[[gnu::always_inline]] inline void load8(f32x8& v, const float* x) { std::memcpy(&v, x, sizeof v); }

// The sum over x[0, n) of term(x[j]) in eight lanes: term maps a vector of eight values, or the
// tail's one, in place (a generic lambda, the same arithmetic for both).
template <typename Term>
[[gnu::always_inline]] inline float row_sum_of(int n, const float* __restrict x, Term&& term) {
    f32x8 acc = {};
    over_lanes(
        n,
        [&](int j) __attribute__((always_inline)) {
            f32x8 v;
            load8(v, x + j);
            term(v);
            acc += v;
        },
        [&](int l, int j) __attribute__((always_inline)) {
            float v = x[j];
            term(v);
            acc[l] += v;
        });
    return lanes_sum(acc);
}

[[gnu::always_inline]] inline float row_sum(int n, const float* __restrict x) {
    return row_sum_of(n, x, [](auto&) {});
}

// The sum of (x - shift)^2 over x[0, n).
[[gnu::always_inline]] inline float row_squares_about(int n, const float* __restrict x, float shift) {
    return row_sum_of(
        n, x, [&](auto& v) __attribute__((always_inline)) {
            v -= shift;
            v = v * v;
        });
}

// The sum of x y over [0, n) in eight lanes.
[[gnu::always_inline]] inline float row_dot(int n, const float* __restrict x, const float* __restrict y) {
    f32x8 acc = {};
    over_lanes(
        n,
        [&](int j) __attribute__((always_inline)) {
            f32x8 u, v;
            load8(u, x + j);
            load8(v, y + j);
            acc += u * v;
        },
        [&](int l, int j) __attribute__((always_inline)) { acc[l] += x[j] * y[j]; });
    return lanes_sum(acc);
}

// The largest of x[0, n), n >= 1, in eight lanes (a NaN is kept only where x[0] is one).
[[gnu::always_inline]] inline float row_max(int n, const float* __restrict x) {
    f32x8 m = {};
    m += x[0];
    over_lanes(
        n,
        [&](int j) __attribute__((always_inline)) {
            f32x8 v;
            load8(v, x + j);
            m = m < v ? v : m;
        },
        [&](int l, int j) __attribute__((always_inline)) { m[l] = m[l] < x[j] ? x[j] : m[l]; });
    float mx = m[0];
    for (int l = 1; l < kLanes; ++l) mx = mx < m[l] ? m[l] : mx;
    return mx;
}

// Layernorm backward's row sums in eight lanes: of gamma dy, and of gamma dy xhat.
[[gnu::always_inline]] inline void layernorm_row_sums(int n, const float* __restrict gamma, const float* __restrict dy,
                                                      const float* __restrict x, float m, float rs, float* sum_gd,
                                                      float* sum_gdx) {
    f32x8 a = {}, b = {};
    over_lanes(
        n,
        [&](int j) __attribute__((always_inline)) {
            f32x8 g, d, v;
            load8(g, gamma + j);
            load8(d, dy + j);
            load8(v, x + j);
            const f32x8 gd = g * d;
            a += gd;
            b += gd * ((v - m) * rs);
        },
        [&](int l, int j) __attribute__((always_inline)) {
            const float gd = gamma[j] * dy[j];
            a[l] += gd;
            b[l] += gd * ((x[j] - m) * rs);
        });
    *sum_gd = lanes_sum(a);
    *sum_gdx = lanes_sum(b);
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
            const float inv = 1.0f / row_sum(keep, p);
            for (int j = 0; j < t; ++j) p[j] = j < keep ? round_to(T, p[j] * inv) : 0.0f;
        });
}

CPU_LOOP_CLONES void causal_softmax_backward_row(DType dt, int keep, int t, float scale, const float* __restrict p,
                                                 const float* __restrict dp, float* __restrict ds) {
    with_storage_type(
        dt, [&](auto T) __attribute__((always_inline)) {
            const float dot = row_dot(keep, p, dp);
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
            float sum = 0.0f;                   // >= 1: the maximum's own term is 1
            if (d) {
                for (int j = 0; j < classes; ++j) d[j] = exp_poly(z[j] - mx);
                sum = row_sum(classes, d);
            } else {
                f32x8 acc = {};
                over_lanes(
                    classes,
                    [&](int j) __attribute__((always_inline)) {
                        for (int l = 0; l < kLanes; ++l) acc[l] += exp_poly(z[j + l] - mx);
                    },
                    [&](int l, int j) __attribute__((always_inline)) { acc[l] += exp_poly(z[j] - mx); });
                sum = lanes_sum(acc);
            }
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
            const float m = row_sum(c, x) / float(c);
            const float var = row_squares_about(c, x, m) / float(c);  // about the mean: no cancellation
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
                    float sum_gd, sum_gdx;
                    layernorm_row_sums(c, gamma, d, xr, m, rs, &sum_gd, &sum_gdx);
                    const float ma = sum_gd / float(c), mb = sum_gdx / float(c);
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
