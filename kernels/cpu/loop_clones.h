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
#include <type_traits>

#include "kernels/device.h"

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

}  // namespace mirrored::cpu
