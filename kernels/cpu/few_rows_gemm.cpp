#include "kernels/cpu/few_rows_gemm.h"

#include <algorithm>
#include <array>
#include <cstddef>
#include <utility>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace mirrored {

#if defined(__x86_64__)
namespace {

#define FEW_ROWS_TARGET __attribute__((target("avx512f")))

constexpr int kTileRows = 4, kTileVectors = 6, kLanes = 16;
constexpr int kTileFloats = kTileRows * kTileVectors * kLanes;
// A B^T: k in blocks of 512, so that a tile's 6 rows of B (12 KiB) stay in L1 while every tile
// of rows passes over them, and the rows' 4 x 2 KiB stream from L2.
constexpr int kDotBlock = 512;
// A B and A^T B: 64 rows of a strip of B 96 floats wide (24 KiB), in L1 while every tile of rows
// passes over them.
constexpr int kStripRows = 64;

FEW_ROWS_TARGET inline __mmask16 lanes_mask(int lanes) {
    return lanes >= kLanes ? __mmask16(0xFFFF) : __mmask16((1u << lanes) - 1u);
}

// The 16 lanes' sum in a fixed tree (halves, then quarters, ...), AVX-512F alone. GCC 12 warns that
// the shuffles' internal undefined operand may be used uninitialised (it is not).
#if !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
FEW_ROWS_TARGET inline float lanes_total(__m512 v) {
    v = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, 0x4E));  // 256-bit halves
    v = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, 0xB1));  // 128-bit quarters
    v = _mm512_add_ps(v, _mm512_permute_ps(v, 0x4E));        // pairs within a quarter
    v = _mm512_add_ps(v, _mm512_permute_ps(v, 0xB1));
    return _mm512_cvtss_f32(v);
}
#if !defined(__clang__)
#pragma GCC diagnostic pop
#endif

// Tile<R, J>::run for every R in 1..kTileRows and J in 1..kTileVectors, in one table: a product's
// edges take the tiles with fewer rows or vectors.
template <template <int, int> class Tile, int... I>
constexpr auto tile_table(std::integer_sequence<int, I...>) {
    return std::array{&Tile<I / kTileVectors + 1, I % kTileVectors + 1>::run...};
}

template <template <int, int> class Tile>
auto tile_of(int rows, int vectors) {
    static constexpr auto table = tile_table<Tile>(std::make_integer_sequence<int, kTileRows * kTileVectors>{});
    return table[size_t((rows - 1) * kTileVectors + (vectors - 1))];
}

// One tile of A B^T: R rows of A against J rows of B over kc of k. The sums stay per lane in
// `part` between blocks of k; the last block adds the lanes and writes C.
template <int R, int J>
struct DotTile {
    static void run(int kc, const float* a, int lda, const float* b, int ldb, float* part, bool first, bool last,
                    float* c, int ldc, bool accumulate);
};

template <int R, int J>
FEW_ROWS_TARGET void DotTile<R, J>::run(int kc, const float* a, int lda, const float* b, int ldb, float* part,
                                        bool first, bool last, float* c, int ldc, bool accumulate) {
    __m512 s[R][J];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 6
        for (int j = 0; j < J; ++j)
            s[r][j] = first ? _mm512_setzero_ps() : _mm512_load_ps(part + (r * kTileVectors + j) * kLanes);
    int kk = 0;
    for (; kk + kLanes <= kc; kk += kLanes) {
        __m512 av[R];
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) av[r] = _mm512_loadu_ps(a + size_t(r) * size_t(lda) + size_t(kk));
#pragma GCC unroll 6
        for (int j = 0; j < J; ++j) {
            const __m512 bv = _mm512_loadu_ps(b + size_t(j) * size_t(ldb) + size_t(kk));
#pragma GCC unroll 4
            for (int r = 0; r < R; ++r) s[r][j] = _mm512_fmadd_ps(av[r], bv, s[r][j]);
        }
    }
    if (kk < kc) {  // k's last few: masked loads (the lanes past k read nothing)
        const __mmask16 mask = lanes_mask(kc - kk);
        __m512 av[R];
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) av[r] = _mm512_maskz_loadu_ps(mask, a + size_t(r) * size_t(lda) + size_t(kk));
#pragma GCC unroll 6
        for (int j = 0; j < J; ++j) {
            const __m512 bv = _mm512_maskz_loadu_ps(mask, b + size_t(j) * size_t(ldb) + size_t(kk));
#pragma GCC unroll 4
            for (int r = 0; r < R; ++r) s[r][j] = _mm512_fmadd_ps(av[r], bv, s[r][j]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 6
        for (int j = 0; j < J; ++j) {
            if (!last) {
                _mm512_store_ps(part + (r * kTileVectors + j) * kLanes, s[r][j]);
                continue;
            }
            const float v = lanes_total(s[r][j]);
            float& out = c[size_t(r) * size_t(ldc) + size_t(j)];
            out = accumulate ? out + v : v;
        }
}

// C[m,n] (+)= A[m,k] B[n,k]^T, m <= kFewRowsGemmMaxRows: B's rows six at a time, each block of k
// against every tile of A's rows.
void dot_products(int m, int n, int k, const float* a, int lda, const float* b, int ldb, bool accumulate, float* c,
                  int ldc) {
    alignas(64) float part[(kFewRowsGemmMaxRows / kTileRows) * kTileFloats];  // 24 KiB
    for (int j0 = 0; j0 < n; j0 += kTileVectors) {
        const int width = std::min(kTileVectors, n - j0);
        for (int k0 = 0; k0 < k; k0 += kDotBlock) {
            const int kc = std::min(kDotBlock, k - k0);
            for (int i0 = 0, t = 0; i0 < m; i0 += kTileRows, ++t)
                tile_of<DotTile>(std::min(kTileRows, m - i0), width)(
                    kc, a + size_t(i0) * size_t(lda) + size_t(k0), lda, b + size_t(j0) * size_t(ldb) + size_t(k0), ldb,
                    part + size_t(t) * kTileFloats, k0 == 0, k0 + kc == k, c + size_t(i0) * size_t(ldc) + size_t(j0),
                    ldc, accumulate);
        }
    }
}

// One tile of C (+)= A B: R rows by J vectors of a strip, over kc rows of B, each row's vectors
// times the R rows' values of A broadcast. A(r, kk) = a[r * a_row + kk * a_k]: A as it lies (A B)
// or down its columns (A^T B). `ahead`, for the first tile of rows only: the strip's next block of
// B (ahead_rows rows), fetched into the cache while this block is multiplied.
template <int R, int J>
struct AxpyTile {
    static void run(int kc, const float* a, size_t a_row, size_t a_k, const float* b, int ldb, __mmask16 last_mask,
                    bool load_c, float* c, int ldc, const float* ahead, int ahead_rows);
};

template <int R, int J>
FEW_ROWS_TARGET void AxpyTile<R, J>::run(int kc, const float* a, size_t a_row, size_t a_k, const float* b, int ldb,
                                         __mmask16 last_mask, bool load_c, float* c, int ldc, const float* ahead,
                                         int ahead_rows) {
    __mmask16 mask[J];
#pragma GCC unroll 6
    for (int j = 0; j < J; ++j) mask[j] = j == J - 1 ? last_mask : __mmask16(0xFFFF);
    __m512 s[R][J];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 6
        for (int j = 0; j < J; ++j)
            s[r][j] = load_c ? _mm512_maskz_loadu_ps(mask[j], c + size_t(r) * size_t(ldc) + size_t(j) * kLanes)
                             : _mm512_setzero_ps();
    for (int kk = 0; kk < kc; ++kk) {
        const float* row = b + size_t(kk) * size_t(ldb);
        __m512 bv[J];
#pragma GCC unroll 6
        for (int j = 0; j < J; ++j) bv[j] = _mm512_maskz_loadu_ps(mask[j], row + size_t(j) * kLanes);
        if (ahead && kk < ahead_rows) {
#pragma GCC unroll 6
            for (int j = 0; j < J; ++j)
                _mm_prefetch(reinterpret_cast<const char*>(ahead + size_t(kk) * size_t(ldb) + size_t(j) * kLanes),
                             _MM_HINT_T0);
        }
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) {
            const __m512 av = _mm512_set1_ps(a[size_t(r) * a_row + size_t(kk) * a_k]);
#pragma GCC unroll 6
            for (int j = 0; j < J; ++j) s[r][j] = _mm512_fmadd_ps(av, bv[j], s[r][j]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 6
        for (int j = 0; j < J; ++j)
            _mm512_mask_storeu_ps(c + size_t(r) * size_t(ldc) + size_t(j) * kLanes, mask[j], s[r][j]);
}

// C[m,n] (+)= A B over k rows of B [k, n]: strips of 96 columns, each in blocks of 64 rows of B,
// each block against every tile of C's rows (C's strip is added to from the second block on).
FEW_ROWS_TARGET void axpy_products(int m, int n, int k, const float* a, size_t a_row, size_t a_k, const float* b,
                                   int ldb, bool accumulate, float* c, int ldc) {
    constexpr int kStrip = kTileVectors * kLanes;
    for (int j0 = 0; j0 < n; j0 += kStrip) {
        const int width = std::min(kStrip, n - j0), vectors = (width + kLanes - 1) / kLanes;
        const __mmask16 last_mask = lanes_mask(width - (vectors - 1) * kLanes);
        for (int k0 = 0; k0 < k; k0 += kStripRows) {
            const int kc = std::min(kStripRows, k - k0), next = std::min(kStripRows, k - k0 - kc);
            const float* block = b + size_t(k0) * size_t(ldb) + size_t(j0);
            for (int i0 = 0; i0 < m; i0 += kTileRows)
                tile_of<AxpyTile>(std::min(kTileRows, m - i0), vectors)(
                    kc, a + size_t(i0) * a_row + size_t(k0) * a_k, a_row, a_k, block, ldb, last_mask,
                    accumulate || k0 > 0, c + size_t(i0) * size_t(ldc) + size_t(j0), ldc,
                    i0 == 0 && next > 0 ? block + size_t(kc) * size_t(ldb) : nullptr, next);
        }
    }
}

}  // namespace

bool few_rows_gemm_available() {
    static const bool available = __builtin_cpu_supports("avx512f");
    return available;
}

#else

bool few_rows_gemm_available() { return false; }

#endif

bool few_rows_gemm_fits(bool ta, bool tb, int m, int n, int k) {
    return few_rows_gemm_available() && !(ta && tb) && m > 0 && n > 0 && k > 0 && (ta ? k : m) <= kFewRowsGemmMaxRows;
}

bool few_rows_gemm(bool ta, bool tb, int m, int n, int k, const float* a, int lda, const float* b, int ldb,
                   bool accumulate, float* c, int ldc) {
    if (!few_rows_gemm_fits(ta, tb, m, n, k)) return false;
#if defined(__x86_64__)
    if (tb) dot_products(m, n, k, a, lda, b, ldb, accumulate, c, ldc);
    else if (ta) axpy_products(m, n, k, a, 1, size_t(lda), b, ldb, accumulate, c, ldc);
    else axpy_products(m, n, k, a, size_t(lda), 1, b, ldb, accumulate, c, ldc);
    return true;
#else
    return false;
#endif
}

}  // namespace mirrored
