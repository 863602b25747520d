#include "kernels/ops/rope.h"

#include <cmath>
#include <string>
#include <vector>

#include "base/error.h"
#include "kernels/cpu/loop_clones.h"
#include "kernels/op_math.h"

namespace mirrored {

RopeKernels rope_cuda;

RopeFrequencies rope_frequencies(float theta, int head_dim, const RopeScaling& scaling) {
    RopeFrequencies r{};
    // Hugging Face: 1.0 / (base ** (arange(0, dim, 2).float() / dim)), all in f32
    for (int e = 0; e < head_dim / 2 && e < kMaxRopeHeadWidth / 2; ++e) {
        const float f = 1.0f / std::pow(theta, float(2 * e) / float(head_dim));
        r.f[e] = f;
        if (scaling.kind == RopeScaling::Kind::linear) r.f[e] = f / scaling.factor;
        if (scaling.kind != RopeScaling::Kind::llama3) continue;
        // as torch evaluates it: a number over a tensor is the tensor's reciprocal times the number
        const float original = float(scaling.original_positions), wavelength = (1.0f / f) * float(2 * M_PI);
        const float low_wavelength = float(double(scaling.original_positions) / scaling.low_freq_factor),
                    high_wavelength = float(double(scaling.original_positions) / scaling.high_freq_factor);
        const float scaled = wavelength > low_wavelength ? f / scaling.factor : f;
        const float s = ((1.0f / wavelength) * original - scaling.low_freq_factor) /
                        float(double(scaling.high_freq_factor) - double(scaling.low_freq_factor));
        const bool medium = !(wavelength < high_wavelength) && !(wavelength > low_wavelength);
        r.f[e] = medium ? (1.0f - s) * scaled / scaling.factor + s * scaled : scaled;
    }
    return r;
}

namespace {

void check_shape(const RopeShape& r) {
    const auto fail = [&](const std::string& what) {
        throw Error(kExitFailure, "rope: " + what + " (heads " + std::to_string(r.heads) + " of width " +
                                      std::to_string(r.head_dim) + " in rows of " + std::to_string(r.row_width) + ")");
    };
    if (r.head_dim <= 0 || r.head_dim % 2 || r.head_dim > kMaxRopeHeadWidth)
        fail("a head's width must be even and at most " + std::to_string(kMaxRopeHeadWidth));
    if (r.heads < 0 || int64_t(r.heads) * r.head_dim > r.row_width) fail("the heads run past the row");
    if (!(r.theta > 1.0f) || !std::isfinite(r.theta)) fail("theta must be a finite number above 1");
    const RopeScaling& k = r.scaling;
    if (k.kind != RopeScaling::Kind::none &&
        (!(k.factor >= 1.0f) || !std::isfinite(k.factor) || k.original_positions < 1 || !(k.low_freq_factor > 0) ||
         !(k.high_freq_factor > k.low_freq_factor) || !std::isfinite(k.high_freq_factor)))
        fail("rope scaling needs factor >= 1, 0 < low_freq_factor < high_freq_factor and original positions >= 1");
    if (r.first_position < 0 || int64_t(r.first_position) + r.t > (int64_t(1) << 24))
        fail("positions past 2^24 are not exact in f32");
}

// The cos and sin of every (position, pair) of the last call's shape: each step rotates the same
// positions in every layer, so a thread computes the table once.
struct AngleTable {
    int t = -1, first = -1, half = -1;
    float theta = 0.0f;
    RopeScaling scaling;
    std::vector<float> cos, sin;
    void fit(const RopeShape& r) {
        const int half_d = r.head_dim / 2;
        if (t == r.t && first == r.first_position && half == half_d && theta == r.theta && scaling == r.scaling) return;
        const RopeFrequencies f = rope_frequencies(r.theta, r.head_dim, r.scaling);
        cos.resize(size_t(r.t) * half_d);
        sin.resize(size_t(r.t) * half_d);
        for (int i = 0; i < r.t; ++i)
            for (int e = 0; e < half_d; ++e) {
                const float angle = float(r.first_position + i) * f.f[e];
                cos[size_t(i) * half_d + e] = std::cos(angle);
                sin[size_t(i) * half_d + e] = std::sin(angle);
            }
        t = r.t, first = r.first_position, half = half_d, theta = r.theta, scaling = r.scaling;
    }
};

}  // namespace

namespace cpu {

// One row's heads rotated by its position's angles (c, s: half_d of each).
CPU_LOOP_CLONES void rope_row(DType dt, int heads, int half_d, float sign, const float* __restrict c,
                              const float* __restrict s, float* __restrict x) {
    with_storage_type(
        dt, [&](auto T) __attribute__((always_inline)) {
            for (int h = 0; h < heads; ++h) {
                float* __restrict a = x + size_t(h) * 2 * half_d;
                float* __restrict b = a + half_d;
                for (int e = 0; e < half_d; ++e) {
                    const float sn = sign * s[e], u = a[e], v = b[e];
                    a[e] = round_to(T, u * c[e] - v * sn);
                    b[e] = round_to(T, v * c[e] + u * sn);
                }
            }
        });
}

}  // namespace cpu

void rope_rotate(Device& d, Stream s, const RopeShape& r, bool inverse, void* x) {
    check_shape(r);
    if (d.runs_cuda_kernels())
        return launch_cuda(d, s, rope_cuda.rotate, "rope_rotate", r, rope_frequencies(r.theta, r.head_dim, r.scaling),
                           inverse, x);
    run_on_host(d, s, "rope_rotate", [=](const Device& h) {
        thread_local AngleTable table;
        table.fit(r);
        const int half_d = r.head_dim / 2;
        for (int64_t row = 0; row < int64_t(r.samples) * r.t; ++row) {
            const size_t at = size_t(row % r.t) * half_d;
            cpu::rope_row(h.value_dtype(), r.heads, half_d, inverse ? -1.0f : 1.0f, table.cos.data() + at,
                          table.sin.data() + at, as_floats(x) + size_t(row) * r.row_width);
        }
    });
}

}  // namespace mirrored
