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

#include <type_traits>

#include "kernels/device.h"

namespace mirrored::cpu {

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
