#include "kernels/cpu/act_loops.h"

#include <algorithm>
#include <type_traits>

#include "kernels/cpu/loop_clones.h"
#include "kernels/op_math.h"

namespace mirrored::cpu {

namespace {

template <Activation A>
using ActC = std::integral_constant<Activation, A>;

// fn(activation, storage type) with both compile-time constants (with_storage_type, loop_clones.h).
template <typename Fn>
[[gnu::always_inline]] inline void with_act_and_type(Activation a, DType t, Fn&& fn) {
    auto with_type = [&](auto act) __attribute__((always_inline)) {
        with_storage_type(
            t, [&](auto type) __attribute__((always_inline)) { fn(act, type); });
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

CPU_LOOP_CLONES void column_sums(int rows, int cols, const float* __restrict dz, float* __restrict s) {
    std::fill(s, s + cols, 0.0f);
    for (int i = 0; i < rows; ++i) {
        const float* __restrict row = dz + size_t(i) * cols;
        for (int j = 0; j < cols; ++j) s[j] += row[j];
    }
}

}  // namespace mirrored::cpu
