// Optimizers as single fused updates over the flat parameter buffer, and the learning-rate
// schedule. Each replica owns its optimizer state; every replica applies the same update to the
// same (all-reduced) gradients, so replicas stay identical.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/buffer.h"
#include "kernels/device.h"

namespace mirrored {

struct ScheduleConfig {
    enum class Type { constant, step, multistep, cosine };
    Type type = Type::constant;
    int64_t warmup_steps = 0;  // linear from lr/warmup to lr
    int64_t step_size = 1000;  // step: multiply by gamma every step_size steps
    std::vector<int64_t> milestones;  // multistep: multiply by gamma at each of these steps
    double gamma = 0.1;
    double min_lr_ratio = 0.0;  // cosine: final lr = lr * min_lr_ratio
    bool operator==(const ScheduleConfig&) const = default;
};

struct OptimizerConfig {
    enum class Type { sgd, adamw };
    Type type = Type::sgd;
    double lr = 0.05;
    double momentum = 0.9;
    bool nesterov = false;
    double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
    double weight_decay = 0.0;
    double grad_clip_norm = 0.0;  // 0: off
    bool scale_lr_with_replicas = false;
    ScheduleConfig schedule;
    bool operator==(const OptimizerConfig&) const = default;
};

// Learning rate for optimizer step `step` (0-based) of `total_steps`.
double learning_rate(const OptimizerConfig& c, int64_t step, int64_t total_steps, int replicas);

class Optimizer {
public:
    Optimizer(Device& dev, const OptimizerConfig& cfg, size_t n);
    // params -= update(grads) over the n trainable values; step is 0-based. grad_stats (device,
    // Device::sum_squares' output) is needed when clipping or skipping; loss_scale (device) divides
    // the gradients; skip_nonfinite leaves everything unchanged when a gradient overflowed.
    // values (device, may be null): lr and the bias corrections are read from there instead of
    // step and lr (a replayed graph), with the same bits when they hold step_values(step, lr).
    void apply(Stream s, float* params, const float* grads, int64_t step, float lr, const float* grad_stats,
               const float* loss_scale, bool skip_nonfinite, const StepValues* values = nullptr) {
        apply_range(dev_, s, params, grads, 0, n_, step, lr, grad_stats, loss_scale, skip_nonfinite, values);
    }
    // The same over [begin, end) only, issued on `on` (a device that can reach this optimizer's
    // memory): replicas that share one parameter copy each update their slice, concurrently.
    // params and grads point at element 0.
    void apply_range(Device& on, Stream s, float* params, const float* grads, size_t begin, size_t end, int64_t step,
                     float lr, const float* grad_stats, const float* loss_scale, bool skip_nonfinite,
                     const StepValues* values = nullptr);
    // The same over [begin, end) with the gradients of the replicas sharing this parameter copy
    // summed as Device::sum_into sums them (grads[into]'s first), inside the update's own pass
    // (Device::summed_sgd_update): what clipping or loss scaling would need, the norm of the sum
    // before the update, is not there, so neither may be on. grads point at element 0.
    void apply_summed_range(Device& on, Stream s, float* params, float* const* grads, int count, int into,
                            size_t begin, size_t end, int64_t step, float lr, const StepValues* values = nullptr);
    // The values of 0-based step `step` at learning rate lr, as the update computes them.
    StepValues step_values(int64_t step, float lr) const;
    // Named state buffers (same layout as the parameters), for checkpoints.
    std::vector<std::pair<std::string, DeviceBuffer<float>*>> state();
    const OptimizerConfig& config() const { return cfg_; }

private:
    SgdArgs sgd_args(float lr, const float* grad_stats, const float* loss_scale, bool skip_nonfinite,
                     const StepValues* values) const;
    AdamWArgs adamw_args(int64_t step, float lr, const float* grad_stats, const float* loss_scale,
                         bool skip_nonfinite, const StepValues* values) const;
    void check_range(size_t begin, size_t end) const;

    Device& dev_;
    OptimizerConfig cfg_;
    size_t n_;
    DeviceBuffer<float> m_, v_;
};

}  // namespace mirrored
