#include "kernels/cpu/jit_gemm.h"

#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#include "kernels/cpu/gemm_choice.h"
#include "kernels/cpu/scratch.h"
#include "kernels/device.h"

#if MIRRORED_XSMM
#include <cblas.h>
#include <libxsmm.h>
#endif

namespace mirrored {

#if MIRRORED_XSMM
namespace {

using Kernel = libxsmm_smmfunction;

// Which products the kernels take: none; those the rules measured on AVX-512 or on AVX2 give
// them (below: the fallback when products are not timed, kernels/cpu/gemm_choice.h); or every one
// they can multiply (MIRRORED_JIT_GEMM=all, on any target from AVX2: for sweeps).
enum class JitMode { off, avx2_rules, avx512_rules, all };

// The code libxsmm generates here (LIBXSMM_X86_*), asked once; initialises libxsmm.
int target_arch() {
    static const int arch = [] {
        libxsmm_init();
        return libxsmm_get_target_archid();
    }();
    return arch;
}

bool avx512_target() { return target_arch() >= LIBXSMM_X86_AVX512_CORE; }

JitMode jit_mode() {
    static const JitMode mode = [] {
        const GemmKernelChoice choice = gemm_kernel_choice_asked();
        if (choice == GemmKernelChoice::off || target_arch() < LIBXSMM_X86_AVX2) return JitMode::off;
        if (choice == GemmKernelChoice::all) return JitMode::all;
        return avx512_target() ? JitMode::avx512_rules : JitMode::avx2_rules;
    }();
    return mode;
}

bool enabled() { return jit_mode() != JitMode::off; }

// Whether the kernels multiply this layout at all, rules aside: not both operands transposed,
// and with B transposed not onto C (the product is transposed into C afterwards).
bool kernels_multiply(bool ta, bool tb, int m, int n, int k, bool accumulate) {
    return enabled() && !(ta && tb) && !(tb && accumulate) && m > 0 && n > 0 && k > 0;
}

// A kernel's shape: column-major C[m,n] (+)= A[m,k] B[k,n] with these leading dimensions;
// trans_b: B is given as B^T[n,k] (ldb its leading dimension).
struct KernelShape {
    int m, n, k, lda, ldb, ldc;
    bool accumulate;
    bool trans_b = false;
    bool operator==(const KernelShape&) const = default;
};

// The kernel libxsmm's dispatch (one of its *dispatch functions) generates for a shape, or null
// where it cannot. A replica runs the same few shapes every step: a short per-thread list per
// kind of kernel finds them without libxsmm's registry (the list grows in the first step only;
// past kListed shapes the registry answers).
template <typename Fn, typename Dispatch>
Fn cached_kernel(const KernelShape& s, Dispatch dispatch) {
    thread_local std::vector<std::pair<KernelShape, Fn>> kernels;
    for (const auto& [shape, fn] : kernels)
        if (shape == s) return fn;
    const float alpha = 1.0f, beta = s.accumulate ? 1.0f : 0.0f;
    const int flags = s.trans_b ? LIBXSMM_GEMM_FLAG_TRANS_B : LIBXSMM_GEMM_FLAG_NONE, prefetch = LIBXSMM_PREFETCH_NONE;
    const libxsmm_blasint m = s.m, n = s.n, k = s.k, la = s.lda, lb = s.ldb, lc = s.ldc;
    const Fn fn = dispatch(m, n, k, &la, &lb, &lc, &alpha, &beta, &flags, &prefetch);
    constexpr size_t kListed = 32;
    if (kernels.size() < kListed) kernels.emplace_back(s, fn);
    return fn;
}

Kernel kernel_for(int M, int N, int K, int lda, int ldb, int ldc, bool accumulate) {
    return cached_kernel<Kernel>(KernelShape{M, N, K, lda, ldb, ldc, accumulate}, libxsmm_smmdispatch);
}

// This core's data caches, from the system (or typical sizes where it does not say).
long cache_bytes(int name, long otherwise) {
    const long s = sysconf(name);
    return s > 0 ? s : otherwise;
}
long l1_bytes() {
    static const long l1 = cache_bytes(_SC_LEVEL1_DCACHE_SIZE, 32L * 1024);
    return l1;
}
long l2_bytes() {
    static const long l2 = cache_bytes(_SC_LEVEL2_CACHE_SIZE, 256L * 1024);
    return l2;
}

// The kernels do not block for the cache: they stream B and C once and re-read A for every few
// columns. A is cut into row panels of at most half the L2 cache (a multiple of 16 rows, one
// AVX-512 register), each multiplied with the whole of B. Every element still sums over K in the
// kernel's one order, so the panels do not change the result.
int panel_rows(int M, int K) {
    const long rows = (l2_bytes() / 2) / (long(K) * long(sizeof(float))) / 16 * 16;
    return int(std::min<long>(std::max<long>(rows, 16), M));  // M may be under 16
}

// Column-major C[M,N] (+)= A[M,K] B[K,N] by row panels of A and C; false where a kernel is missing.
bool multiply(int M, int N, int K, const float* A, int lda, const float* B, int ldb, bool accumulate, float* C,
              int ldc) {
    const int rows = panel_rows(M, K);
    const Kernel full = kernel_for(rows, N, K, lda, ldb, ldc, accumulate);
    const Kernel last = M % rows ? kernel_for(M % rows, N, K, lda, ldb, ldc, accumulate) : full;
    if (!full || !last) return false;
    for (int i = 0; i < M; i += rows) (M - i >= rows ? full : last)(A + i, B, C + i);
    // The kernels return with the vector registers' upper halves in use. Code compiled for SSE
    // then pays for merging them on every instruction (on Zen 5 the batchnorm and activation
    // loops after a product ran 2-4 times slower): clear them, as compiled AVX code does.
    asm volatile("vzeroupper");
    return true;
}

// A per-thread scratch that grows once (no allocation after a replica's first step).
float* scratch(std::vector<float>& s, size_t floats) { return grow_scratch(s, floats); }

// The per-thread scratch of a transposed operand, one for jit_gemm_any_shape and jit_gemm_k_blocked
// (the memory plan counts one: kernels/backends.cpp).
thread_local std::vector<float> transposed_operand;

// Batch-reduce kernels: column-major C[m, n] (+)= sum over i of A_i[m, k] B_i[k, n], the sums
// held in registers across the batch. A convolution is such a sum over its window positions (or
// over output rows, for the weight gradient), read in place from the images. libxsmm 1.17's
// kernels advance the pointers in the arrays they are given (found by this file's test: a second
// call with the same arrays read past them), so the arrays are filled afresh for every call.
using ConvKernel = libxsmm_smmfunction_reducebatch_addr;

ConvKernel conv_kernel_for(int m, int n, int k, int lda, int ldb, int ldc, bool accumulate, bool trans_b = false) {
    return cached_kernel<ConvKernel>(KernelShape{m, n, k, lda, ldb, ldc, accumulate, trans_b},
                                     libxsmm_smmdispatch_reducebatch_addr);
}

// Images of [h, w, c] with zero borders of (ph, pw): the buffer (per thread, grown once) is
// cleared when a PaddedImage is made, and copy() writes each image's inside over it.
class PaddedImage {
public:
    PaddedImage(std::vector<float>& buffer, int h, int w, int c, int ph, int pw)
        : buf_(buffer), h_(h), w_(w), c_(size_t(c)), ph_(ph), pw_(pw), wp_(size_t(w) + 2 * size_t(pw)) {
        const size_t n = (size_t(h) + 2 * size_t(ph)) * wp_ * c_;
        grow_scratch(buf_, n);
        std::fill(buf_.begin(), buf_.begin() + std::ptrdiff_t(n), 0.0f);
    }
    void copy(const float* image) {
        for (int iy = 0; iy < h_; ++iy)
            std::memcpy(buf_.data() + ((size_t(iy) + ph_) * wp_ + pw_) * c_, image + size_t(iy) * w_ * c_,
                        size_t(w_) * c_ * sizeof(float));
    }
    // The padded pixel (y, x), both counted from the padded image's corner.
    const float* at(size_t y, size_t x) const { return buf_.data() + (y * wp_ + x) * c_; }

private:
    std::vector<float>& buf_;
    int h_, w_;
    size_t c_;
    int ph_, pw_;
    size_t wp_;
};

// Outputs o in [0, out) whose input o * stride + offset lies in [0, in): a window position's
// outputs that read the image, not its zero border.
struct Span {
    int lo, hi;
};
Span inside(int out, int in, int stride, int offset) {
    const int lo = offset >= 0 ? 0 : (-offset + stride - 1) / stride;
    const int hi = in - 1 - offset < 0 ? 0 : std::min(out, (in - 1 - offset) / stride + 1);
    return {std::min(lo, hi), hi};
}

}  // namespace

bool jit_conv_forward(const Window2d& g, const float* x, const float* wt, int filters, float* y) {
    if (!enabled() || g.n <= 0 || filters <= 0) return false;
    const int oh = g.oh(), ow = g.ow(), taps = g.kh * g.kw;
    const size_t c = size_t(g.c);
    // per output row: C[F, ow] = sum over positions t of wt_t[F, c] . x_t[c, ow] (every sw-th pixel)
    const ConvKernel kernel = conv_kernel_for(filters, ow, g.c, filters, g.sw * g.c, filters, false);
    if (!kernel) return false;
    thread_local std::vector<float> buffer;
    thread_local std::vector<const float*> a, b;
    PaddedImage padded(buffer, g.h, g.w, g.c, g.ph, g.pw);
    grow_scratch(a, size_t(taps));
    grow_scratch(b, size_t(taps));
    const unsigned long long count = static_cast<unsigned long long>(taps);
    for (int n = 0; n < g.n; ++n) {
        padded.copy(x + size_t(n) * g.h * g.w * c);
        for (int oy = 0; oy < oh; ++oy) {
            for (int t = 0; t < taps; ++t) {
                a[size_t(t)] = wt + size_t(t) * c * size_t(filters);
                b[size_t(t)] = padded.at(size_t(oy) * g.sh + t / g.kw, size_t(t % g.kw));
            }
            kernel(a.data(), b.data(), y + (size_t(n) * oh + oy) * ow * size_t(filters), &count);
        }
    }
    asm volatile("vzeroupper");  // as after multiply()
    return true;
}

// The input gradient's kernels run along the input channels (their m): with fewer than one
// AVX-512 vector of them (a first layer's 1-3) the columns' products are faster (bench-step
// --layers: the ResNet's first convolution's backward 1.1 -> 2.8 ms). The weight gradient turns
// its product around for them instead (below). Kept at 16 on AVX2, where the CNN's convolutions
// (1, 32 and 64 channels) all ran faster through these kernels than through the columns.
constexpr int kMinGradChannels = 16;

bool jit_conv_weight_grad(const Window2d& g, const float* x, const float* dz, int filters, float* dw) {
    if (!enabled() || filters <= 0) return false;
    const int oh = g.oh(), ow = g.ow(), taps = g.kh * g.kw;
    const size_t c = size_t(g.c), K = c * size_t(taps), F = size_t(filters), pixels = size_t(oh) * ow;
    // Per position t, a sum over the output rows whose input at t is inside the image (the zero
    // border adds nothing), reading x and dz in place (the kernels take B transposed):
    //   16+ channels: dw_t^T[c, F] += x_t[c, cols] . dz_row[cols, F], straight into dw;
    //   fewer: dw_t[F, c] += dz_row^T[F, cols] . x_t[cols, c] - F along the vector instead of
    //   1-3 channels - into a scratch [t][c][F], transposed into dw at the end.
    const bool few = g.c < kMinGradChannels;
    // The output rows each ky reads inside the image, and the columns and kernel of each kx (the
    // columns inside differ at the borders, and with them the product's k).
    struct Columns {
        Span span;
        ConvKernel kernel;
    };
    thread_local std::vector<Span> rows_of;
    thread_local std::vector<Columns> columns_of;
    grow_scratch(rows_of, size_t(g.kh));
    grow_scratch(columns_of, size_t(g.kw));
    for (int ky = 0; ky < g.kh; ++ky) rows_of[size_t(ky)] = inside(oh, g.h, g.sh, ky - g.ph);
    for (int kx = 0; kx < g.kw; ++kx) {
        const Span cols = inside(ow, g.w, g.sw, kx - g.pw);
        columns_of[size_t(kx)] = {cols, nullptr};
        if (cols.hi <= cols.lo) continue;
        const int k = cols.hi - cols.lo;
        const ConvKernel kernel = few ? conv_kernel_for(filters, g.c, k, filters, g.sw * g.c, filters, true, true)
                                      : conv_kernel_for(g.c, filters, k, g.sw * g.c, filters, int(K), true, true);
        if (!kernel) return false;
        columns_of[size_t(kx)].kernel = kernel;
    }
    thread_local std::vector<float> turned;  // few: [t][c][F]
    if (few) {
        float* t = grow_scratch(turned, K * F);
        std::fill(t, t + K * F, 0.0f);
    } else std::fill(dw, dw + K * F, 0.0f);
    thread_local std::vector<const float*> a, b;
    grow_scratch(a, size_t(oh));
    grow_scratch(b, size_t(oh));
    for (int n = 0; n < g.n; ++n) {
        const float* image = x + size_t(n) * g.h * g.w * c;
        const float* dz_image = dz + size_t(n) * pixels * F;
        for (int ky = 0; ky < g.kh; ++ky) {
            const Span rows = rows_of[size_t(ky)];
            for (int kx = 0; kx < g.kw; ++kx) {
                const Span cols = columns_of[size_t(kx)].span;
                if (rows.hi <= rows.lo || cols.hi <= cols.lo) continue;
                for (int oy = rows.lo; oy < rows.hi; ++oy) {
                    const size_t i = size_t(oy - rows.lo), iy = size_t(oy * g.sh + ky - g.ph);
                    const float* x_row = image + (iy * g.w + size_t(cols.lo * g.sw + kx - g.pw)) * c;
                    const float* dz_row = dz_image + (size_t(oy) * ow + size_t(cols.lo)) * F;
                    a[i] = few ? dz_row : x_row;
                    b[i] = few ? x_row : dz_row;
                }
                const unsigned long long count = static_cast<unsigned long long>(rows.hi - rows.lo);
                const size_t t = size_t(ky * g.kw + kx);
                columns_of[size_t(kx)].kernel(a.data(), b.data(), few ? turned.data() + t * c * F : dw + t * c, &count);
            }
        }
    }
    asm volatile("vzeroupper");
    if (few)  // dw[f, t c + j] = turned[t c + j, f]
        cblas_somatcopy(CblasRowMajor, CblasTrans, int(K), filters, 1.0f, turned.data(), filters, dw, int(K));
    return true;
}

bool jit_conv_input_grad(const Window2d& g, const float* dz, const float* w, int filters, float* dx) {
    // stride 1 with padding inside the window: dx is a convolution of dz, padded by (k - 1 - p),
    // with the window flipped
    if (!enabled() || filters <= 0 || g.c < kMinGradChannels || g.sh != 1 || g.sw != 1 || g.ph > g.kh - 1 ||
        g.pw > g.kw - 1)
        return false;
    const int oh = g.oh(), ow = g.ow(), taps = g.kh * g.kw;
    const size_t c = size_t(g.c), K = c * size_t(taps);
    // per input row: dx_row^T[c, w] = sum over positions t of w_t^T[c, F] . dz_t^T[F, w]
    const ConvKernel kernel = conv_kernel_for(g.c, g.w, filters, int(K), filters, g.c, false);
    if (!kernel) return false;
    thread_local std::vector<float> buffer;
    thread_local std::vector<const float*> a, b;
    PaddedImage padded(buffer, oh, ow, filters, g.kh - 1 - g.ph, g.kw - 1 - g.pw);
    grow_scratch(a, size_t(taps));
    grow_scratch(b, size_t(taps));
    const unsigned long long count = static_cast<unsigned long long>(taps);
    for (int n = 0; n < g.n; ++n) {
        padded.copy(dz + size_t(n) * oh * ow * size_t(filters));
        for (int iy = 0; iy < g.h; ++iy) {
            for (int t = 0; t < taps; ++t) {
                const int ky = t / g.kw, kx = t % g.kw;
                a[size_t(t)] = w + size_t(t) * c;
                b[size_t(t)] = padded.at(size_t(iy) + size_t(g.kh - 1 - ky), size_t(g.kw - 1 - kx));
            }
            kernel(a.data(), b.data(), dx + (size_t(n) * g.h + iy) * g.w * c, &count);
        }
    }
    asm volatile("vzeroupper");
    return true;
}

std::string jit_gemm_description() {
    if (!enabled()) return "";
    std::string arch = libxsmm_get_target_arch();
    return "libxsmm " + std::to_string(LIBXSMM_VERSION_MAJOR) + "." + std::to_string(LIBXSMM_VERSION_MINOR) + ", " +
           arch;
}

int jit_gemm_vector_floats() { return enabled() ? (avx512_target() ? 16 : 8) : 0; }

namespace {

// Where the kernels won, measured shape by shape against OpenBLAS on one AVX-512 core
// (docs/PERFORMANCE.md): A B almost everywhere (nothing to transpose); A^T B while A, transposed
// into the scratch, stays small; A B^T (A and the result transposed) for 8 to 128 rows and a wide
// result - gemv-like single rows, narrow results and many rows are OpenBLAS's.
bool avx512_takes(bool ta, bool tb, int m, int n, int k) {
    if (m < 8) return false;
    if (ta) return double(m) * double(k) <= double(kCpuJitTransposedMaxFloats);
    if (tb) return m <= kCpuTransposedGemmMaxRows && n >= (m >= 64 ? 64 : 256);
    return true;
}

// The same on one AVX2 core (Zen 3; docs/PERFORMANCE.md), where the kernels have 16 vector
// registers of 8 floats instead of 32 of 16 and win less often. A B and A^T B run along the
// result's n columns: n must be a multiple of 8 (27 columns ran at half OpenBLAS's rate), and
// not of 1024 - B's rows 4 KiB apart (its leading dimension is n in every product mirrored asks
// for) fall into the same L1 sets, and the kernels, which read B in place, ran at 0.4x-0.7x. From
// 16 rows on they re-read B for every few rows of A, which pays while B[k, n] stays within half
// the L2 cache (there 512 KiB: 64 Ki floats). A B^T runs along A's m rows, re-read for every few
// columns of B: up to 32 rows always, up to 128 while A stays within the L1 cache (there 32 KiB:
// 8 Ki floats). Elsewhere OpenBLAS's packed panels were as fast or faster.
bool avx2_takes(bool ta, bool tb, int m, int n, int k) {
    if (m < 8) return false;
    const double a_bytes = double(m) * double(k) * sizeof(float), b_bytes = double(n) * double(k) * sizeof(float);
    if (tb) return m <= 32 || (m <= kCpuTransposedGemmMaxRows && a_bytes <= double(l1_bytes()));
    if (n % 8 != 0 || n % 1024 == 0) return false;
    if (ta && a_bytes > 512.0 * 1024) return false;  // A transposed into the scratch, as on AVX-512
    return m <= 16 || b_bytes <= double(l2_bytes()) / 2;
}

}  // namespace

bool jit_gemm_takes(bool ta, bool tb, int m, int n, int k, bool accumulate) {
    if (!kernels_multiply(ta, tb, m, n, k, accumulate)) return false;
    switch (jit_mode()) {
        case JitMode::all:
            return true;
        case JitMode::avx512_rules:
            return avx512_takes(ta, tb, m, n, k);
        case JitMode::avx2_rules:
            return avx2_takes(ta, tb, m, n, k);
        case JitMode::off:
            break;
    }
    return false;
}

bool jit_gemm_multiplies(bool ta, bool tb, int m, int n, int k, bool accumulate) {
    return kernels_multiply(ta, tb, m, n, k, accumulate);
}

bool jit_gemm_any_shape(bool ta, bool tb, int m, int n, int k, const float* a, int lda, const float* b, int ldb,
                        bool accumulate, float* c, int ldc) {
    if (!kernels_multiply(ta, tb, m, n, k, accumulate)) return false;
    thread_local std::vector<float> product;
    // Row-major X[r,c] is column-major X^T[c,r] with the same leading dimension; in those terms
    // C^T[n,m] = op(B)^T[n,k] op(A)^T[k,m].
    if (!ta && !tb) return multiply(n, m, k, b, ldb, a, lda, accumulate, c, ldc);
    // A^T[k,m] is A's rows [k,m] transposed: A is the small operand (a layer's gradient); one block
    // where A^T fits the scratch whole
    if (ta) return jit_gemm_k_blocked(m, n, k, a, lda, b, ldb, accumulate, c, ldc);
    // B transposed (a Dense forward, B the weights [n,k]): column-major P[m,n] = A'[m,k] B'[k,n]
    // with A' = A transposed (the replica's rows) and B' = B as it lies, then C = P^T.
    float* at = scratch(transposed_operand, size_t(m) * size_t(k));
    float* p = scratch(product, size_t(m) * size_t(n));
    cblas_somatcopy(CblasRowMajor, CblasTrans, m, k, 1.0f, a, lda, at, m);
    if (!multiply(m, n, k, at, m, b, ldb, false, p, m)) return false;
    cblas_somatcopy(CblasRowMajor, CblasTrans, n, m, 1.0f, p, m, c, ldc);
    return true;
}

bool jit_gemm_weight_turned(int m, int n, int k, const float* a, int lda, const float* b, int ldb, bool accumulate,
                            float* c, int ldc) {
    if (!kernels_multiply(false, false, m, n, k, accumulate) || size_t(n) * size_t(k) > kCpuJitWeightMaxFloats)
        return false;
    thread_local std::vector<float> weight;
    // Column-major C^T[n,m] = B[n,k] A^T[k,m]: B as column-major [n,k] is B^T row-major, A^T is A's
    // rows as they lie, and C^T column-major is C row-major.
    float* bt = scratch(weight, size_t(n) * size_t(k));
    cblas_somatcopy(CblasRowMajor, CblasTrans, n, k, 1.0f, b, ldb, bt, n);
    return multiply(n, m, k, bt, n, a, lda, accumulate, c, ldc);
}

int jit_gemm_k_block(int m, int k) {
    if (m <= 0 || k <= 0) return 0;
    const int block = int(std::min<size_t>(size_t(k), kCpuJitTransposedMaxFloats / size_t(m)));
    return block >= k ? k : block / 16 * 16;  // whole blocks of 16 rows: the kernels' best k
}

bool jit_gemm_k_blocked(int m, int n, int k, const float* a, int lda, const float* b, int ldb, bool accumulate,
                        float* c, int ldc) {
    const int block = jit_gemm_k_block(m, k);
    if (block <= 0 || !kernels_multiply(true, false, m, n, block, true)) return false;
    float* at = scratch(transposed_operand, size_t(m) * size_t(block));
    for (int k0 = 0; k0 < k; k0 += block) {
        const int kb = std::min(block, k - k0);
        const float* a0 = a + size_t(k0) * size_t(lda);
        const float* b0 = b + size_t(k0) * size_t(ldb);
        const bool add = accumulate || k0 > 0;
        cblas_somatcopy(CblasRowMajor, CblasTrans, kb, m, 1.0f, a0, lda, at, kb);
        if (!multiply(n, m, kb, b0, ldb, at, kb, add, c, ldc)) {
            if (k0 == 0) return false;  // nothing touched yet: the caller runs OpenBLAS
            // a later block's kernel could not be made (a tail's shape): the rest by OpenBLAS, onto C
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, m, n, k - k0, 1.0f, a0, lda, b0, ldb, 1.0f, c, ldc);
            return true;
        }
    }
    return true;
}

#else  // built without libxsmm

std::string jit_gemm_description() { return ""; }
int jit_gemm_vector_floats() { return 0; }
bool jit_gemm_takes(bool, bool, int, int, int, bool) { return false; }
bool jit_gemm_multiplies(bool, bool, int, int, int, bool) { return false; }
bool jit_gemm_any_shape(bool, bool, int, int, int, const float*, int, const float*, int, bool, float*, int) {
    return false;
}
bool jit_gemm_weight_turned(int, int, int, const float*, int, const float*, int, bool, float*, int) { return false; }
int jit_gemm_k_block(int, int) { return 0; }
bool jit_gemm_k_blocked(int, int, int, const float*, int, const float*, int, bool, float*, int) { return false; }
bool jit_conv_forward(const Window2d&, const float*, const float*, int, float*) { return false; }
bool jit_conv_weight_grad(const Window2d&, const float*, const float*, int, float*) { return false; }
bool jit_conv_input_grad(const Window2d&, const float*, const float*, int, float*) { return false; }

#endif

}  // namespace mirrored
