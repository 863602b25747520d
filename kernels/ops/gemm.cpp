#include "kernels/ops/gemm.h"

#include <cblas.h>

#include "kernels/cpu/gemm_choice.h"
#include "kernels/cpu/loop_clones.h"
#include "kernels/op_math.h"
#include "kernels/ops/activation.h"

namespace mirrored {

GemmKernels gemm_cuda;

namespace cpu {

void gemm(bool ta, bool tb, int m, int n, int k, float alpha, const float* a, int lda, const float* b, int ldb,
          float beta, float* c, int ldc, DType c_type) {
    if (m <= 0 || n <= 0) return;
    if (k <= 0) {
        for (int i = 0; i < m; ++i)
            for (int j = 0; j < n; ++j) c[size_t(i) * ldc + j] = beta == 0.0f ? 0.0f : beta * c[size_t(i) * ldc + j];
    } else if (alpha == 1.0f && (beta == 0.0f || beta == 1.0f)) {
        // the kernel chosen for this product's shape (kernels/cpu/gemm_choice.h)
        chosen_sgemm(ProductShape{ta, tb, m, n, k, lda, ldb, ldc, beta == 1.0f}, a, b, c);
    } else {
        cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k, alpha, a,
                    lda, b, ldb, beta, c, ldc);
    }
    if (c_type != DType::f32)
        for (int i = 0; i < m; ++i)
            for (int j = 0; j < n; ++j) c[size_t(i) * ldc + j] = round_to(c_type, c[size_t(i) * ldc + j]);
}

}  // namespace cpu

void gemm(Device& d, Stream s, bool ta, bool tb, int m, int n, int k, float alpha, const void* a, int lda,
          const void* b, int ldb, float beta, void* c, int ldc, GemmTypes t) {
    if (m <= 0 || n <= 0) return;
    if (d.runs_cuda_kernels())
        return launch_cuda(d, s, gemm_cuda.gemm, "gemm", ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, t);
    run_on_host(d, s, "gemm", [=](const Device&) {
        cpu::gemm(ta, tb, m, n, k, alpha, as_floats(a), lda, as_floats(b), ldb, beta, as_floats(c), ldc, t.c);
    });
}

void gemm_batched(Device& d, Stream s, bool ta, bool tb, int m, int n, int k, float alpha, const void* a, int lda,
                  int64_t stride_a, const void* b, int ldb, int64_t stride_b, float beta, void* c, int ldc,
                  int64_t stride_c, int batches, GemmTypes t) {
    if (m <= 0 || n <= 0 || batches <= 0) return;
    if (d.runs_cuda_kernels() && k > 0)  // gemm defines k == 0; cuBLAS would leave C untouched
        return launch_cuda(d, s, gemm_cuda.gemm_batched, "gemm_batched", ta, tb, m, n, k, alpha, a, lda, stride_a, b,
                           ldb, stride_b, beta, c, ldc, stride_c, batches, t);
    // A 16-bit operand is stored in the activation type (f32 on devices that only round to it).
    auto bytes = [&](DType e) { return e == DType::f32 ? int64_t(4) : int64_t(d.act_bytes(1)); };
    for (int i = 0; i < batches; ++i)
        gemm(d, s, ta, tb, m, n, k, alpha, static_cast<const char*>(a) + i * stride_a * bytes(t.a), lda,
             static_cast<const char*>(b) + i * stride_b * bytes(t.b), ldb, beta,
             static_cast<char*>(c) + i * stride_c * bytes(t.c), ldc, t);
}

void dense_forward(Device& d, Stream s, Activation act, int rows, int units, int inputs, const void* x, const void* w,
                   const float* bias, void* z, void* y, GemmTypes t) {
    if (d.fused_epilogues() && z == y && fusable_dense_forward(act, bias != nullptr)) {
        if (d.runs_cuda_kernels()) {
            if (!gemm_cuda.fused_forward) missing_cuda_kernel(d, "dense_forward");
            const int launched =
                gemm_cuda.fused_forward(d.native_launch(s), act, rows, units, inputs, x, w, bias, y, t);
            d.note_launches(launched);
            if (launched) return;  // else cuBLASLt has no algorithm for the case: the reference below
        } else if (d.asynchronous()) {
            return run_on_host(d, s, "dense_forward", [=](const Device& h) {
                cpu::gemm(false, true, rows, units, inputs, 1.0f, as_floats(x), inputs, as_floats(w), inputs, 0.0f,
                          as_floats(z), units, t.c);
                cpu::bias_activation(h.value_dtype(), act, rows, units, bias, as_floats(z), as_floats(y));
            });
        }
    }
    gemm(d, s, false, true, rows, units, inputs, 1.0f, x, inputs, w, inputs, 0.0f, z, units, t);
    if (bias || act != Activation::none) bias_activation(d, s, act, rows, units, bias, z, y);
}

void dense_weight_grad(Device& d, Stream s, int rows, int units, int inputs, const void* dz, const void* x, float* dw,
                       float* db, bool accumulate, GemmTypes t) {
    if (d.fused_epilogues() && fusable_dense_weight_grad(db != nullptr, accumulate)) {
        if (d.runs_cuda_kernels()) {
            if (!gemm_cuda.fused_weight_grad) missing_cuda_kernel(d, "dense_weight_grad");
            const int launched = gemm_cuda.fused_weight_grad(d.native_launch(s), rows, units, inputs, dz, x, dw, db, t);
            d.note_launches(launched);
            if (launched) return;
        } else if (d.asynchronous()) {
            return run_on_host(d, s, "dense_weight_grad", [=](const Device&) {
                cpu::gemm(true, false, units, inputs, rows, 1.0f, as_floats(dz), units, as_floats(x), inputs, 0.0f, dw,
                          inputs, t.c);
                cpu::bias_gradient(rows, units, as_floats(dz), db, false);
            });
        }
    }
    gemm(d, s, true, false, units, inputs, rows, 1.0f, dz, units, x, inputs, accumulate ? 1.0f : 0.0f, dw, inputs, t);
    if (db) bias_gradient(d, s, rows, units, dz, db, accumulate);
}

}  // namespace mirrored
