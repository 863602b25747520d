// Rotary position embeddings (RoPE) as Hugging Face's Llama applies them ("rotate half"): in a
// head of width d, element e < d/2 and element e + d/2 form a pair, rotated by the angle
// pos * f_e with f_e = 1 / theta^(2e / d):
//   x_e' = x_e cos - x_{e+d/2} sin,   x_{e+d/2}' = x_{e+d/2} cos + x_e sin.
// The frequencies and angles in f32 as Hugging Face computes them; the rotation in f32, rounded
// once to the storage type. The CPU loops (rope.cpp, the reference) and the CUDA kernel (rope.cu).
#pragma once

#include "kernels/device.h"

namespace mirrored {

constexpr int kMaxRopeHeadWidth = 256;

// Hugging Face's rope_scaling, for models trained past their original context, applied to the
// frequencies as Hugging Face computes them (f32): linear divides every frequency by `factor`;
// llama3 (Llama 3.1 and later) divides those whose wavelength 2 pi / f exceeds
// original_positions / low_freq_factor, keeps those under original_positions / high_freq_factor,
// and blends the ones between: (1 - s) f / factor + s f, s = (original_positions / wavelength -
// low_freq_factor) / (high_freq_factor - low_freq_factor).
struct RopeScaling {
    enum class Kind { none, linear, llama3 };
    Kind kind = Kind::none;
    float factor = 1.0f, low_freq_factor = 1.0f, high_freq_factor = 4.0f;
    int original_positions = 8192;
    bool operator==(const RopeScaling&) const = default;
};

// Where the rotation applies: rows = samples * t rows of row_width elements; row r holds position
// first_position + r % t; its first `heads` heads (columns 0 .. heads * head_dim) are rotated -
// in an attention's qkv rows, the query heads and then the key heads.
struct RopeShape {
    int samples = 0, t = 0, first_position = 0, row_width = 0, heads = 0, head_dim = 0;
    float theta = 10000.0f;
    RopeScaling scaling;
};

// Rotates in place; inverse rotates back (the transpose: backward's gradient through the rotation).
// An Error (on the caller's thread) for an odd or too wide head, or heads past the row.
void rope_rotate(Device& d, Stream s, const RopeShape& r, bool inverse, void* x);

// f_e for e < head_dim / 2, the same on every backend (the CUDA kernel takes them from here).
struct RopeFrequencies {
    float f[kMaxRopeHeadWidth / 2];
};
RopeFrequencies rope_frequencies(float theta, int head_dim, const RopeScaling& scaling = {});

// The CUDA launcher, set by rope.cu where the CUDA backend is built; returns the kernels launched.
struct RopeKernels {
    int (*rotate)(const Device::NativeLaunch& l, const RopeShape& r, const RopeFrequencies& f, bool inverse,
                  void* x) = nullptr;
};
extern RopeKernels rope_cuda;

}  // namespace mirrored
