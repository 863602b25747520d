// CPU_LOOP_CLONES: a function built for AVX-512, AVX2 and the baseline, the variant picked once at
// load time for the CPU it lands on - wider vectors, the same numbers (element-wise, no FMA
// contraction: kernels/cpu is built with -ffp-contract=off, see the Makefile). Off under the
// sanitizers, whose run-time starts after the ifunc resolvers that pick a clone.
#pragma once

#if defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define CPU_LOOP_SANITIZED 1
#endif
#endif
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__SANITIZE_THREAD__) && !defined(__SANITIZE_ADDRESS__) && \
    !defined(CPU_LOOP_SANITIZED)
#define CPU_LOOP_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define CPU_LOOP_CLONES
#endif

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/device.h"

namespace mirrored {

// A buffer of f32 values handed to a CPU loop as void* (activations: f32 on CPU replicas).
inline const float* as_floats(const void* p) { return static_cast<const float*>(p); }
inline float* as_floats(void* p) { return static_cast<float*>(p); }

}  // namespace mirrored

namespace mirrored::cpu {

// Eight lanes as one GCC vector: element-wise arithmetic that each clone keeps in its widest
// registers (eight floats: one AVX-512 or AVX register, two SSE ones; eight doubles twice as
// many in the narrower clones), so that a sum in eight lanes vectorises
// where GCC would not turn a loop over an array of eight into one - and gives the same bits in
// every clone. Kept inside the clones (always-inlined helpers): as arguments between functions
// built for different widths they would change the calling convention.
using f32x8 = float __attribute__((vector_size(32)));
using i32x8 = int32_t __attribute__((vector_size(32)));
using f64x8 = double __attribute__((vector_size(64)));

// Eight lanes' sum in one fixed tree, ((0 + 4) + (2 + 6)) + ((1 + 5) + (3 + 7)), for every lane
// type: the same bits in every clone and on every CPU.
template <typename Lanes>
[[gnu::always_inline]] inline auto lanes_sum(const Lanes& v) {
    return ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]));
}

template <DType T>
using TypeC = std::integral_constant<DType, T>;

// fn(storage type) with the type a compile-time constant, so that the element loops have no
// branch on it and vectorise. Inlined whole, with fn, into the CPU_LOOP_CLONES function that
// calls it, so that each clone's loops are built for its vector width.
template <typename Fn>
[[gnu::always_inline]] inline void with_storage_type(DType t, Fn&& fn) {
    if (t == DType::bf16) fn(TypeC<DType::bf16>{});
    else if (t == DType::f16) fn(TypeC<DType::f16>{});
    else fn(TypeC<DType::f32>{});
}

// ---- sums over a row in eight lanes (lane l takes elements l, l + 8, ...; the lanes then added
// by lanes_sum): a fixed order, so they vectorise and give the same bits on every run and CPU.
constexpr int kLanes = 8;

// Eight lanes over [0, n): element j in lane j % 8. vec(j) for each whole group of eight from j,
// then one(l, j) for the tail's element j in lane l; the lanes are the callers' GCC vectors
// (loop_clones.h): loops over an array of eight lanes do not vectorise.
template <typename Vec, typename One>
[[gnu::always_inline]] inline void over_lanes(int n, Vec&& vec, One&& one) {
    int j = 0;
    for (; j + kLanes <= n; j += kLanes) vec(j);
    for (int l = 0; j < n; ++j, ++l) one(l, j);
}

// x[j, j + 8) into v.
[[gnu::always_inline]] inline void load8(f32x8& v, const float* x) { std::memcpy(&v, x, sizeof v); }

// The sum over x[0, n) of term(x[j]) in eight lanes: term maps a vector of eight values, or the
// tail's one, in place (a generic lambda, the same arithmetic for both).
template <typename Term>
[[gnu::always_inline]] inline float row_sum_of(int n, const float* __restrict x, Term&& term) {
    f32x8 acc = {};
    over_lanes(
        n,
        [&](int j) __attribute__((always_inline)) {
            f32x8 v;
            load8(v, x + j);
            term(v);
            acc += v;
        },
        [&](int l, int j) __attribute__((always_inline)) {
            float v = x[j];
            term(v);
            acc[l] += v;
        });
    return lanes_sum(acc);
}

[[gnu::always_inline]] inline float row_sum(int n, const float* __restrict x) {
    return row_sum_of(n, x, [](auto&) {});
}

// The sum of (x - shift)^2 over x[0, n).
[[gnu::always_inline]] inline float row_squares_about(int n, const float* __restrict x, float shift) {
    return row_sum_of(
        n, x, [&](auto& v) __attribute__((always_inline)) {
            v -= shift;
            v = v * v;
        });
}

// The sum of x y over [0, n) in eight lanes.
[[gnu::always_inline]] inline float row_dot(int n, const float* __restrict x, const float* __restrict y) {
    f32x8 acc = {};
    over_lanes(
        n,
        [&](int j) __attribute__((always_inline)) {
            f32x8 u, v;
            load8(u, x + j);
            load8(v, y + j);
            acc += u * v;
        },
        [&](int l, int j) __attribute__((always_inline)) { acc[l] += x[j] * y[j]; });
    return lanes_sum(acc);
}

// The largest of x[0, n), n >= 1, in eight lanes (a NaN is kept only where x[0] is one).
[[gnu::always_inline]] inline float row_max(int n, const float* __restrict x) {
    f32x8 m = {};
    m += x[0];
    over_lanes(
        n,
        [&](int j) __attribute__((always_inline)) {
            f32x8 v;
            load8(v, x + j);
            m = m < v ? v : m;
        },
        [&](int l, int j) __attribute__((always_inline)) { m[l] = m[l] < x[j] ? x[j] : m[l]; });
    float mx = m[0];
    for (int l = 1; l < kLanes; ++l) mx = mx < m[l] ? m[l] : mx;
    return mx;
}

}  // namespace mirrored::cpu
