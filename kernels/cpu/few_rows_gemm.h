// GEMMs over a replica's few rows: the weights streamed once, nothing packed.
//
// At 16-64 rows per replica (a small global batch over several replicas) a dense layer's three
// products each touch the whole weight matrix for few multiply-adds per element: OpenBLAS copies
// the weights into packed panels on every call and runs such products at a quarter of the core's
// peak (nt 16x4096x4096: 49-61 GFLOP/s on a Zen 5 core whose FMA loop reaches 225). These kernels
// read the weights where they lie, once per product, with the rows' values held in registers and
// L1 (AVX-512: tiles of 4 rows by 6 vectors, 24 accumulators):
//   A B^T  (forward, B the [n, k] weights)   dot products along k, in blocks of k that stay in L1;
//   A B    (input gradient, B [k, n])        rows of B times broadcast values of A, by column strips;
//   A^T B  (weight gradient over k rows)     the same, A read down its columns.
// Each element sums over k in its own fixed order (not OpenBLAS's), the same on every call. They
// are one more candidate of the per-product measurement (kernels/cpu/gemm_choice.h): taken where
// they are timed faster, never by the static rules, and only where the JIT kernels are in use.
#pragma once

namespace mirrored {

// The batch side the kernels take: m for A B^T and A B, k for A^T B.
constexpr int kFewRowsGemmMaxRows = 64;

// Whether this CPU runs them (AVX-512F).
bool few_rows_gemm_available();

// Whether they multiply this row-major product: available, not both operands transposed, the batch
// side at most kFewRowsGemmMaxRows.
bool few_rows_gemm_fits(bool ta, bool tb, int m, int n, int k);

// Row-major C[m,n] = op(A) op(B), plus C when accumulate; false, touching nothing, where they do
// not fit.
bool few_rows_gemm(bool ta, bool tb, int m, int n, int k, const float* a, int lda, const float* b, int ldb,
                   bool accumulate, float* c, int ldc);

}  // namespace mirrored
