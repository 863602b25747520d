// Launchers of the CUDA backend's own kernels. Each takes the stream and the device ordinal
// (for error messages), checks its shapes, picks the grid and checks the launch. Activation
// arguments are void* with their storage type `t` (f32, bf16 or f16): the launcher dispatches.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/device.h"

namespace mirrored::cuda {

// Floats of scratch the launchers below may need, as a function of the largest row count.
size_t scratch_floats_needed(int max_rows);
constexpr size_t kScratchFloats = size_t(1) << 20;  // 4 MiB a device, sized once: rows up to 512k per op
constexpr int kReduceBlocks = 256;  // most blocks of the two-pass reductions (a grid fixed by n: determinism)

// The stream an op family's launcher (kernels/ops/*.cu) is handed, as these launchers take it.
inline cudaStream_t stream_of(const Device::NativeLaunch& l) { return static_cast<cudaStream_t>(l.stream); }

void bias_act_forward(cudaStream_t s, int dev, DType t, Activation act, int rows, int cols, const float* bias, void* z,
                      void* out);
void act_backward(cudaStream_t s, int dev, DType t, Activation act, size_t n, const void* z, const void* dout,
                  void* dz);
// The column reduction (bias_grad) returns the
// kernels it launched and may use kScratchFloats of scratch for partial sums (column_plan.h).
int bias_grad(cudaStream_t s, int dev, DType t, int rows, int cols, const void* dz, float* db, bool accumulate,
              float* scratch);
void convert(cudaStream_t s, int dev, size_t n, const void* x, DType xt, void* y, DType yt);
void add(cudaStream_t s, int dev, DType t, size_t n, const void* x, void* y);

void fill(cudaStream_t s, int dev, size_t n, float value, float* x);
void set_step_values(cudaStream_t s, int dev, const StepValues& v, StepValues* dst);
void scale(cudaStream_t s, int dev, size_t n, float alpha, float* x);
void axpy(cudaStream_t s, int dev, size_t n, float alpha, const float* x, float* y);
// scratch: 2 * kReduceBlocks floats; out: [sum of (x / loss_scale)^2, non-finite count]
void sum_squares(cudaStream_t s, int dev, size_t n, const float* x, const float* loss_scale, float* out,
                 float* scratch);
void init_params(cudaStream_t s, int dev, const InitArgs& a, float scale, size_t n, float* out);
void checksum(cudaStream_t s, int dev, size_t n, const float* x, uint64_t* out);
// sum_to_all (kernels/ops/peer_sums.h): every buffer on this GPU or a peer with access enabled.
void sum_to_all(cudaStream_t s, int dev, const PeerBuffers& b, size_t offset, size_t n, DType t);
// sum_into (kernels/ops/peer_sums.h) over f32 buffers on this GPU (or peers with access enabled).
void sum_into(cudaStream_t s, int dev, const PeerBuffers& b, int into, size_t offset, size_t n);
// dst += src; src may live on a peer GPU with peer access enabled (or on the same GPU).
void add_inplace(cudaStream_t s, int dev, size_t n, const float* src, float* dst);

}  // namespace mirrored::cuda
