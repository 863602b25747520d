#include "kernels/cpu/row_loops.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/cpu/loop_clones.h"
#include "kernels/op_math.h"

namespace mirrored::cpu {

CPU_LOOP_CLONES float softmax_xent_row(DType dt, int classes, int y, float gs, const float* __restrict z,
                                       float* __restrict d, int* argmax) {
    float loss = 0.0f;
    with_storage_type(
        dt, [&](auto T) __attribute__((always_inline)) {
            const float mx = row_max(classes, z);
            int arg = 0;  // the first index of the largest, as a running argmax finds it
            while (arg < classes && !(z[arg] == mx)) ++arg;
            *argmax = arg < classes ? arg : 0;  // NaN logits: no index equals the maximum
            float sum = 0.0f;                   // >= 1: the maximum's own term is 1
            if (d) {
                for (int j = 0; j < classes; ++j) d[j] = exp_poly(z[j] - mx);
                sum = row_sum(classes, d);
            } else {
                f32x8 acc = {};
                over_lanes(
                    classes,
                    [&](int j) __attribute__((always_inline)) {
                        for (int l = 0; l < kLanes; ++l) acc[l] += exp_poly(z[j + l] - mx);
                    },
                    [&](int l, int j) __attribute__((always_inline)) { acc[l] += exp_poly(z[j] - mx); });
                sum = lanes_sum(acc);
            }
            // cppcheck-suppress invalidFunctionArg
            loss = std::log(sum) + mx - z[y];
            if (!d) return;
            const float inv = 1.0f / sum, e_y = d[y];
            for (int j = 0; j < classes; ++j) d[j] = round_to(T, d[j] * inv * gs);
            d[y] = round_to(T, (e_y * inv - 1.0f) * gs);
        });
    return loss;
}

}  // namespace mirrored::cpu
