#include "kernels/ops/rmsnorm.h"

#include <algorithm>
#include <vector>

#include "kernels/cpu/loop_clones.h"
#include "kernels/cpu/scratch.h"
#include "kernels/op_math.h"

namespace mirrored {

RmsnormKernels rmsnorm_cuda;

namespace cpu {

namespace {

// Rows whose per-channel sums the backward keeps in floats before adding them to doubles.
constexpr int kRmsnormRowBlock = 32;

// The sum of gamma dy xhat over a row, in eight lanes.
[[gnu::always_inline]] inline float rmsnorm_row_sum(int n, const float* __restrict gamma, const float* __restrict dy,
                                                    const float* __restrict x, float rs) {
    f32x8 a = {};
    over_lanes(
        n,
        [&](int j) __attribute__((always_inline)) {
            f32x8 g, d, v;
            load8(g, gamma + j);
            load8(d, dy + j);
            load8(v, x + j);
            a += g * d * (v * rs);
        },
        [&](int l, int j) __attribute__((always_inline)) { a[l] += gamma[j] * dy[j] * (x[j] * rs); });
    return lanes_sum(a);
}

}  // namespace

// y = gamma (x rstd) over c channels; the mean of the squares in eight lanes.
CPU_LOOP_CLONES void rmsnorm_forward_row(DType dt, int c, float eps, const float* __restrict x,
                                         const float* __restrict gamma, float* __restrict y, float* rstd) {
    with_storage_type(
        dt, [&](auto T) __attribute__((always_inline)) {
            const float rs = bn_invstd(row_squares_about(c, x, 0.0f) / float(c), eps);
            *rstd = rs;
            for (int j = 0; j < c; ++j) y[j] = round_to(T, gamma[j] * (x[j] * rs));
        });
}

// The backward over `rows` rows: dx (skipped when null) from each row's sum of gamma dy xhat;
// dgamma_sum (double, c) += the sums over the rows of dy xhat, added up in floats over blocks of
// 32 rows in `partial` (c floats).
CPU_LOOP_CLONES void rmsnorm_backward_rows(DType dt, int rows, int c, const float* __restrict dy,
                                           const float* __restrict x, const float* __restrict rstd,
                                           const float* __restrict gamma, float* __restrict dx,
                                           double* __restrict dgamma_sum, float* __restrict partial) {
    with_storage_type(
        dt, [&](auto T) __attribute__((always_inline)) {
            for (int r0 = 0; r0 < rows; r0 += kRmsnormRowBlock) {
                std::fill(partial, partial + c, 0.0f);
                for (int r = r0; r < std::min(rows, r0 + kRmsnormRowBlock); ++r) {
                    const float* __restrict d = dy + size_t(r) * c;
                    const float* __restrict xr = x + size_t(r) * c;
                    const float rs = rstd[r];
                    for (int ch = 0; ch < c; ++ch) partial[ch] += d[ch] * (xr[ch] * rs);
                    if (!dx) continue;
                    const float mb = rmsnorm_row_sum(c, gamma, d, xr, rs) / float(c);
                    float* __restrict out = dx + size_t(r) * c;
                    for (int j = 0; j < c; ++j) out[j] = round_to(T, rs * (gamma[j] * d[j] - (xr[j] * rs) * mb));
                }
                for (int ch = 0; ch < c; ++ch) dgamma_sum[ch] += double(partial[ch]);
            }
        });
}

}  // namespace cpu

void rmsnorm_forward(Device& d, Stream s, int rows, int c, float eps, const void* x, const float* gamma, void* y,
                     float* rstd) {
    if (d.runs_cuda_kernels())
        return launch_cuda(d, s, rmsnorm_cuda.forward, "rmsnorm_forward", rows, c, eps, x, gamma, y, rstd);
    run_on_host(d, s, "rmsnorm_forward", [=](const Device& h) {
        for (int r = 0; r < rows; ++r)
            cpu::rmsnorm_forward_row(h.value_dtype(), c, eps, as_floats(x) + size_t(r) * c, gamma,
                                     as_floats(y) + size_t(r) * c, rstd + r);
    });
}

void rmsnorm_backward(Device& d, Stream s, int rows, int c, const void* dy, const void* x, const float* rstd,
                      const float* gamma, void* dx, float* dgamma, bool accumulate) {
    if (d.runs_cuda_kernels())
        return launch_cuda(d, s, rmsnorm_cuda.backward, "rmsnorm_backward", rows, c, dy, x, rstd, gamma, dx, dgamma,
                           accumulate);
    run_on_host(d, s, "rmsnorm_backward", [=](const Device& h) {
        thread_local std::vector<double> sums;
        thread_local std::vector<float> partial;
        double* dg = grow_scratch(sums, size_t(c));
        std::fill(dg, dg + c, 0.0);
        cpu::rmsnorm_backward_rows(h.value_dtype(), rows, c, as_floats(dy), as_floats(x), rstd, gamma,
                                   dx ? as_floats(dx) : nullptr, dg, grow_scratch(partial, size_t(c)));
        for (int ch = 0; ch < c; ++ch) dgamma[ch] = accumulate ? dgamma[ch] + float(dg[ch]) : float(dg[ch]);
    });
}

}  // namespace mirrored
