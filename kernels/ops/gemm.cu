// The products on CUDA (gemm.h): cuBLAS with the handle and workspace the device binds to its
// compute stream, and cuBLASLt's fused epilogues (kernels/cuda/fused_gemm.h). Row-major
// C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T, so the operands swap.
#include <cublas_v2.h>

#include <string>

#include "base/error.h"
#include "kernels/cuda/fused_gemm.h"
#include "kernels/cuda/kernel_util.cuh"
#include "kernels/ops/gemm.h"

namespace mirrored::cuda {

namespace {

// The device's cuBLAS handle, which native_launch hands out on the compute stream alone.
cublasHandle_t blas_for(const Device::NativeLaunch& l, const char* op) {
    if (!l.blas)
        throw DeviceError("cuda:" + std::to_string(l.device) + ": " + op +
                          " on a stream other than the compute stream: the cuBLAS workspace is the compute stream's "
                          "alone (two streams' products would race on it)");
    return static_cast<cublasHandle_t>(l.blas);
}

cublasComputeType_t compute_type(const Device::NativeLaunch& l, GemmTypes t) {
    const bool all_f32 = t.a == DType::f32 && t.b == DType::f32 && t.c == DType::f32;
    return all_f32 && l.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
}

cublasOperation_t op_of(bool trans) { return trans ? CUBLAS_OP_T : CUBLAS_OP_N; }

int gemm(const Device::NativeLaunch& l, bool ta, bool tb, int m, int n, int k, float alpha, const void* a, int lda,
         const void* b, int ldb, float beta, void* c, int ldc, GemmTypes t) {
    const cublasHandle_t blas = blas_for(l, "gemm");
    if (k <= 0) {  // cuBLAS leaves C untouched for k == 0; define it as beta * C
        if (ldc != n || t.c != DType::f32)
            throw DeviceError("cuda:" + std::to_string(l.device) + ": gemm with k == 0 needs an f32 C with ldc == n");
        if (beta == 0.0f) fill(stream_of(l), l.device, size_t(m) * n, 0.0f, static_cast<float*>(c));
        else scale(stream_of(l), l.device, size_t(m) * n, beta, static_cast<float*>(c));
        return 1;
    }
    CUBLAS_CHECK(l.device, cublasGemmEx(blas, op_of(tb), op_of(ta), n, m, k, &alpha, b, cuda_data_type(t.b), ldb, a,
                                        cuda_data_type(t.a), lda, &beta, c, cuda_data_type(t.c), ldc,
                                        compute_type(l, t), CUBLAS_GEMM_DEFAULT));
    return 1;
}

int gemm_batched(const Device::NativeLaunch& l, bool ta, bool tb, int m, int n, int k, float alpha, const void* a,
                 int lda, int64_t stride_a, const void* b, int ldb, int64_t stride_b, float beta, void* c, int ldc,
                 int64_t stride_c, int batches, GemmTypes t) {
    CUBLAS_CHECK(l.device, cublasGemmStridedBatchedEx(blas_for(l, "gemm_batched"), op_of(tb), op_of(ta), n, m, k,
                                                      &alpha, b, cuda_data_type(t.b), ldb, stride_b, a,
                                                      cuda_data_type(t.a), lda, stride_a, &beta, c, cuda_data_type(t.c),
                                                      ldc, stride_c, batches, compute_type(l, t), CUBLAS_GEMM_DEFAULT));
    return 1;
}

FusedGemm& fused_for(const Device::NativeLaunch& l, const char* op) {
    blas_for(l, op);  // the cuBLASLt workspace, too, is the compute stream's
    return *static_cast<FusedGemm*>(l.fused_gemm);
}

int fused_forward(const Device::NativeLaunch& l, Activation act, int rows, int units, int inputs, const void* x,
                  const void* w, const float* bias, void* y, GemmTypes t) {
    return fused_for(l, "dense_forward").forward(stream_of(l), act, rows, units, inputs, x, w, bias, y, t, l.tf32);
}

int fused_weight_grad(const Device::NativeLaunch& l, int rows, int units, int inputs, const void* dz, const void* x,
                      float* dw, float* db, GemmTypes t) {
    return fused_for(l, "dense_weight_grad").weight_grad(stream_of(l), rows, units, inputs, dz, x, dw, db, t, l.tf32);
}

const struct Register {
    Register() { gemm_cuda = {gemm, gemm_batched, fused_forward, fused_weight_grad}; }
} registered;

}  // namespace

}  // namespace mirrored::cuda
