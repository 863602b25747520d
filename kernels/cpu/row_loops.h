// The CPU backend's row pass of softmax cross-entropy, one row per call, rounded to the storage type t (bf16 and fp16 stored
// as rounded f32). Each is built for each vector width (loop_clones.h). Their sums over a row run
// in eight lanes (lane l takes elements l, l + 8, ...; the lanes are then added in a fixed tree),
// so that they vectorise: a fixed order, the same bits on every run and every CPU, but not the
// bits of one running sum.
#pragma once

#include "kernels/device.h"

namespace mirrored::cpu {

// One row of softmax cross-entropy against class y: returns log(sum exp(z - max)) + max - z[y];
// *argmax = the first index of the largest logit; d (skipped when null; apart from z) =
// (softmax(z) - onehot(y)) gs.
float softmax_xent_row(DType dt, int classes, int y, float gs, const float* z, float* d, int* argmax);
}  // namespace mirrored::cpu
