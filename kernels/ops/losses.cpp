#include "kernels/ops/losses.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/cpu/loop_clones.h"
#include "kernels/op_math.h"

namespace mirrored {

LossKernels loss_cuda;

namespace cpu {

// One row of softmax cross-entropy against class y: returns log(sum exp(z - max)) + max - z[y];
// *argmax = the first index of the largest logit; d (skipped when null; apart from z) =
// (softmax(z) - onehot(y)) gs. Sums in eight lanes (loop_clones.h).
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

}  // namespace cpu

void softmax_xent(Device& d, Stream s, int rows, int classes, const void* logits, const int32_t* labels,
                  float grad_scale, const float* loss_scale, void* dlogits, double* metrics) {
    if (d.runs_cuda_kernels())
        return launch_cuda(d, s, loss_cuda.softmax_xent, "softmax_xent", rows, classes, logits, labels, grad_scale,
                           loss_scale, dlogits, metrics);
    run_on_host(d, s, "softmax_xent", [=](const Device& h) {
        const DType t = h.value_dtype();
        const float gs = grad_scale * (loss_scale ? *loss_scale : 1.0f);
        double loss_sum = 0.0, correct = 0.0;
        for (int i = 0; i < rows; ++i) {
            const int y = labels[i];
            int arg = 0;
            float* d = dlogits ? as_floats(dlogits) + size_t(i) * classes : nullptr;
            loss_sum +=
                double(cpu::softmax_xent_row(t, classes, y, gs, as_floats(logits) + size_t(i) * classes, d, &arg));
            correct += arg == y ? 1.0 : 0.0;
        }
        metrics[kMetricLossSum] += loss_sum;
        metrics[kMetricCorrect] += correct;
        metrics[kMetricCount] += double(rows);
    });
}

void target_loss(Device& d, Stream s, TargetLoss kind, int rows, int n, const void* logits, const float* targets,
                 float grad_scale, const float* loss_scale, void* dlogits, double* metrics) {
    if (d.runs_cuda_kernels())
        return launch_cuda(d, s, loss_cuda.target_loss, "target_loss", kind, rows, n, logits, targets, grad_scale,
                           loss_scale, dlogits, metrics);
    run_on_host(d, s, "target_loss", [=](const Device& h) {
        const DType t = h.value_dtype();
        const float gs = grad_scale * (loss_scale ? *loss_scale : 1.0f) / float(n);
        double loss_sum = 0.0, correct = 0.0;
        for (int i = 0; i < rows; ++i) {
            const float* z = as_floats(logits) + size_t(i) * n;
            const float* y = targets + size_t(i) * n;
            float* d = dlogits ? as_floats(dlogits) + size_t(i) * n : nullptr;
            float row_loss = 0.0f, row_correct = 0.0f;
            for (int j = 0; j < n; ++j) {
                const TargetLossTerm e = target_loss_term(kind, z[j], y[j]);
                row_loss += e.loss;
                row_correct += e.correct ? 1.0f : 0.0f;
                if (d) d[j] = round_to(t, e.grad * gs);
            }
            loss_sum += double(row_loss / float(n));
            correct += double(row_correct / float(n));
        }
        metrics[kMetricLossSum] += loss_sum;
        metrics[kMetricCorrect] += correct;
        metrics[kMetricCount] += double(rows);
    });
}

}  // namespace mirrored
