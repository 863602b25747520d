// Launchers of the CUDA backend's own kernels. Each takes the stream and the device ordinal
// (for error messages), checks its shapes, picks the grid and checks the launch.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/device.h"

namespace mirrored::cuda {

// Floats of scratch the launchers below may need, as a function of the largest row count.
size_t scratch_floats_needed(int max_rows);
constexpr int kReduceBlocks = 256;  // fixed grid of the two-pass reductions: determinism

void bias_act_forward(cudaStream_t s, int dev, Activation act, int rows, int cols, const float* bias,
                      float* z, float* out);
void act_backward(cudaStream_t s, int dev, Activation act, size_t n, const float* z,
                  const float* dout, float* dz);
void bias_grad(cudaStream_t s, int dev, int rows, int cols, const float* dz, float* db,
               bool accumulate);
// scratch: 2 * rows floats
void softmax_xent(cudaStream_t s, int dev, int rows, int classes, const float* logits,
                  const int32_t* labels, float grad_scale, float* dlogits, double* metrics,
                  float* scratch);
void dropout(cudaStream_t s, int dev, const DropoutArgs& a, int rows, int cols, const float* x,
             float* y);
void fill(cudaStream_t s, int dev, size_t n, float value, float* x);
void scale(cudaStream_t s, int dev, size_t n, float alpha, float* x);
void axpy(cudaStream_t s, int dev, size_t n, float alpha, const float* x, float* y);
// scratch: kReduceBlocks floats
void sum_squares(cudaStream_t s, int dev, size_t n, const float* x, float* out, float* scratch);
void init_params(cudaStream_t s, int dev, const InitArgs& a, float scale, size_t n, float* out);
void sgd_update(cudaStream_t s, int dev, size_t n, float* p, const float* g, float* m,
                const SgdArgs& a);
void adamw_update(cudaStream_t s, int dev, size_t n, float* p, const float* g, float* m, float* v,
                  const AdamWArgs& a, float bias_correction1, float bias_correction2_sqrt);
void checksum(cudaStream_t s, int dev, size_t n, const float* x, uint64_t* out);
// dst += src; src may live on a peer GPU with peer access enabled (or on the same GPU).
void add_inplace(cudaStream_t s, int dev, size_t n, const float* src, float* dst);

}  // namespace mirrored::cuda
