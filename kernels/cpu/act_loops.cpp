#include "kernels/cpu/act_loops.h"

#include <type_traits>

#include "kernels/cpu/loop_clones.h"
#include "kernels/op_math.h"

namespace mirrored::cpu {

namespace {

template <Activation A>
using ActC = std::integral_constant<Activation, A>;
template <DType T>
using TypeC = std::integral_constant<DType, T>;

// Calls fn(activation, storage type) with both as compile-time constants, so that the element
// loops have no branch on either and vectorise. Inlined whole, with fn, into the CPU_LOOP_CLONES
// functions below, so that each clone's loops are built for its vector width.
template <typename Fn>
[[gnu::always_inline]] inline void with_act_and_type(Activation a, DType t, Fn&& fn) {
    auto with_type = [&](auto act) __attribute__((always_inline)) {
        if (t == DType::bf16) fn(act, TypeC<DType::bf16>{});
        else if (t == DType::f16) fn(act, TypeC<DType::f16>{});
        else fn(act, TypeC<DType::f32>{});
    };
    if (a == Activation::relu) with_type(ActC<Activation::relu>{});
    else if (a == Activation::gelu) with_type(ActC<Activation::gelu>{});
    else if (a == Activation::gelu_tanh) with_type(ActC<Activation::gelu_tanh>{});
    else with_type(ActC<Activation::none>{});
}

}  // namespace

CPU_LOOP_CLONES void bias_act_in_place(Activation act, DType t, int cols, const float* __restrict bias,
                                       float* __restrict z) {
    with_act_and_type(
        act, t, [&](auto A, auto T) __attribute__((always_inline)) {
            if (bias)
                for (int j = 0; j < cols; ++j) z[j] = round_to(T, act_forward(A, round_to(T, z[j] + bias[j])));
            else
                for (int j = 0; j < cols; ++j) z[j] = round_to(T, act_forward(A, round_to(T, z[j])));
        });
}

CPU_LOOP_CLONES void bias_act_apart(Activation act, DType t, int cols, const float* __restrict bias,
                                    float* __restrict z, float* __restrict out) {
    with_act_and_type(
        act, t, [&](auto A, auto T) __attribute__((always_inline)) {
            if (bias)
                for (int j = 0; j < cols; ++j) z[j] = round_to(T, z[j] + bias[j]);
            else if (T != DType::f32)
                for (int j = 0; j < cols; ++j) z[j] = round_to(T, z[j]);
            for (int j = 0; j < cols; ++j) out[j] = round_to(T, act_forward(A, z[j]));
        });
}

CPU_LOOP_CLONES void act_backward_in_place(Activation act, DType t, size_t n, const float* __restrict z,
                                           float* __restrict d) {
    with_act_and_type(
        act, t, [&](auto A, auto T) __attribute__((always_inline)) {
            for (size_t i = 0; i < n; ++i) d[i] = round_to(T, act_backward_value(A, z[i], d[i]));
        });
}

CPU_LOOP_CLONES void act_backward_apart(Activation act, DType t, size_t n, const float* __restrict z,
                                        const float* __restrict d, float* __restrict out) {
    with_act_and_type(
        act, t, [&](auto A, auto T) __attribute__((always_inline)) {
            for (size_t i = 0; i < n; ++i) out[i] = round_to(T, act_backward_value(A, z[i], d[i]));
        });
}

}  // namespace mirrored::cpu
