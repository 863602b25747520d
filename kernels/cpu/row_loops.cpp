#include "kernels/cpu/row_loops.h"

#include <algorithm>
#include <type_traits>

#include "kernels/cpu/loop_clones.h"
#include "kernels/op_math.h"

namespace mirrored::cpu {

namespace {

constexpr int kLanes = 8;

template <DType T>
using TypeC = std::integral_constant<DType, T>;

// fn(storage type) with the type a compile-time constant: no branch in the element loops.
template <typename Fn>
[[gnu::always_inline]] inline void with_type(DType t, Fn&& fn) {
    if (t == DType::bf16) fn(TypeC<DType::bf16>{});
    else if (t == DType::f16) fn(TypeC<DType::f16>{});
    else fn(TypeC<DType::f32>{});
}

// The lanes' fixed tree: (0 + 4, 1 + 5, 2 + 6, 3 + 7), then pairs, then the last two.
template <typename V>
[[gnu::always_inline]] inline V lanes_sum(const V* v) {
    const V a = v[0] + v[4], b = v[1] + v[5], c = v[2] + v[6], d = v[3] + v[7];
    return (a + c) + (b + d);
}

}  // namespace

CPU_LOOP_CLONES void causal_softmax_row(DType dt, int keep, int t, float scale, const float* __restrict z,
                                        float* __restrict p) {
    with_type(
        dt, [&](auto T) __attribute__((always_inline)) {
            float m[kLanes];
            std::fill(m, m + kLanes, z[0]);
            int j = 0;
            for (; j + kLanes <= keep; j += kLanes)
                for (int l = 0; l < kLanes; ++l) m[l] = m[l] < z[j + l] ? z[j + l] : m[l];
            for (int l = 0; j + l < keep; ++l) m[l] = m[l] < z[j + l] ? z[j + l] : m[l];
            float mx = m[0];
            for (int l = 1; l < kLanes; ++l) mx = mx < m[l] ? m[l] : mx;
            for (j = 0; j < keep; ++j) p[j] = exp_poly(scale * (z[j] - mx));
            float s[kLanes] = {};
            for (j = 0; j + kLanes <= keep; j += kLanes)
                for (int l = 0; l < kLanes; ++l) s[l] += p[j + l];
            for (int l = 0; j + l < keep; ++l) s[l] += p[j + l];
            const float inv = 1.0f / lanes_sum(s);
            for (j = 0; j < keep; ++j) p[j] = round_to(T, p[j] * inv);
            for (j = keep; j < t; ++j) p[j] = 0.0f;
        });
}

CPU_LOOP_CLONES void causal_softmax_backward_row(DType dt, int keep, int t, float scale, const float* __restrict p,
                                                 const float* __restrict dp, float* __restrict ds) {
    with_type(
        dt, [&](auto T) __attribute__((always_inline)) {
            float s[kLanes] = {};
            int j = 0;
            for (; j + kLanes <= keep; j += kLanes)
                for (int l = 0; l < kLanes; ++l) s[l] += p[j + l] * dp[j + l];
            for (int l = 0; j + l < keep; ++l) s[l] += p[j + l] * dp[j + l];
            const float dot = lanes_sum(s);
            for (j = 0; j < keep; ++j) ds[j] = round_to(T, scale * p[j] * (dp[j] - dot));
            for (j = keep; j < t; ++j) ds[j] = 0.0f;
        });
}

CPU_LOOP_CLONES void layernorm_forward_row(DType dt, int c, float eps, const float* __restrict x,
                                           const float* __restrict gamma, const float* __restrict beta,
                                           float* __restrict y, float* mean, float* rstd) {
    with_type(
        dt, [&](auto T) __attribute__((always_inline)) {
            double s[kLanes] = {};
            int j = 0;
            for (; j + kLanes <= c; j += kLanes)
                for (int l = 0; l < kLanes; ++l) s[l] += double(x[j + l]);
            for (int l = 0; j + l < c; ++l) s[l] += double(x[j + l]);
            const float m = float(lanes_sum(s) / c);
            double q[kLanes] = {};
            for (j = 0; j + kLanes <= c; j += kLanes)
                for (int l = 0; l < kLanes; ++l) {
                    const double d = double(x[j + l] - m);
                    q[l] += d * d;
                }
            for (int l = 0; j + l < c; ++l) {
                const double d = double(x[j + l] - m);
                q[l] += d * d;
            }
            const float rs = bn_invstd(float(lanes_sum(q) / c), eps);
            *mean = m;
            *rstd = rs;
            for (j = 0; j < c; ++j) y[j] = round_to(T, gamma[j] * ((x[j] - m) * rs) + beta[j]);
        });
}

CPU_LOOP_CLONES void layernorm_backward_row(DType dt, int c, const float* __restrict dy, const float* __restrict x,
                                            float mean, float rstd, const float* __restrict gamma, float* __restrict dx,
                                            double* __restrict dgamma_sum, double* __restrict dbeta_sum) {
    with_type(
        dt, [&](auto T) __attribute__((always_inline)) {
            double a[kLanes] = {}, b[kLanes] = {};  // sums of gamma dy and gamma dy xhat over the row
            auto channel = [&](int ch, int l) __attribute__((always_inline)) {
                const float xhat = (x[ch] - mean) * rstd;
                const float gd = gamma[ch] * dy[ch];
                a[l] += double(gd);
                b[l] += double(gd) * double(xhat);
                dgamma_sum[ch] += double(dy[ch]) * double(xhat);
                dbeta_sum[ch] += double(dy[ch]);
            };
            int j = 0;
            for (; j + kLanes <= c; j += kLanes)
                for (int l = 0; l < kLanes; ++l) channel(j + l, l);
            for (int l = 0; j + l < c; ++l) channel(j + l, l);
            if (!dx) return;
            const float ma = float(lanes_sum(a) / c), mb = float(lanes_sum(b) / c);
            for (j = 0; j < c; ++j) {
                const float xhat = (x[j] - mean) * rstd;
                dx[j] = round_to(T, rstd * (gamma[j] * dy[j] - ma - xhat * mb));
            }
        });
}

}  // namespace mirrored::cpu
