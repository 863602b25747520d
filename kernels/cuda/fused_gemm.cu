// cuBLASLt products with epilogues (kernels/cuda/fused_gemm.h says which and why).
#include "kernels/cuda/fused_gemm.h"

#include <cublasLt.h>

#include <cstdint>
#include <cstdio>

#include "kernels/cuda/cuda_check.h"
#include "kernels/ops/gemm.h"

namespace mirrored {

namespace {

enum Kind { kForward = 0, kWeightGrad = 1 };

cublasLtHandle_t lt(void* h) { return static_cast<cublasLtHandle_t>(h); }

// The largest power of two up to 16 that divides the address: the alignment an algorithm may
// assume, and so part of the plan's key.
int alignment(const void* p) {
    const auto v = reinterpret_cast<uintptr_t>(p);
    int a = 16;
    while (a > 1 && v % uintptr_t(a) != 0) a /= 2;
    return a;
}

template <class T>
void set_desc(int ordinal, cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const T& value) {
    CUBLAS_CHECK(ordinal, cublasLtMatmulDescSetAttribute(d, attr, &value, sizeof value));
}
template <class T>
void set_pref(int ordinal, cublasLtMatmulPreference_t p, cublasLtMatmulPreferenceAttributes_t attr, const T& value) {
    CUBLAS_CHECK(ordinal, cublasLtMatmulPreferenceSetAttribute(p, attr, &value, sizeof value));
}

}  // namespace

struct FusedGemm::Plan {
    bool ok = false;  // cuBLASLt has an algorithm for the case
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    cublasLtMatmulAlgo_t algo{};
    ~Plan() {
        if (a) cublasLtMatrixLayoutDestroy(a);
        if (b) cublasLtMatrixLayoutDestroy(b);
        if (d) cublasLtMatrixLayoutDestroy(d);
        if (desc) cublasLtMatmulDescDestroy(desc);
    }
};

FusedGemm::FusedGemm(int ordinal, void* workspace, size_t workspace_bytes)
    : ordinal_(ordinal), workspace_(workspace), workspace_bytes_(workspace_bytes) {
    cublasLtHandle_t h = nullptr;
    CUBLAS_CHECK(ordinal_, cublasLtCreate(&h));
    handle_ = h;
}

FusedGemm::~FusedGemm() {
    plans_.clear();
    if (handle_) cublasLtDestroy(lt(handle_));
}

// Row-major operands as cuBLASLt's column-major ones (a row-major [r, c] matrix is a
// column-major [c, r] one):
//   forward      y^T[units, rows]  = (w^T)^T[units, inputs] . x^T[inputs, rows]    A = w (T), B = x (N)
//   weight grad  dw^T[inputs, units] = x^T[inputs, rows] . (dz^T)^T[rows, units]  A = x (N), B = dz (T)
// so the bias (length units) runs along D's rows forward (BIAS) and along its columns, summed
// over k = rows, for the gradient (BGRADB).
bool FusedGemm::forward(cudaStream_t s, Activation act, int rows, int units, int inputs, const void* x, const void* w,
                        const float* bias, void* y, GemmTypes t, bool tf32) {
    if (rows <= 0 || units <= 0 || inputs <= 0 || !fusable_dense_forward(act, bias != nullptr)) return false;
    // cuBLASLt reads the bias in the output's type (CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE); ours is
    // f32, so a 16-bit output with a bias runs unfused rather than on an undocumented combination.
    if (bias && t.c != DType::f32) return false;
    const cublasLtEpilogue_t epilogue = act == Activation::relu
                                            ? (bias ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_RELU)
                                            : CUBLASLT_EPILOGUE_BIAS;
    const Key key{kForward, int(epilogue), units,        rows,         inputs,       int(t.b),       int(t.a),
                  int(t.c), tf32,          alignment(w), alignment(x), alignment(y), alignment(bias)};
    return run(s, key, true, w, inputs, x, inputs, y, units, bias);
}

bool FusedGemm::weight_grad(cudaStream_t s, int rows, int units, int inputs, const void* dz, const void* x, float* dw,
                            float* db, GemmTypes t, bool tf32) {
    if (rows <= 0 || units <= 0 || inputs <= 0 || !db || t.c != DType::f32) return false;  // db: dw's type
    const Key key{kWeightGrad,   int(CUBLASLT_EPILOGUE_BGRADB),
                  inputs,        units,
                  rows,          int(t.b),
                  int(t.a),      int(t.c),
                  tf32,          alignment(x),
                  alignment(dz), alignment(dw),
                  alignment(db)};
    return run(s, key, false, x, inputs, dz, units, dw, inputs, db);
}

bool FusedGemm::run(cudaStream_t s, const Key& key, bool trans_a, const void* a, int lda, const void* b, int ldb,
                    void* d, int ldd, const void* bias) {
    Plan* p = plan(key, trans_a, lda, ldb, ldd, bias);
    if (!p->ok) return false;
    // The plan's algorithm holds for every bias pointer of the key's alignment; the pointer
    // itself is this call's.
    set_desc(ordinal_, p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
    const float one = 1.0f, zero = 0.0f;
    CUBLAS_CHECK(ordinal_, cublasLtMatmul(lt(handle_), p->desc, &one, a, p->a, b, p->b, &zero, d, p->d, d, p->d,
                                          &p->algo, workspace_, workspace_bytes_, s));
    return true;
}

FusedGemm::Plan* FusedGemm::plan(const Key& key, bool trans_a, int lda, int ldb, int ldd, const void* bias) {
    auto it = plans_.find(key);
    if (it != plans_.end()) return it->second.get();
    auto p = std::make_unique<Plan>();
    const auto [kind, epilogue, m, n, k, ta, tb, td, tf32, align_a, align_b, align_d, align_bias] = key;
    (void)align_bias;  // the heuristic reads the bias pointer's alignment from the descriptor
    const bool all_f32 = ta == int(DType::f32) && tb == int(DType::f32) && td == int(DType::f32);
    const cublasComputeType_t compute = all_f32 && tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    CUBLAS_CHECK(ordinal_, cublasLtMatmulDescCreate(&p->desc, compute, CUDA_R_32F));
    const int32_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = trans_a ? CUBLAS_OP_N : CUBLAS_OP_T;
    set_desc(ordinal_, p->desc, CUBLASLT_MATMUL_DESC_TRANSA, op_a);
    set_desc(ordinal_, p->desc, CUBLASLT_MATMUL_DESC_TRANSB, op_b);
    set_desc(ordinal_, p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, uint32_t(epilogue));
    if (bias) {
        set_desc(ordinal_, p->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, int32_t(cuda_data_type(DType(td))));
        set_desc(ordinal_, p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
    }
    // Stored shapes: op(A) is [m, k], op(B) is [k, n], D is [m, n].
    CUBLAS_CHECK(ordinal_,
                 cublasLtMatrixLayoutCreate(&p->a, cuda_data_type(DType(ta)), trans_a ? k : m, trans_a ? m : k, lda));
    CUBLAS_CHECK(ordinal_,
                 cublasLtMatrixLayoutCreate(&p->b, cuda_data_type(DType(tb)), trans_a ? k : n, trans_a ? n : k, ldb));
    CUBLAS_CHECK(ordinal_, cublasLtMatrixLayoutCreate(&p->d, cuda_data_type(DType(td)), m, n, ldd));

    cublasLtMatmulPreference_t pref = nullptr;
    CUBLAS_CHECK(ordinal_, cublasLtMatmulPreferenceCreate(&pref));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
    try {
        set_pref(ordinal_, pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, uint64_t(workspace_bytes_));
        set_pref(ordinal_, pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, uint32_t(align_a));
        set_pref(ordinal_, pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, uint32_t(align_b));
        set_pref(ordinal_, pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, uint32_t(align_d));
        set_pref(ordinal_, pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, uint32_t(align_d));
        st = cublasLtMatmulAlgoGetHeuristic(lt(handle_), p->desc, p->a, p->b, p->d, p->d, pref, 1, &result, &found);
    } catch (...) {
        cublasLtMatmulPreferenceDestroy(pref);
        throw;
    }
    cublasLtMatmulPreferenceDestroy(pref);
    // No algorithm for this epilogue, type, layout or alignment ("not supported"): the caller runs
    // the unfused ops. "Invalid value" may mean the same for some combinations, or a descriptor of
    // ours that is wrong: the unfused ops run too, but said once per shape, never silently.
    if (st != CUBLAS_STATUS_SUCCESS && st != CUBLAS_STATUS_NOT_SUPPORTED && st != CUBLAS_STATUS_INVALID_VALUE)
        cuda_fail("cublasLtMatmulAlgoGetHeuristic", cublas_status_string(st), __FILE__, __LINE__, ordinal_);
    if (st == CUBLAS_STATUS_INVALID_VALUE)
        std::fprintf(stderr,
                     "warning: cuda:%d: cuBLASLt refused the fused %s product m=%d n=%d k=%d (types %d %d %d, "
                     "tf32 %d) with CUBLAS_STATUS_INVALID_VALUE; the unfused ops run instead\n",
                     ordinal_, kind == kForward ? "forward" : "weight-gradient", m, n, k, ta, tb, td, int(tf32));
    p->ok = st == CUBLAS_STATUS_SUCCESS && found > 0 && result.state == CUBLAS_STATUS_SUCCESS;
    if (p->ok) p->algo = result.algo;
    return plans_.emplace(key, std::move(p)).first->second.get();
}

}  // namespace mirrored
