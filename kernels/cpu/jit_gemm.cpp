#include "kernels/cpu/jit_gemm.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kernels/device.h"

#if MIRRORED_XSMM
#include <cblas.h>
#include <libxsmm.h>
#endif

namespace mirrored {

#if MIRRORED_XSMM
namespace {

using Kernel = libxsmm_smmfunction;

bool enabled() {
    static const bool on = [] {
        const char* e = std::getenv("MIRRORED_JIT_GEMM");
        if (e && std::strcmp(e, "0") == 0) return false;
        libxsmm_init();
        // Measured on AVX-512 only; elsewhere OpenBLAS's own kernels are the known quantity.
        return libxsmm_get_target_archid() >= LIBXSMM_X86_AVX512_CORE;
    }();
    return on;
}

// The kernel for a column-major C[M,N] (+)= A[M,K] B[K,N] with these leading dimensions, or
// null where libxsmm cannot generate it. A replica runs the same few shapes every step: a short
// per-thread list finds them without libxsmm's registry (the list grows in the first step only;
// past kListed shapes the registry answers).
Kernel kernel_for(int M, int N, int K, int lda, int ldb, int ldc, bool accumulate) {
    struct Entry {
        int M, N, K, lda, ldb, ldc;
        bool accumulate;
        Kernel fn;
    };
    thread_local std::vector<Entry> kernels;
    for (const Entry& e : kernels)
        if (e.M == M && e.N == N && e.K == K && e.lda == lda && e.ldb == ldb && e.ldc == ldc && e.accumulate == accumulate)
            return e.fn;
    const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    const int flags = LIBXSMM_GEMM_FLAG_NONE, prefetch = LIBXSMM_PREFETCH_NONE;
    const libxsmm_blasint m = M, n = N, k = K, la = lda, lb = ldb, lc = ldc;
    const Kernel fn = libxsmm_smmdispatch(m, n, k, &la, &lb, &lc, &alpha, &beta, &flags, &prefetch);
    constexpr size_t kListed = 32;
    if (kernels.size() < kListed) kernels.push_back({M, N, K, lda, ldb, ldc, accumulate, fn});
    return fn;
}

// The kernels do not block for the cache: they stream B and C once and re-read A for every few
// columns. A is cut into row panels of at most half the L2 cache (a multiple of 16 rows, one
// AVX-512 register), each multiplied with the whole of B. Every element still sums over K in the
// kernel's one order, so the panels do not change the result.
int panel_rows(int M, int K) {
    static const long l2 = [] {
        const long s = sysconf(_SC_LEVEL2_CACHE_SIZE);
        return s > 0 ? s : 256L * 1024;
    }();
    const long rows = (l2 / 2) / (long(K) * long(sizeof(float))) / 16 * 16;
    return int(std::clamp<long>(rows, 16, M));
}

// Column-major C[M,N] (+)= A[M,K] B[K,N] by row panels of A and C; false where a kernel is missing.
bool multiply(int M, int N, int K, const float* A, int lda, const float* B, int ldb, bool accumulate, float* C, int ldc) {
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
float* scratch(std::vector<float>& s, size_t floats) {
    if (s.size() < floats) s.resize(floats);
    return s.data();
}

// The batch-reduce kernel of a convolution's output row: column-major C[F, ow] = sum over the
// window positions of A_i[F, c] B_i[c, ow], B_i read with a stride of sw pixels.
using ConvKernel = libxsmm_smmfunction_reducebatch_addr;

ConvKernel conv_kernel_for(int F, int ow, int c, int ldb) {
    struct Entry {
        int F, ow, c, ldb;
        ConvKernel fn;
    };
    thread_local std::vector<Entry> kernels;
    for (const Entry& e : kernels)
        if (e.F == F && e.ow == ow && e.c == c && e.ldb == ldb) return e.fn;
    const float alpha = 1.0f, beta = 0.0f;
    const int flags = LIBXSMM_GEMM_FLAG_NONE, prefetch = LIBXSMM_PREFETCH_NONE;
    const libxsmm_blasint m = F, n = ow, k = c, la = F, lb = ldb, lc = F;
    const ConvKernel fn = libxsmm_smmdispatch_reducebatch_addr(m, n, k, &la, &lb, &lc, &alpha, &beta, &flags, &prefetch);
    constexpr size_t kListed = 32;
    if (kernels.size() < kListed) kernels.push_back({F, ow, c, ldb, fn});
    return fn;
}

}  // namespace

bool jit_conv_forward(const Window2d& g, const float* x, const float* wt, int filters, float* y) {
    if (!enabled() || g.n <= 0 || filters <= 0) return false;
    const int oh = g.oh(), ow = g.ow(), taps = g.kh * g.kw;
    const size_t c = size_t(g.c), hp = size_t(g.h) + 2 * size_t(g.ph), wp = size_t(g.w) + 2 * size_t(g.pw);
    const ConvKernel kernel = conv_kernel_for(filters, ow, g.c, g.sw * g.c);
    if (!kernel) return false;
    // The image with its padding as zeros: the borders are cleared once, the inside copied per image.
    thread_local std::vector<float> padded;
    thread_local std::vector<const float*> a, b;
    if (padded.size() < hp * wp * c) padded.resize(hp * wp * c);
    std::fill(padded.begin(), padded.begin() + std::ptrdiff_t(hp * wp * c), 0.0f);
    a.resize(size_t(taps));
    b.resize(size_t(taps));
    for (int t = 0; t < taps; ++t) a[size_t(t)] = wt + size_t(t) * c * size_t(filters);
    const unsigned long long count = static_cast<unsigned long long>(taps);
    for (int n = 0; n < g.n; ++n) {
        const float* image = x + size_t(n) * g.h * g.w * c;
        for (int iy = 0; iy < g.h; ++iy)
            std::memcpy(padded.data() + ((size_t(iy) + g.ph) * wp + g.pw) * c, image + size_t(iy) * g.w * c,
                        size_t(g.w) * c * sizeof(float));
        for (int oy = 0; oy < oh; ++oy) {
            for (int t = 0; t < taps; ++t) {
                const int ky = t / g.kw, kx = t % g.kw;
                b[size_t(t)] = padded.data() + ((size_t(oy) * g.sh + ky) * wp + kx) * c;
            }
            kernel(a.data(), b.data(), y + (size_t(n) * oh + oy) * ow * size_t(filters), &count);
        }
    }
    asm volatile("vzeroupper");  // as after multiply()
    return true;
}

std::string jit_gemm_description() {
    if (!enabled()) return "";
    std::string arch = libxsmm_get_target_arch();
    return "libxsmm " + std::to_string(LIBXSMM_VERSION_MAJOR) + "." + std::to_string(LIBXSMM_VERSION_MINOR) + ", " + arch;
}

// Where the kernels won, measured shape by shape against OpenBLAS on one AVX-512 core
// (docs/PERFORMANCE.md): A B almost everywhere (nothing to transpose); A^T B while A, transposed
// into the scratch, stays small; A B^T (A and the result transposed) for 8 to 128 rows and a wide
// result - gemv-like single rows, narrow results and many rows are OpenBLAS's.
bool jit_gemm_takes(bool ta, bool tb, int m, int n, int k, bool accumulate) {
    if (!enabled() || (ta && tb) || m < 8 || n <= 0 || k <= 0) return false;
    if (ta) return double(m) * double(k) <= 128.0 * 1024;
    // B transposed: the result is transposed back, so there is no C to add to
    if (tb) return !accumulate && m <= kCpuTransposedGemmMaxRows && n >= (m >= 64 ? 64 : 256);
    return true;
}

bool jit_gemm(bool ta, bool tb, int m, int n, int k, const float* a, int lda, const float* b, int ldb,
              bool accumulate, float* c, int ldc) {
    if (!jit_gemm_takes(ta, tb, m, n, k, accumulate)) return false;
    thread_local std::vector<float> operand, product;
    // Row-major X[r,c] is column-major X^T[c,r] with the same leading dimension; in those terms
    // C^T[n,m] = op(B)^T[n,k] op(A)^T[k,m].
    if (!ta && !tb) return multiply(n, m, k, b, ldb, a, lda, accumulate, c, ldc);
    if (ta) {  // A^T[k,m] is A's rows [k,m] transposed: A is the small operand (a layer's gradient)
        float* at = scratch(operand, size_t(m) * size_t(k));
        cblas_somatcopy(CblasRowMajor, CblasTrans, k, m, 1.0f, a, lda, at, k);
        return multiply(n, m, k, b, ldb, at, k, accumulate, c, ldc);
    }
    // B transposed (a Dense forward, B the weights [n,k]): column-major P[m,n] = A'[m,k] B'[k,n]
    // with A' = A transposed (the replica's rows) and B' = B as it lies, then C = P^T.
    float* at = scratch(operand, size_t(m) * size_t(k));
    float* p = scratch(product, size_t(m) * size_t(n));
    cblas_somatcopy(CblasRowMajor, CblasTrans, m, k, 1.0f, a, lda, at, m);
    if (!multiply(m, n, k, at, m, b, ldb, false, p, m)) return false;
    cblas_somatcopy(CblasRowMajor, CblasTrans, n, m, 1.0f, p, m, c, ldc);
    return true;
}

#else  // built without libxsmm

std::string jit_gemm_description() { return ""; }
bool jit_gemm_takes(bool, bool, int, int, int, bool) { return false; }
bool jit_gemm(bool, bool, int, int, int, const float*, int, const float*, int, bool, float*, int) { return false; }
bool jit_conv_forward(const Window2d&, const float*, const float*, int, float*) { return false; }

#endif

}  // namespace mirrored
