#include "kernels/ops/dropout.h"

#include <immintrin.h>

#include <algorithm>

#include "kernels/cpu/loop_clones.h"
#include "kernels/op_math.h"

namespace mirrored {

DropoutKernels dropout_cuda;

namespace {

// Philox draws for kDropoutCounters consecutive counters at once, then each row's elements, 4
// per counter, kept or zeroed in one vector loop. With AVX2 the draws are 8 counters to a vector:
// the integer arithmetic of philox4x32, so the same bits (compilers leave the scalar rounds'
// 32 x 32 -> 64-bit products unvectorised).
constexpr int kDropoutCounters = 16, kDropoutBlock = 4 * kDropoutCounters;

// hi and lo words of M x a in each of 8 lanes (_mm256_mul_epu32 multiplies the even lanes).
__attribute__((target("avx2"))) inline void mul_hi_lo(__m256i a, __m256i m, __m256i& hi, __m256i& lo) {
    const __m256i even = _mm256_mul_epu32(a, m), odd = _mm256_mul_epu32(_mm256_srli_epi64(a, 32), m);
    hi = _mm256_blend_epi32(_mm256_srli_epi64(even, 32), odd, 0xAA);
    lo = _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xAA);
}

__attribute__((target("avx2"))) void philox_block_avx2(uint64_t seed, uint64_t counter, uint32_t stream_a,
                                                       uint32_t stream_b, uint32_t* __restrict u) {
    alignas(32) uint32_t lo[kDropoutCounters], hi[kDropoutCounters], out[4][kDropoutCounters];
    for (int i = 0; i < kDropoutCounters; ++i) {
        lo[i] = uint32_t(counter + uint64_t(i));
        hi[i] = uint32_t((counter + uint64_t(i)) >> 32);
    }
    const __m256i m0 = _mm256_set1_epi32(int(kPhiloxM0)), m1 = _mm256_set1_epi32(int(kPhiloxM1));
    for (int g = 0; g < kDropoutCounters; g += 8) {
        __m256i c0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(lo + g));
        __m256i c1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(hi + g));
        __m256i c2 = _mm256_set1_epi32(int(stream_a)), c3 = _mm256_set1_epi32(int(stream_b));
        uint32_t k0 = uint32_t(seed), k1 = uint32_t(seed >> 32);
        for (int round = 0; round < kPhiloxRounds; ++round) {
            if (round > 0) {
                k0 += kPhiloxW0;
                k1 += kPhiloxW1;
            }
            __m256i hi0, lo0, hi1, lo1;
            mul_hi_lo(c0, m0, hi0, lo0);
            mul_hi_lo(c2, m1, hi1, lo1);
            c0 = _mm256_xor_si256(_mm256_xor_si256(hi1, c1), _mm256_set1_epi32(int(k0)));
            c1 = lo1;
            c2 = _mm256_xor_si256(_mm256_xor_si256(hi0, c3), _mm256_set1_epi32(int(k1)));
            c3 = lo0;
        }
        _mm256_store_si256(reinterpret_cast<__m256i*>(out[0] + g), c0);
        _mm256_store_si256(reinterpret_cast<__m256i*>(out[1] + g), c1);
        _mm256_store_si256(reinterpret_cast<__m256i*>(out[2] + g), c2);
        _mm256_store_si256(reinterpret_cast<__m256i*>(out[3] + g), c3);
    }
    for (int i = 0; i < kDropoutCounters; ++i)
        for (int w = 0; w < 4; ++w) u[4 * i + w] = out[w][i];
}

// u[4 i + w] = word w of Philox(seed, counter + i, stream_a, stream_b): element 4 (counter + i) + w.
void philox_block(uint64_t seed, uint64_t counter, uint32_t stream_a, uint32_t stream_b, uint32_t* __restrict u) {
    static const bool avx2 = __builtin_cpu_supports("avx2");
    if (avx2) return philox_block_avx2(seed, counter, stream_a, stream_b, u);
    for (int i = 0; i < kDropoutCounters; ++i) {
        const Philox4 r = philox(seed, counter + uint64_t(i), stream_a, stream_b);
        for (int w = 0; w < 4; ++w) u[4 * i + w] = r.v[w];
    }
}

// y[j] = x[j] * scale where element `first + j`'s draw keeps it (dropout_keep), else 0.
CPU_LOOP_CLONES void dropout_row_loop(uint64_t seed, uint32_t stream_a, uint32_t step, uint64_t first, int cols,
                                      float rate, float scale, const float* __restrict x, float* __restrict y) {
    alignas(64) uint32_t u[kDropoutBlock];
    const uint64_t end = first + uint64_t(cols);
    for (uint64_t counter = first / 4; counter * 4 < end; counter += kDropoutCounters) {
        philox_block(seed, counter, stream_a, step, u);
        const uint64_t lo = std::max(counter * 4, first), hi = std::min(counter * 4 + kDropoutBlock, end);
        const uint32_t* __restrict d = u + (lo - counter * 4);
        const float* __restrict xs = x + (lo - first);
        float* __restrict ys = y + (lo - first);
        const int n = int(hi - lo);
        for (int j = 0; j < n; ++j) ys[j] = uniform01(d[j]) >= rate ? xs[j] * scale : 0.0f;
    }
}

// A row done in place goes through a copy on the stack, this many elements at a time, so that
// the loop's operands never alias (each element's draw depends only on its index: the same masks).
constexpr int kInPlaceChunk = 1024;

// dropout_keep's decisions, drawn 64 elements at a time (dropout_row_loop); in place too.
void dropout_rows(DType t, const DropoutArgs& a, int rows, int cols, const float* x, float* y) {
    const float keep_scale = 1.0f / (1.0f - a.rate);
    const uint32_t step = dropout_step(a), stream = kStreamDropout | (a.layer_id << 8);
    for (int i = 0; i < rows; ++i) {
        const float* xr = x + size_t(i) * cols;
        float* yr = y + size_t(i) * cols;
        const uint64_t first = uint64_t(a.row_offset + i) * uint64_t(cols);
        if (xr != yr) {
            dropout_row_loop(a.seed, stream, step, first, cols, a.rate, keep_scale, xr, yr);
        } else {
            alignas(64) float copy[kInPlaceChunk];
            for (int j = 0; j < cols; j += kInPlaceChunk) {
                const int n = std::min(kInPlaceChunk, cols - j);
                std::copy_n(xr + j, n, copy);
                dropout_row_loop(a.seed, stream, step, first + uint64_t(j), n, a.rate, keep_scale, copy, yr + j);
            }
        }
        if (t != DType::f32)
            for (int j = 0; j < cols; ++j) yr[j] = round_to(t, yr[j]);
    }
}

void apply(Device& d, Stream s, const char* op, const DropoutArgs& a, int rows, int cols, const void* x, void* y) {
    if (d.runs_cuda_kernels()) return launch_cuda(d, s, dropout_cuda.apply, op, a, rows, cols, x, y);
    run_on_host(d, s, op, [=](const Device& h) {
        dropout_rows(h.value_dtype(), a, rows, cols, static_cast<const float*>(x), static_cast<float*>(y));
    });
}

}  // namespace

void dropout_forward(Device& d, Stream s, const DropoutArgs& a, int rows, int cols, const void* x, void* y) {
    apply(d, s, "dropout_forward", a, rows, cols, x, y);
}

void dropout_backward(Device& d, Stream s, const DropoutArgs& a, int rows, int cols, const void* dy, void* dx) {
    apply(d, s, "dropout_backward", a, rows, cols, dy, dx);  // the same mask and scale
}

}  // namespace mirrored
