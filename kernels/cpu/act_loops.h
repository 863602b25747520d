// The CPU backend's activation passes: bias, activation and their backward over rows of f32
// values, rounded to the storage type (bf16 and fp16 stored as rounded f32), each built for each
// vector width (loop_clones.h), so that GELU's polynomials (kernels/op_math.h) run 8 or 16 lanes
// wide where the baseline build runs 4. In a file of their own: inlining the polynomials into
// every clone of every activation and type needs a translation unit's inlining budget. In place
// and out of place are separate loops: one that might alias is vectorised behind a run-time
// overlap check, which in place always fails. Each computes exactly the per-element formula.
#pragma once

#include <cstddef>

#include "kernels/device.h"

namespace mirrored::cpu {

// z = act(round(z + bias)) (bias may be null), rounded to t: one row in place.
void bias_act_in_place(Activation act, DType t, int cols, const float* bias, float* z);
// z = round(z + bias) (or round(z)), then out = act(z), out apart from z: one row.
void bias_act_apart(Activation act, DType t, int cols, const float* bias, float* z, float* out);
// d = act'(z) d, rounded to t.
void act_backward_in_place(Activation act, DType t, size_t n, const float* z, float* d);
// out = act'(z) d, out apart from d.
void act_backward_apart(Activation act, DType t, size_t n, const float* z, const float* d, float* out);

// s[j] = the sum over the rows of dz[i][j], row by row (a bias's gradient).
void column_sums(int rows, int cols, const float* dz, float* s);

}  // namespace mirrored::cpu
