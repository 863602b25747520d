// Which kernel multiplies each of a CPU replica's products, chosen shape by shape by measurement.
//
// A row-major product C[m,n] = op(A) op(B) (+ C) can run through up to seven kernels: OpenBLAS as
// asked; OpenBLAS on its transpose (C^T = B A^T, then C turned: B packed with the plain copy
// instead of the transposing one); a kernel JIT-generated for the shape (kernels/cpu/jit_gemm.h);
// that kernel on the transpose (B^T A, then turned into C); and, for A B^T, that kernel with B turned
// around (C^T = B A^T over A's rows as they lie, straight into C); for A^T B over many rows, that
// kernel over blocks of them; and, where the batch side is a replica's few rows, a kernel that
// streams the weights once, unpacked (kernels/cpu/few_rows_gemm.h). Which is fastest depends on the
// shape, the leading dimensions, the cores and their caches: rules written from sweeps on a few
// machines missed on others (on AVX2 no result width that is a multiple of 1024, say). So the
// first time a process meets a product's shape (mostly in a replica's first step), each kernel
// that can multiply it is timed on the real operands, and the fastest - the rules' kernel unless
// another is 5% faster - multiplies that shape from then on in every replica of the process. The
// choice is kept per machine in the machine cache (gemm-kernels.txt: the same choice for every
// later run here, no measuring) and recorded in each checkpoint, which a resume adopts: the
// kernels sum in different orders, so a choice made again differently would change the bits. (A
// shape first met after the checkpoint - a last short batch, an evaluation's - is measured again
// where the cache is lost.) Multi-node runs use the rules: each node would measure for itself,
// and node 0's checkpoint could not record the others' choices.
//
// MIRRORED_JIT_GEMM: measure (the default), rules (the static rules measured on AVX-512 and AVX2
// cores, the fallback: no timing, the same choice on every machine of a kind), all (the JIT
// kernels wherever they can multiply: for sweeps), 0 (no JIT kernels: OpenBLAS, and its transpose
// where the rules say).
#pragma once

#include <compare>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace mirrored {

enum class GemmKernelChoice { off, rules, measure, all };
// MIRRORED_JIT_GEMM, read once (an unknown value warns and measures).
GemmKernelChoice gemm_kernel_choice_asked();
// What this process does: as asked, but the rules instead of measuring after cpu_gemm_use_rules()
// (kernels/device.h).
GemmKernelChoice gemm_kernel_choice();
// Each choice's MIRRORED_JIT_GEMM value and what blas_kernel() adds after the JIT kernels for it.
struct GemmKernelChoiceName {
    GemmKernelChoice choice;
    const char* env;     // "measure"
    const char* suffix;  // ", measured per product" ("" for the rules and for none)
};
std::span<const GemmKernelChoiceName> gemm_kernel_choice_names();
const GemmKernelChoiceName& gemm_kernel_choice_name(GemmKernelChoice c);

enum class GemmKernel : uint8_t {
    openblas,
    openblas_turned,
    jit,
    jit_turned,
    jit_weight_turned,
    jit_k_blocked,
    few_rows
};
constexpr GemmKernel kGemmKernels[] = {GemmKernel::openblas,   GemmKernel::openblas_turned,   GemmKernel::jit,
                                       GemmKernel::jit_turned, GemmKernel::jit_weight_turned, GemmKernel::jit_k_blocked,
                                       GemmKernel::few_rows};
// "openblas", "openblas-turned", "jit", "jit-turned", "jit-weight-turned", "jit-k-blocked",
// "few-rows"
const char* gemm_kernel_name(GemmKernel k);

// A product as the choice knows it: layout, size, leading dimensions, and whether C is added to.
struct ProductShape {
    bool ta = false, tb = false;
    int m = 0, n = 0, k = 0, lda = 0, ldb = 0, ldc = 0;
    bool accumulate = false;
    auto operator<=>(const ProductShape&) const = default;
};
// "nt:64x512x784:784,784,512:0" (layout, m x n x k, lda, ldb, ldc, accumulate).
std::string product_text(const ProductShape& s);
// Its key in the machine cache of measured choices (gemm-kernels.txt): the BLAS and CPU, the product.
std::string gemm_choice_cache_key(const ProductShape& s);

// Whether kernel `k` can multiply this product at all.
bool gemm_kernel_fits(GemmKernel k, const ProductShape& s);
// The static rules' kernel for this product (the fallback, and MIRRORED_JIT_GEMM=rules).
GemmKernel rules_gemm_kernel(const ProductShape& s);

// Row-major C = op(A) op(B) (+ C when s.accumulate) through kernel k; false, touching nothing,
// where it cannot multiply the product.
bool run_gemm_kernel(GemmKernel k, const ProductShape& s, const float* a, const float* b, float* c);

// The kernel measured for this product (MIRRORED_JIT_GEMM=measure): chosen earlier in this process
// or adopted, else the machine cache's, else timed on these operands (and then cached). Replicas
// meeting the same shape wait for one measurement and get the same kernel.
GemmKernel measured_gemm_kernel(const ProductShape& s, const float* a, const float* b, float* c);

// Row-major C = op(A) op(B) (+ C) through the kernel chosen for its shape (measured the first
// time this process meets the shape, unless cached or adopted).
void chosen_sgemm(const ProductShape& s, const float* a, const float* b, float* c);

struct GemmKernelTime {
    GemmKernel kernel;
    double seconds;  // per product: the fastest of its timed calls
};
// Each kernel that can multiply the product, timed on these operands (after one untimed call),
// for about `seconds` each and at least once. C is overwritten where nothing is added to it (the
// chosen kernel writes it afterwards), else left as it was (the kernels add to a copy).
std::vector<GemmKernelTime> time_gemm_kernels(const ProductShape& s, const float* a, const float* b, float* c,
                                              double seconds);

// The choices this process measured or adopted: "nt:64x512x784:784,784,512:0=jit;..." (empty
// where nothing was measured: the rules choose the same everywhere, or one kernel fits).
std::string gemm_choices_text();
// Adopts a checkpoint's choices (gemm_choices_text's form); entries that do not parse, or name a
// kernel that cannot multiply their shape here, are left out. Returns how many were adopted;
// `recorded`, where given, gets how many entries the text holds.
size_t adopt_gemm_choices(const std::string& text, size_t* recorded = nullptr);
// Forgets every choice (for tests of the machine cache: as a new process would start).
void forget_gemm_choices();

}  // namespace mirrored
