// Element-wise formulas shared by the CPU and CUDA backends, so both compute the same thing.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/device.h"
#include "base/philox.h"

namespace mirrored {

// One product, one sum, each rounded on its own on every backend. The CPU kernels are built with
// -ffp-contract=off; nvcc contracts a * b + c into one FMA by default (-fmad=true), which rounds
// once and so gives other bits, but never contracts its explicitly rounded intrinsics.
MIRRORED_HD float mul_rounded(float a, float b) {
#if defined(__CUDA_ARCH__)
    return __fmul_rn(a, b);
#else
    return a * b;
#endif
}
MIRRORED_HD float add_rounded(float a, float b) {
#if defined(__CUDA_ARCH__)
    return __fadd_rn(a, b);
#else
    return a + b;
#endif
}

// exp(x) in float arithmetic alone - no call, no table - so that the CPU's loops over it vectorise
// (libm's expf and erff are calls, a third of a GELU transformer's step) and every backend gets
// the same bits (each step rounded on its own: mul_rounded, add_rounded): x = n ln2 + r,
// |r| <= ln2 / 2, e^r by its Taylor polynomial to r^6, 2^n into the exponent. Within 2 ulp of expf
// over [-87, 88]; clamped there (no infinities, no subnormals). The formulas below it (GELU, the
// normal cdf) are written once for both backends but may round differently on a GPU.
MIRRORED_HD float exp_poly(float x) {
    x = x < -87.0f ? -87.0f : x > 88.0f ? 88.0f : x;
    const float magic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer in the low bits
    const float t = add_rounded(mul_rounded(x, 1.44269504088896341f), magic);
    const float n = t - magic;
    // ln2 in two parts
    const float r =
        add_rounded(add_rounded(x, -mul_rounded(n, 0.693145751953125f)), -mul_rounded(n, 1.428606765330187e-6f));
    // 1 + r (1 + r (1/2 + r (1/6 + r (1/24 + r (1/120 + r / 720))))), innermost first
    float p = add_rounded(1.0f / 120, mul_rounded(r, 1.0f / 720));
    p = add_rounded(1.0f / 24, mul_rounded(r, p));
    p = add_rounded(1.0f / 6, mul_rounded(r, p));
    p = add_rounded(0.5f, mul_rounded(r, p));
    p = add_rounded(1.0f, mul_rounded(r, p));
    p = add_rounded(1.0f, mul_rounded(r, p));
    uint32_t tb, pb;
#if defined(__CUDA_ARCH__)
    tb = __float_as_uint(t);
    pb = __float_as_uint(p);
    return __uint_as_float(pb + ((tb - 0x4B400000u) << 23));
#else
    std::memcpy(&tb, &t, 4);
    std::memcpy(&pb, &p, 4);
    pb += (tb - 0x4B400000u) << 23;  // 0x4B400000: the bits of `magic`; the difference is n
    float y;
    std::memcpy(&y, &pb, 4);
    return y;
#endif
}

// The standard normal's cdf at z, given e = exp(-z^2 / 2): erf by Abramowitz and Stegun 7.1.26
// (absolute error below 1.5e-7), which needs exactly the exponential the pdf needs too.
// |z| and the sign by fabsf and copysignf, not by a compare: a select on the sign made GCC
// compute the whole polynomial (and its division) for both signs.
MIRRORED_HD float gelu_cdf(float z, float e) {
    const float a = fabsf(z) * 0.70710678118654752f;
    const float t = 1.0f / (1.0f + 0.3275911f * a);
    const float poly =
        t * (0.254829592f + t * (-0.284496736f + t * (1.421413741f + t * (-1.453152027f + t * 1.061405429f))));
    return 0.5f * (1.0f + copysignf(1.0f - poly * e, z));
}

// GPT-2's GELU, 0.5 z (1 + tanh(u)), u = sqrt(2/pi) (z + 0.044715 z^3), on exp_poly (vectorises).
// With e = e^2u: 1 - tanh(u) = 2 / (e + 1) and 1 + tanh(u) = 2e / (e + 1), each without the
// cancellation of 1 -+ tanh near +-1, and sech^2(u) their product.
// Where exp_poly clamps (|2u| > 87) tanh(u) is +-1 in float and sech^2 is taken as 0, so that
// z * du, large there, does not multiply exp_poly's clamped floor.
struct GeluTanhParts {
    float plus, sech2, du;  // 1 + tanh(u), sech^2(u), du/dz
};
MIRRORED_HD GeluTanhParts gelu_tanh_parts(float z) {
    const float k = 0.79788456080286536f, c = 0.044715f;
    const float two_u = 2.0f * k * (z + c * z * z * z);
    const float e = exp_poly(two_u), inv = 1.0f / (e + 1.0f);
    const float minus = 2.0f * inv, plus = 2.0f * e * inv;
    const bool saturated = two_u > 87.0f || two_u < -87.0f;
    return {plus, saturated ? 0.0f : minus * plus, k * (1.0f + 3.0f * c * z * z)};
}

MIRRORED_HD float act_forward(Activation act, float z) {
    switch (act) {
        case Activation::relu:
            return z > 0.0f ? z : 0.0f;
        case Activation::gelu:
            return z * gelu_cdf(z, exp_poly(-0.5f * z * z));
        case Activation::gelu_tanh:
            return 0.5f * z * gelu_tanh_parts(z).plus;
        default:
            return z;
    }
}

MIRRORED_HD float act_derivative(Activation act, float z) {
    switch (act) {
        case Activation::relu:
            return z > 0.0f ? 1.0f : 0.0f;
        case Activation::gelu: {
            const float e = exp_poly(-0.5f * z * z);  // shared by the cdf and the pdf
            return gelu_cdf(z, e) + z * 0.39894228040143268f * e;
        }
        case Activation::gelu_tanh: {
            const GeluTanhParts g = gelu_tanh_parts(z);
            return 0.5f * g.plus + (g.sech2 == 0.0f ? 0.0f : 0.5f * z * g.sech2 * g.du);
        }
        default:
            return 1.0f;
    }
}

// dz of one element, dout * act'(z). ReLU selects instead of multiplying (PyTorch's
// threshold_backward): a unit that is off passes 0 whatever dout is, and the select vectorises.
MIRRORED_HD float act_backward_value(Activation act, float z, float dout) {
    switch (act) {
        case Activation::relu:
            return z > 0.0f ? dout : 0.0f;
        case Activation::gelu:
        case Activation::gelu_tanh:
            return dout * act_derivative(act, z);
        default:
            return dout;
    }
}

// ---- 16-bit rounding: round-to-nearest-even, as __float2bfloat16_rn / __float2half_rn, written
// once for host and device so that CPU emulation and CUDA storage agree bit for bit.
MIRRORED_HD uint32_t float_bits(float x) {
#if defined(__CUDA_ARCH__)
    return __float_as_uint(x);
#else
    uint32_t b;
    std::memcpy(&b, &x, 4);
    return b;
#endif
}
MIRRORED_HD float bits_float(uint32_t b) {
#if defined(__CUDA_ARCH__)
    return __uint_as_float(b);
#else
    float x;
    std::memcpy(&x, &b, 4);
    return x;
#endif
}

MIRRORED_HD float round_bf16(float x) {
    const uint32_t b = float_bits(x);
    if ((b & 0x7F800000u) == 0x7F800000u) return (b & 0x007FFFFFu) ? bits_float(b | 0x00400000u) : x;  // NaN stays NaN
    return bits_float((b + 0x7FFFu + ((b >> 16) & 1u)) & 0xFFFF0000u);
}

// bf16 in 16-bit storage: the top half of the rounded float, and back (exact).
// Branch-free so that host loops vectorize; the same bits as round_bf16.
MIRRORED_HD uint16_t bf16_bits(float x) {
    const uint32_t b = float_bits(x);
    const uint32_t rounded = (b + 0x7FFFu + ((b >> 16) & 1u)) >> 16;
    return uint16_t((b & 0x7FFFFFFFu) > 0x7F800000u ? (b >> 16) | 0x40u : rounded);  // NaN stays NaN
}
MIRRORED_HD float bf16_value(uint16_t b) { return bits_float(uint32_t(b) << 16); }

#if !defined(__CUDACC__)
// The host backends' peer reduction (CPU, sim): dst += src in f32 or the bf16 wire type.
inline void host_peer_add(void* dst, const void* src, DType t, size_t n) {
    if (t == DType::bf16) {
        uint16_t* d = static_cast<uint16_t*>(dst);
        const uint16_t* x = static_cast<const uint16_t*>(src);
        for (size_t i = 0; i < n; ++i) d[i] = bf16_bits(bf16_value(d[i]) + bf16_value(x[i]));
    } else {
        float* d = static_cast<float*>(dst);
        const float* x = static_cast<const float*>(src);
        for (size_t i = 0; i < n; ++i) d[i] += x[i];
    }
}

// The host backends' sums over peer buffers (CPU, sim): in blocks, so that each pass is a plain
// vector loop over two arrays.
constexpr size_t kHostSumBlock = 1024;

// sum_into (kernels/ops/peer_sums.h) on the host: block by block, so that the destination block stays in the cache
// while each other buffer is added to it - one pass over memory.
inline void host_sum_into(float* const* ptr, int count, int into, size_t offset, size_t n) {
    float* out = ptr[into];
    for (size_t at = offset; at < offset + n; at += kHostSumBlock) {
        const size_t end = std::min(offset + n, at + kHostSumBlock);
        for (int k = 0; k < count; ++k) {
            if (k == into) continue;
            const float* x = ptr[k];
            for (size_t i = at; i < end; ++i) out[i] += x[i];
        }
    }
}

// sum_to_all (kernels/ops/peer_sums.h) on the host: every element summed in buffer order 0, 1, ...
inline void host_sum_to_all(const PeerBuffers& b, size_t offset, size_t n, DType t) {
    constexpr size_t kBlock = kHostSumBlock;
    float sum[kBlock];
    for (size_t at = offset; at < offset + n; at += kBlock) {
        const size_t len = std::min(kBlock, offset + n - at);
        if (t == DType::bf16) {
            const uint16_t* x = static_cast<const uint16_t*>(b.ptr[0]) + at;
            for (size_t i = 0; i < len; ++i) sum[i] = bf16_value(x[i]);
            for (int k = 1; k < b.count; ++k) {
                x = static_cast<const uint16_t*>(b.ptr[k]) + at;
                for (size_t i = 0; i < len; ++i) sum[i] += bf16_value(x[i]);
            }
            for (int k = 0; k < b.count; ++k) {
                uint16_t* y = static_cast<uint16_t*>(b.ptr[k]) + at;
                for (size_t i = 0; i < len; ++i) y[i] = bf16_bits(sum[i]);
            }
            continue;
        }
        std::memcpy(sum, static_cast<const float*>(b.ptr[0]) + at, len * sizeof(float));
        for (int k = 1; k < b.count; ++k) {
            const float* x = static_cast<const float*>(b.ptr[k]) + at;
            for (size_t i = 0; i < len; ++i) sum[i] += x[i];
        }
        for (int k = 0; k < b.count; ++k) std::memcpy(static_cast<float*>(b.ptr[k]) + at, sum, len * sizeof(float));
    }
}
#endif

MIRRORED_HD float round_f16(float x) {
    const uint32_t b = float_bits(x), sign = b & 0x80000000u, a = b & 0x7FFFFFFFu;
    if (a >= 0x7F800000u) return x;                               // inf, NaN
    if (a >= 0x477FF000u) return bits_float(sign | 0x7F800000u);  // >= 65520 rounds to inf
    if (a < 0x33000000u) return bits_float(sign);                 // < 2^-25 rounds to zero
    if (a < 0x38800000u) {                                        // subnormal half: a multiple of 2^-24
        const float q = rintf(bits_float(a) * 16777216.0f) * (1.0f / 16777216.0f);
        return bits_float(sign | float_bits(q));
    }
    return bits_float(sign | ((a + 0xFFFu + ((a >> 13) & 1u)) & 0xFFFFE000u));  // 10 mantissa bits
}

MIRRORED_HD float round_to(DType t, float x) {
    return t == DType::bf16 ? round_bf16(x) : t == DType::f16 ? round_f16(x) : x;
}

// A CPU pass's f32 results rounded in place to the 16-bit storage type t (nothing for f32).
inline void round_stored(float* v, size_t n, DType t) {
    if (t == DType::f32) return;
    for (size_t i = 0; i < n; ++i) v[i] = round_to(t, v[i]);
}

// ---- a loss against float targets (target_loss, kernels/ops/losses.h), one element: its loss,
// the gradient of that loss by z, and whether its prediction is right (bce: z > 0 exactly when
// t > 0.5).
struct TargetLossTerm {
    float loss, grad;
    bool correct;
};
MIRRORED_HD TargetLossTerm target_loss_term(TargetLoss kind, float z, float t) {
    if (kind == TargetLoss::mse) {
        const float d = z - t;
        return {d * d, 2.0f * d, false};
    }
    // log(1 + exp(-|z|)) and the sigmoid without overflow for either sign of z
    const float e = expf(-fabsf(z));
    const float loss = fmaxf(z, 0.0f) - z * t + log1pf(e);
    const float sigmoid = z >= 0.0f ? 1.0f / (1.0f + e) : e / (1.0f + e);
    return {loss, sigmoid - t, (z > 0.0f) == (t > 0.5f)};
}

// ---- the optimizer's view of the gradients: grad_stats = [squared norm of the unscaled
// gradients, non-finite count] (Device::sum_squares), read on the device.
// Every gradient is multiplied by 1 / loss_scale and by the clipping factor min(1, clip / norm).
MIRRORED_HD float grad_factor(float clip_norm, const float* grad_stats, const float* loss_scale) {
    const float unscale = loss_scale ? 1.0f / *loss_scale : 1.0f;
    if (clip_norm <= 0.0f || grad_stats == nullptr) return unscale;
    const float norm = sqrtf(grad_stats[0]);
    return norm > clip_norm ? unscale * (clip_norm / (norm + 1e-6f)) : unscale;
}
// Loss scaling skips the whole step when any gradient overflowed - or when only their squared
// norm did (finite gradients above ~1.8e19 in all): the scale is too large either way, and the
// clipping factor clip / inf would be 0, a step that silently changes nothing.
MIRRORED_HD bool gradients_overflowed(const float* grad_stats) {
    return !(grad_stats[1] == 0.0f && grad_stats[0] <= 3.4028235e38f);
}
MIRRORED_HD bool skip_step(bool skip_nonfinite, const float* grad_stats) {
    return skip_nonfinite && grad_stats != nullptr && gradients_overflowed(grad_stats);
}

// AdamW bias corrections 1 - beta1^t and sqrt(1 - beta2^t), in double on the host so both
// backends receive the same floats.
struct AdamWCorrections {
    float bc1, bc2_sqrt;
};
inline AdamWCorrections adamw_corrections(const AdamWArgs& a) {
    return {static_cast<float>(1.0 - std::pow(double(a.beta1), double(a.step))),
            static_cast<float>(std::sqrt(1.0 - std::pow(double(a.beta2), double(a.step))))};
}

// A step's values: from device memory when the op was given a pointer (a replayed graph), else
// the host's arguments.
MIRRORED_HD uint32_t dropout_step(const DropoutArgs& a) { return a.values ? a.values->step : a.step; }
MIRRORED_HD float sgd_lr(const SgdArgs& a) { return a.values ? a.values->lr : a.lr; }

// Scale of an initialiser: the uniform bound or the normal standard deviation. Computed on the
// host in double so both backends receive the same float.
inline float init_scale(const InitArgs& a) {
    switch (a.kind) {
        case InitKind::he_uniform:
            return static_cast<float>(std::sqrt(6.0 / a.fan_in));
        case InitKind::he_normal:
            return static_cast<float>(std::sqrt(2.0 / a.fan_in));
        case InitKind::glorot_uniform:
            return static_cast<float>(std::sqrt(6.0 / (a.fan_in + a.fan_out)));
        case InitKind::glorot_normal:
            return static_cast<float>(std::sqrt(2.0 / (a.fan_in + a.fan_out)));
        case InitKind::gpt2_normal:
            return 0.02f;
        default:
            return 0.0f;
    }
}

MIRRORED_HD bool init_is_normal(InitKind k) {
    return k == InitKind::he_normal || k == InitKind::glorot_normal || k == InitKind::gpt2_normal;
}

// Element i of an initialised tensor.
MIRRORED_HD float init_value(InitKind kind, uint64_t seed, uint32_t tensor_id, float scale, uint64_t i) {
    if (kind == InitKind::zeros) return 0.0f;
    if (kind == InitKind::ones) return 1.0f;
    if (init_is_normal(kind)) {
        const Philox4 r = philox(seed, i / 2, kStreamInit, tensor_id);
        const int w = static_cast<int>(i % 2) * 2;
        return scale * normal_from(r.v[w], r.v[w + 1]);
    }
    const Philox4 r = philox(seed, i / 4, kStreamInit, tensor_id);
    return scale * (2.0f * uniform01(r.v[i % 4]) - 1.0f);
}

// Dropout keep decision of element (global_row, col) of a [*, cols] activation.
MIRRORED_HD bool dropout_keep(uint64_t seed, uint32_t layer_id, uint32_t step, int64_t global_row, int cols, int col,
                              float rate) {
    const uint64_t e = static_cast<uint64_t>(global_row) * static_cast<uint64_t>(cols) + static_cast<uint64_t>(col);
    const Philox4 r = philox(seed, e / 4, kStreamDropout | (layer_id << 8), step);
    return uniform01(r.v[e % 4]) >= rate;
}

// ---- normalisation statistics, shared so both backends compute the same floats
MIRRORED_HD float bn_mean(float sum, double count) { return float(double(sum) / count); }
MIRRORED_HD float bn_var(float sqsum, double count) { return float(double(sqsum) / count); }
MIRRORED_HD float bn_invstd(float var, float eps) { return 1.0f / sqrtf(var + eps); }
// The running variance is the unbiased estimate (PyTorch's choice).
MIRRORED_HD float bn_unbiased(float var, double count) {
    return count > 1 ? float(double(var) * count / (count - 1)) : var;
}

// bn_finalize for one channel: the batch mean, and with squared sums the inverse standard
// deviation and the running statistics' weighted contributions.
MIRRORED_HD void bn_finalize_channel(const BnStats& a, int ch, const float* sum, const float* sqsum, float* mean,
                                     float* invstd, float* run_mean, float* run_var) {
    const float m = bn_mean(sum[ch], a.count);
    mean[ch] = m;
    if (!sqsum) return;
    const float var = bn_var(sqsum[ch], a.count);
    invstd[ch] = bn_invstd(var, a.eps);
    if (run_mean) run_mean[ch] += a.weight * m;
    if (run_var) run_var[ch] += a.weight * bn_unbiased(var, a.count);
}
MIRRORED_HD float ema(float running, float batch, float momentum) {
    return (1.0f - momentum) * running + momentum * batch;
}

// Dynamic loss scaling, state = [scale, good steps in a row] (PyTorch GradScaler's rule).
MIRRORED_HD void loss_scale_step(float* state, const float* grad_stats, int growth_interval) {
    if (gradients_overflowed(grad_stats)) {
        state[0] *= 0.5f;
        state[1] = 0.0f;
        return;
    }
    state[1] += 1.0f;
    if (state[1] >= float(growth_interval)) {
        state[0] *= 2.0f;
        state[1] = 0.0f;
    }
}

// Order-independent fingerprint term of element i: a bit-mix of (bits, index). Summing these
// with wrap-around is associative, so any thread layout gives the same checksum.
MIRRORED_HD uint64_t checksum_term(uint32_t bits, uint64_t i) {
    uint64_t x = (static_cast<uint64_t>(bits) << 32) ^ (i * 0x9E3779B97F4A7C15ull);
    x ^= x >> 33;
    x *= 0xFF51AFD7ED558CCDull;
    x ^= x >> 33;
    x *= 0xC4CEB9FE1A85EC53ull;
    x ^= x >> 33;
    return x;
}

}  // namespace mirrored
