// The CPU backend's row passes: layernorm and the causal softmax, forward and backward, and
// softmax cross-entropy, one row per call, rounded to the storage type t (bf16 and fp16 stored
// as rounded f32). Each is built for each vector width (loop_clones.h). Their sums over a row run
// in eight lanes (lane l takes elements l, l + 8, ...; the lanes are then added in a fixed tree),
// so that they vectorise: a fixed order, the same bits on every run and every CPU, but not the
// bits of one running sum.
#pragma once

#include "kernels/device.h"

namespace mirrored::cpu {

// p[0, keep) = softmax(scale z[0, keep)), p[keep, t) = 0.
void causal_softmax_row(DType dt, int keep, int t, float scale, const float* z, float* p);
// ds[0, keep) = scale p (dp - sum p dp), ds[keep, t) = 0.
void causal_softmax_backward_row(DType dt, int keep, int t, float scale, const float* p, const float* dp, float* ds);
// One row of softmax cross-entropy against class y: returns log(sum exp(z - max)) + max - z[y];
// *argmax = the first index of the largest logit; d (skipped when null; apart from z) =
// (softmax(z) - onehot(y)) gs.
float softmax_xent_row(DType dt, int classes, int y, float gs, const float* z, float* d, int* argmax);
// y = gamma (x - mean) rstd + beta over c channels; mean and rstd of the row (sums in eight lanes,
// the variance about the mean).
void layernorm_forward_row(DType dt, int c, float eps, const float* x, const float* gamma, const float* beta, float* y,
                           float* mean, float* rstd);
// Layernorm's backward over `rows` rows: dx (skipped when null) from each row's sums of gamma dy
// and gamma dy xhat (eight lanes); dgamma_sum and dbeta_sum (double, c each) += the sums over the
// rows of dy xhat and dy, added up in floats over blocks of 32 rows in `partial` (2c floats).
void layernorm_backward_rows(DType dt, int rows, int c, const float* dy, const float* x, const float* mean,
                             const float* rstd, const float* gamma, float* dx, double* dgamma_sum, double* dbeta_sum,
                             float* partial);

}  // namespace mirrored::cpu
