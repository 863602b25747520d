#include "kernels/ops/flat.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/cpu/loop_clones.h"
#include "kernels/op_math.h"

namespace mirrored {

FlatKernels flat_cuda;

namespace cpu {

// In doubles, eight lanes wide; the non-finite count beside the squares in the same pass.
CPU_LOOP_CLONES void sum_squares(size_t n, const float* __restrict x, double inv, float* out) {
    f64x8 s = {}, bad = {};
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        f32x8 xf;
        std::memcpy(&xf, x + i, sizeof xf);
        const f64x8 v = __builtin_convertvector(xf, f64x8) * inv;
        s += v * v;
        const i32x8 finite = (xf - xf) == 0;  // -1 where finite: inf - inf and NaN - NaN are NaN
        bad += __builtin_convertvector(finite + 1, f64x8);
    }
    for (int l = 0; i < n; ++i, ++l) {
        const double v = double(x[i]) * inv;
        s[l] += v * v;
        bad[l] += std::isfinite(x[i]) ? 0.0 : 1.0;
    }
    out[0] = float(lanes_sum(s));
    out[1] = float(lanes_sum(bad));
}

}  // namespace cpu

void fill_floats(Device& d, Stream s, size_t n, float value, float* x) {
    if (d.runs_cuda_kernels()) return launch_cuda(d, s, flat_cuda.fill, "fill", n, value, x);
    run_on_host(d, s, "fill", [=](const Device&) { std::fill(x, x + n, value); });
}

void scale_floats(Device& d, Stream s, size_t n, float alpha, float* x) {
    if (d.runs_cuda_kernels()) return launch_cuda(d, s, flat_cuda.scale, "scale", n, alpha, x);
    run_on_host(d, s, "scale", [=](const Device&) {
        for (size_t i = 0; i < n; ++i) x[i] *= alpha;
    });
}

void axpy_floats(Device& d, Stream s, size_t n, float alpha, const float* x, float* y) {
    if (d.runs_cuda_kernels()) return launch_cuda(d, s, flat_cuda.axpy, "axpy", n, alpha, x, y);
    run_on_host(d, s, "axpy", [=](const Device&) {
        for (size_t i = 0; i < n; ++i) y[i] += alpha * x[i];
    });
}

void set_step_values(Device& d, Stream s, const StepValues& v, StepValues* dst) {
    if (d.runs_cuda_kernels()) return launch_cuda(d, s, flat_cuda.step_values, "set_step_values", v, dst);
    run_on_host(d, s, "set_step_values", [=](const Device&) { *dst = v; });
}

void sum_squares(Device& d, Stream s, size_t n, const float* x, const float* loss_scale, float* out) {
    if (d.runs_cuda_kernels()) return launch_cuda(d, s, flat_cuda.sum_squares, "sum_squares", n, x, loss_scale, out);
    run_on_host(d, s, "sum_squares",
                [=](const Device&) { cpu::sum_squares(n, x, loss_scale ? 1.0 / double(*loss_scale) : 1.0, out); });
}

void init_param_values(Device& d, Stream s, const InitArgs& a, size_t n, float* out) {
    if (d.runs_cuda_kernels()) return launch_cuda(d, s, flat_cuda.init, "init_params", a, n, out);
    run_on_host(d, s, "init_params", [=](const Device&) {
        const float sc = init_scale(a);
        for (size_t i = 0; i < n; ++i) out[i] = init_value(a.kind, a.seed, a.tensor_id, sc, i);
    });
}

void checksum_floats(Device& d, Stream s, size_t n, const float* x, uint64_t* out) {
    if (d.runs_cuda_kernels()) return launch_cuda(d, s, flat_cuda.checksum, "checksum", n, x, out);
    run_on_host(d, s, "checksum", [=](const Device&) {
        uint64_t sum = 0;
        for (size_t i = 0; i < n; ++i) {
            uint32_t bits;
            std::memcpy(&bits, x + i, 4);
            sum += checksum_term(bits, i);
        }
        *out = sum;
    });
}

}  // namespace mirrored
