// A dense layer's GEMMs with their elementwise work fused into cuBLASLt's epilogue, one launch
// where the unfused ops take two: bias and ReLU into the forward product (RELU_BIAS, BIAS,
// RELU), the bias gradient into the weight-gradient product (BGRADB). GELU is not fused:
// cuBLASLt's is the tanh approximation, the layer's the exact erf form.
//
// One plan per case (shapes, types, TF32, epilogue, the operands' alignment): descriptors and
// the heuristic's algorithm, made on first use - host work only, no device allocation, so a
// step made of known cases can be captured into a graph - and kept. A case cuBLASLt has no
// algorithm for is remembered as such, and the caller runs the unfused ops.
#pragma once

#include <cuda_runtime.h>

#include <map>
#include <memory>
#include <tuple>

#include "kernels/device.h"

namespace mirrored {

inline cudaDataType_t cuda_data_type(DType t) {
    return t == DType::bf16 ? CUDA_R_16BF : t == DType::f16 ? CUDA_R_16F : CUDA_R_32F;
}

class FusedGemm {
public:
    // workspace: device memory of this GPU the products may use, for as long as this object lives.
    FusedGemm(int ordinal, void* workspace, size_t workspace_bytes);
    ~FusedGemm();
    FusedGemm(const FusedGemm&) = delete;
    FusedGemm& operator=(const FusedGemm&) = delete;

    // dense_forward (kernels/ops/gemm.h) with z == y, issued on s as one cuBLASLt matmul; false (nothing
    // issued) where the case is not fusable (fusable_dense_forward) or cuBLASLt has no algorithm.
    bool forward(cudaStream_t s, Activation act, int rows, int units, int inputs, const void* x, const void* w,
                 const float* bias, void* y, GemmTypes t, bool tf32);
    // dense_weight_grad without accumulation, db given; false as above.
    bool weight_grad(cudaStream_t s, int rows, int units, int inputs, const void* dz, const void* x, float* dw,
                     float* db, GemmTypes t, bool tf32);

private:
    struct Plan;
    // kind, epilogue, m, n, k, types a/b/d, tf32, alignment of a, b, d, bias
    using Key = std::tuple<int, int, int, int, int, int, int, int, bool, int, int, int, int>;
    bool run(cudaStream_t s, const Key& key, bool trans_a, const void* a, int lda, const void* b, int ldb, void* d,
             int ldd, const void* bias);
    Plan* plan(const Key& key, bool trans_a, int lda, int ldb, int ldd, const void* bias);

    int ordinal_;
    void* workspace_;
    size_t workspace_bytes_;
    void* handle_ = nullptr;  // cublasLtHandle_t
    std::map<Key, std::unique_ptr<Plan>> plans_;
};

}  // namespace mirrored
