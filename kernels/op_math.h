// Element-wise formulas shared by the CPU and CUDA backends, so both compute the same thing.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/device.h"
#include "kernels/philox.h"

namespace mirrored {

MIRRORED_HD float act_forward(Activation act, float z) {
    switch (act) {
    case Activation::relu: return z > 0.0f ? z : 0.0f;
    case Activation::gelu: return 0.5f * z * (1.0f + erff(z * 0.70710678118654752f));
    default: return z;
    }
}

MIRRORED_HD float act_derivative(Activation act, float z) {
    switch (act) {
    case Activation::relu: return z > 0.0f ? 1.0f : 0.0f;
    case Activation::gelu: {
        const float cdf = 0.5f * (1.0f + erff(z * 0.70710678118654752f));
        const float pdf = 0.39894228040143268f * expf(-0.5f * z * z);
        return cdf + z * pdf;
    }
    default: return 1.0f;
    }
}

// Gradient-clipping factor min(1, clip_norm / norm), read from the device-side squared norm.
MIRRORED_HD float clip_factor(float clip_norm, const float* grad_sq_norm) {
    if (clip_norm <= 0.0f || grad_sq_norm == nullptr) return 1.0f;
    const float norm = sqrtf(*grad_sq_norm);
    return norm > clip_norm ? clip_norm / (norm + 1e-6f) : 1.0f;
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

// Scale of an initialiser: the uniform bound or the normal standard deviation. Computed on the
// host in double so both backends receive the same float.
inline float init_scale(const InitArgs& a) {
    switch (a.kind) {
    case InitKind::he_uniform: return static_cast<float>(std::sqrt(6.0 / a.fan_in));
    case InitKind::he_normal: return static_cast<float>(std::sqrt(2.0 / a.fan_in));
    case InitKind::glorot_uniform: return static_cast<float>(std::sqrt(6.0 / (a.fan_in + a.fan_out)));
    case InitKind::glorot_normal: return static_cast<float>(std::sqrt(2.0 / (a.fan_in + a.fan_out)));
    default: return 0.0f;
    }
}

MIRRORED_HD bool init_is_normal(InitKind k) {
    return k == InitKind::he_normal || k == InitKind::glorot_normal;
}

// Element i of an initialised tensor.
MIRRORED_HD float init_value(InitKind kind, uint64_t seed, uint32_t tensor_id, float scale,
                             uint64_t i) {
    if (kind == InitKind::zeros) return 0.0f;
    if (init_is_normal(kind)) {
        const Philox4 r = philox(seed, i / 2, kStreamInit, tensor_id);
        const int w = static_cast<int>(i % 2) * 2;
        return scale * normal_from(r.v[w], r.v[w + 1]);
    }
    const Philox4 r = philox(seed, i / 4, kStreamInit, tensor_id);
    return scale * (2.0f * uniform01(r.v[i % 4]) - 1.0f);
}

// Dropout keep decision of element (global_row, col) of a [*, cols] activation.
MIRRORED_HD bool dropout_keep(uint64_t seed, uint32_t layer_id, uint32_t step, int64_t global_row,
                              int cols, int col, float rate) {
    const uint64_t e = static_cast<uint64_t>(global_row) * static_cast<uint64_t>(cols) +
                       static_cast<uint64_t>(col);
    const Philox4 r = philox(seed, e / 4, kStreamDropout | (layer_id << 8), step);
    return uniform01(r.v[e % 4]) >= rate;
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
