// GEMMs through kernels JIT-compiled for their exact shape (libxsmm), where they beat OpenBLAS.
//
// A replica's products are small in one dimension (its 64 rows): OpenBLAS copies both operands
// into packed panels on every call, and for these shapes the packing and the edge handling cost
// 15-30% of the product. libxsmm generates, once per shape and leading dimensions, a kernel that
// reads the operands where they lie; on an AVX-512 core it runs the default MLP's products at
// 250-265 GFLOP/s against OpenBLAS's 200-225 (docs/PERFORMANCE.md). It only multiplies
// non-transposed column-major operands with alpha 1 and beta 0 or 1, so a row-major product with
// a transposed operand is asked for with that operand (or the result) transposed into a scratch:
// always the small one, a replica's rows, never the weights.
//
// Built in where libxsmm's headers are (Makefile: WITH_XSMM), used on CPUs where it generates
// AVX-512 or AVX2 code. Which products they multiply is measured shape by shape, or follows the
// rules measured for each vector width (kernels/cpu/gemm_choice.h); MIRRORED_JIT_GEMM=0 turns
// them off.
#pragma once

#include <string>

namespace mirrored {

struct Window2d;

// "libxsmm 1.17, cpx" (its target, here Cooper Lake's AVX-512; "hsw" on AVX2) where the JIT
// kernels are in use; empty where they are not.
std::string jit_gemm_description();

// The kernels' vector width in floats, which says whose rules are in use: 16 (AVX-512), 8 (AVX2),
// 0 where there are no kernels.
int jit_gemm_vector_floats();

// Whether the static rules give this row-major product (C[m,n] = op(A) op(B), alpha 1, beta 0 or
// 1) to the kernels: the fallback where products are not timed (MIRRORED_JIT_GEMM=rules); with
// MIRRORED_JIT_GEMM=all, every product they can multiply.
bool jit_gemm_takes(bool ta, bool tb, int m, int n, int k, bool accumulate);
// Whether the kernels can multiply it at all: they are in use, and not both operands transposed,
// nor B transposed with C added to.
bool jit_gemm_multiplies(bool ta, bool tb, int m, int n, int k, bool accumulate);
// Row-major C[m,n] = op(A) op(B), plus C when accumulate, for any product the kernels can
// multiply; false, touching nothing, where they cannot.
bool jit_gemm_any_shape(bool ta, bool tb, int m, int n, int k, const float* a, int lda, const float* b, int ldb,
                        bool accumulate, float* c, int ldc);
// Row-major C[m,n] = A B^T (plus C when accumulate) with B [n, k] (a dense layer's weights, at most
// kCpuJitWeightMaxFloats) turned around into a per-thread scratch: then C^T = B A^T is a plain
// kernel product over A's rows as they lie, written straight into C, however many rows (the
// kernels' other way to B^T, A and C turned, is bounded by them). false, touching nothing, where
// the kernels cannot multiply it.
bool jit_gemm_weight_turned(int m, int n, int k, const float* a, int lda, const float* b, int ldb, bool accumulate,
                            float* c, int ldc);

// Row-major C[m,n] = A^T B (plus C when accumulate), A [k, m]: in blocks of jit_gemm_k_block(m, k)
// rows, each A block transposed into the per-thread scratch and its product added onto C, so each
// element sums over k block by block (one block where A^T fits whole: jit_gemm_any_shape's A^T;
// more for a weight gradient over thousands of rows). false, touching nothing, where the kernels
// cannot multiply it.
bool jit_gemm_k_blocked(int m, int n, int k, const float* a, int lda, const float* b, int ldb, bool accumulate,
                        float* c, int ldc);
// Its block of rows: as many as fill kCpuJitTransposedMaxFloats with m columns, in whole 16s; 0
// where m leaves fewer than 16.
int jit_gemm_k_block(int m, int k);

// A convolution's forward product without im2col columns (conv_forward, kernels/ops/conv.h): y[n*oh*ow, F] =
// the windows of x (NHWC) times wt[kh, kw, c, F]. Each output row of an image is one
// batch-reduce kernel over the kh x kw window positions - per position a [ow, c] x [c, F]
// product read straight from a zero-padded copy of the image, the sums kept in registers - so
// nothing the size of the columns is written or read. false, touching nothing, where there is no
// kernel.
bool jit_conv_forward(const Window2d& g, const float* x, const float* wt, int filters, float* y);
// Its gradients the same way: dw[F, kh, kw, c] = dz^T . columns (conv_weight_grad), and
// dx = the columns' adjoint of dz . w[F, kh, kw, c] (conv_input_grad: stride 1 with
// padding inside the window only, a convolution of dz with the window flipped).
bool jit_conv_weight_grad(const Window2d& g, const float* x, const float* dz, int filters, float* dw);
bool jit_conv_input_grad(const Window2d& g, const float* dz, const float* w, int filters, float* dx);

}  // namespace mirrored
