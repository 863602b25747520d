#include "kernels/ops/layernorm.h"

#include <algorithm>
#include <vector>

#include "kernels/cpu/loop_clones.h"
#include "kernels/cpu/scratch.h"
#include "kernels/op_math.h"

namespace mirrored {

LayernormKernels layernorm_cuda;

namespace cpu {

namespace {

// Rows whose per-channel sums the backward keeps in floats before adding them to doubles.
constexpr int kLayernormRowBlock = 32;

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

// y = gamma (x - mean) rstd + beta over c channels; mean and rstd of the row (sums in eight
// lanes, the variance about the mean).
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

// The backward over `rows` rows: dx (skipped when null) from each row's sums of gamma dy and
// gamma dy xhat (eight lanes); dgamma_sum and dbeta_sum (double, c each) += the sums over the
// rows of dy xhat and dy, added up in floats over blocks of 32 rows in `partial` (2c floats).
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

}  // namespace cpu

void layernorm_forward(Device& d, Stream s, int rows, int c, float eps, const void* x, const float* gamma,
                       const float* beta, void* y, float* mean, float* rstd) {
    if (d.runs_cuda_kernels())
        return launch_cuda(d, s, layernorm_cuda.forward, "layernorm_forward", rows, c, eps, x, gamma, beta, y, mean,
                           rstd);
    run_on_host(d, s, "layernorm_forward", [=](const Device& h) {
        for (int r = 0; r < rows; ++r)
            cpu::layernorm_forward_row(h.value_dtype(), c, eps, as_floats(x) + size_t(r) * c, gamma, beta,
                                       as_floats(y) + size_t(r) * c, mean + r, rstd + r);
    });
}

void layernorm_backward(Device& d, Stream s, int rows, int c, const void* dy, const void* x, const float* mean,
                        const float* rstd, const float* gamma, void* dx, float* dgamma, float* dbeta, bool accumulate) {
    if (d.runs_cuda_kernels())
        return launch_cuda(d, s, layernorm_cuda.backward, "layernorm_backward", rows, c, dy, x, mean, rstd, gamma, dx,
                           dgamma, dbeta, accumulate);
    run_on_host(d, s, "layernorm_backward", [=](const Device& h) {
        thread_local std::vector<double> sums;  // dgamma, dbeta
        thread_local std::vector<float> partial;
        double* dg = grow_scratch(sums, 2 * size_t(c));
        double* db = dg + c;
        std::fill(dg, dg + 2 * size_t(c), 0.0);
        cpu::layernorm_backward_rows(h.value_dtype(), rows, c, as_floats(dy), as_floats(x), mean, rstd, gamma,
                                     dx ? as_floats(dx) : nullptr, dg, db, grow_scratch(partial, 2 * size_t(c)));
        for (int ch = 0; ch < c; ++ch) {
            dgamma[ch] = accumulate ? dgamma[ch] + float(dg[size_t(ch)]) : float(dg[size_t(ch)]);
            dbeta[ch] = accumulate ? dbeta[ch] + float(db[size_t(ch)]) : float(db[size_t(ch)]);
        }
    });
}

}  // namespace mirrored
