// The products: GEMMs, strided-batched GEMMs, and a dense layer's two products with their
// elementwise work. The CPU's (gemm.cpp, the reference) run the kernel chosen for each product's
// shape (kernels/cpu/gemm_choice.h) or OpenBLAS; CUDA's (gemm.cu) run cuBLAS with the handle and
// workspace the device binds to its compute stream, and cuBLASLt's fused epilogues
// (kernels/cuda/fused_gemm.h) where strategy.fused_epilogues is on. Every product accumulates in
// f32; operands are typed by GemmTypes (activations, the weights' compute copy, f32 gradients).
#pragma once

#include <cstdint>

#include "kernels/device.h"

namespace mirrored {

// C = alpha op(A) op(B) + beta C (row-major); k == 0 gives beta C (on CUDA for an f32 C with
// ldc == n only). On CUDA, on the compute stream only: the cuBLAS workspace is that stream's alone
// (another stream's product is refused).
void gemm(Device& d, Stream s, bool trans_a, bool trans_b, int m, int n, int k, float alpha, const void* a, int lda,
          const void* b, int ldb, float beta, void* c, int ldc, GemmTypes types = {});
// `batches` GEMMs at once: matrix i's operands start stride_a/b/c elements after matrix i-1's
// (cuBLAS's strided-batched products; elsewhere one gemm per matrix).
void gemm_batched(Device& d, Stream s, bool trans_a, bool trans_b, int m, int n, int k, float alpha, const void* a,
                  int lda, int64_t stride_a, const void* b, int ldb, int64_t stride_b, float beta, void* c, int ldc,
                  int64_t stride_c, int batches, GemmTypes types = {});

// A dense layer's products; the reference - and every case not fused - is gemm and the
// activation ops (kernels/ops/activation.h):
//   dense_forward:     z[rows,units] = x[rows,inputs] w[units,inputs]^T, then
//                      bias_activation(z += bias, y = act(z)) unless there is neither
//   dense_weight_grad: dw[units,inputs] (+)= dz^T x, then bias_gradient(db) when db is given
// types are the GEMM's: {x, w, z} forward, {dz, x, dw} for the weight gradient. With
// d.fused_epilogues() a fusable case (below) is one launch: cuBLASLt's epilogue on CUDA where it
// has an algorithm for the case, the reference's composition as one task on a simulated GPU (so
// its host calls follow CUDA's).
void dense_forward(Device& d, Stream s, Activation act, int rows, int units, int inputs, const void* x, const void* w,
                   const float* bias, void* z, void* y, GemmTypes types);
void dense_weight_grad(Device& d, Stream s, int rows, int units, int inputs, const void* dz, const void* x, float* dw,
                       float* db, bool accumulate, GemmTypes types);
// The cases fused into one launch (with y == z): bias and/or ReLU forward, and the bias gradient
// of a product that does not accumulate.
inline bool fusable_dense_forward(Activation act, bool bias) {
    return act == Activation::relu || (act == Activation::none && bias);
}
inline bool fusable_dense_weight_grad(bool bias, bool accumulate) { return bias && !accumulate; }

namespace cpu {
// gemm on f32 host memory; C rounded to c_type where that is a 16-bit type.
void gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda, const float* b,
          int ldb, float beta, float* c, int ldc, DType c_type);
}  // namespace cpu

// The CUDA launchers, set by gemm.cu where the CUDA backend is built; each returns the kernels it
// launched - the fused ones 0 where cuBLASLt has no algorithm for the case (nothing issued).
struct GemmKernels {
    int (*gemm)(const Device::NativeLaunch& l, bool trans_a, bool trans_b, int m, int n, int k, float alpha,
                const void* a, int lda, const void* b, int ldb, float beta, void* c, int ldc, GemmTypes t) = nullptr;
    int (*gemm_batched)(const Device::NativeLaunch& l, bool trans_a, bool trans_b, int m, int n, int k, float alpha,
                        const void* a, int lda, int64_t stride_a, const void* b, int ldb, int64_t stride_b, float beta,
                        void* c, int ldc, int64_t stride_c, int batches, GemmTypes t) = nullptr;
    int (*fused_forward)(const Device::NativeLaunch& l, Activation act, int rows, int units, int inputs, const void* x,
                         const void* w, const float* bias, void* y, GemmTypes t) = nullptr;
    int (*fused_weight_grad)(const Device::NativeLaunch& l, int rows, int units, int inputs, const void* dz,
                             const void* x, float* dw, float* db, GemmTypes t) = nullptr;
};
extern GemmKernels gemm_cuda;

}  // namespace mirrored
