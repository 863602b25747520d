#include "mirrored/optimizer.h"

#include <algorithm>
#include <cmath>

#include "base/error.h"
#include "kernels/op_math.h"

namespace mirrored {

double learning_rate(const OptimizerConfig& c, int64_t step, int64_t total_steps, int replicas) {
    double base = c.lr * (c.scale_lr_with_replicas ? replicas : 1);
    const ScheduleConfig& s = c.schedule;
    if (s.warmup_steps > 0 && step < s.warmup_steps) return base * double(step + 1) / double(s.warmup_steps);
    switch (s.type) {
    case ScheduleConfig::Type::step:
        return base * std::pow(s.gamma, double((step - s.warmup_steps) / std::max<int64_t>(s.step_size, 1)));
    case ScheduleConfig::Type::multistep: {
        double lr = base;
        for (int64_t m : s.milestones)
            if (step >= m) lr *= s.gamma;
        return lr;
    }
    case ScheduleConfig::Type::cosine: {
        const double span = double(std::max<int64_t>(total_steps - s.warmup_steps, 1));
        const double t = std::clamp(double(step - s.warmup_steps) / span, 0.0, 1.0);
        const double floor = base * s.min_lr_ratio;
        return floor + (base - floor) * 0.5 * (1.0 + std::cos(M_PI * t));
    }
    default: return base;
    }
}

Optimizer::Optimizer(Device& dev, const OptimizerConfig& cfg, size_t n) : dev_(dev), cfg_(cfg), n_(n) {
    if (cfg_.type == OptimizerConfig::Type::adamw || cfg_.momentum != 0.0) {
        m_ = DeviceBuffer<float>(dev, n);
        dev.fill(dev.compute_stream(), n, 0.0f, m_.data());
    }
    if (cfg_.type == OptimizerConfig::Type::adamw) {
        v_ = DeviceBuffer<float>(dev, n);
        dev.fill(dev.compute_stream(), n, 0.0f, v_.data());
    }
}

namespace {

// The fields SgdArgs and AdamWArgs share: clipping, loss scaling, overflow skipping and the
// step's device-side values.
template <typename Args>
Args with_step_inputs(Args a, const OptimizerConfig& cfg, const float* grad_stats, const float* loss_scale,
                      bool skip_nonfinite, const StepValues* values) {
    a.clip_norm = float(cfg.grad_clip_norm);
    a.grad_stats = grad_stats;
    a.loss_scale = loss_scale;
    a.skip_nonfinite = skip_nonfinite;
    a.values = values;
    return a;
}

}  // namespace

SgdArgs Optimizer::sgd_args(float lr, const float* grad_stats, const float* loss_scale, bool skip_nonfinite,
                            const StepValues* values) const {
    SgdArgs a;
    a.lr = lr;
    a.momentum = float(cfg_.momentum);
    a.nesterov = cfg_.nesterov;
    a.weight_decay = float(cfg_.weight_decay);
    return with_step_inputs(a, cfg_, grad_stats, loss_scale, skip_nonfinite, values);
}

AdamWArgs Optimizer::adamw_args(int64_t step, float lr, const float* grad_stats, const float* loss_scale,
                                bool skip_nonfinite, const StepValues* values) const {
    AdamWArgs a;
    a.lr = lr;
    a.beta1 = float(cfg_.beta1);
    a.beta2 = float(cfg_.beta2);
    a.eps = float(cfg_.eps);
    a.weight_decay = float(cfg_.weight_decay);
    a.step = step + 1;
    return with_step_inputs(a, cfg_, grad_stats, loss_scale, skip_nonfinite, values);
}

void Optimizer::check_range(size_t begin, size_t end) const {
    if (end > n_ || begin > end) throw Error(kExitFailure, "optimizer: range past the parameters");
}

void Optimizer::apply_range(Device& on, Stream s, float* params, const float* grads, size_t begin, size_t end,
                            int64_t step, float lr, const float* grad_stats, const float* loss_scale, bool skip_nonfinite,
                            const StepValues* values) {
    check_range(begin, end);
    const size_t n = end - begin;
    if (cfg_.type == OptimizerConfig::Type::adamw)
        on.adamw_update(s, n, params + begin, grads + begin, m_.data() + begin, v_.data() + begin,
                        adamw_args(step, lr, grad_stats, loss_scale, skip_nonfinite, values));
    else
        on.sgd_update(s, n, params + begin, grads + begin, m_.size() ? m_.data() + begin : nullptr,
                      sgd_args(lr, grad_stats, loss_scale, skip_nonfinite, values));
}

void Optimizer::apply_summed_range(Device& on, Stream s, float* params, float* const* grads, int count, int into,
                                   size_t begin, size_t end, int64_t step, float lr, const StepValues* values) {
    check_range(begin, end);
    const size_t n = end - begin;
    if (cfg_.type == OptimizerConfig::Type::adamw)
        on.summed_adamw_update(s, grads, count, into, begin, n, params + begin, m_.data() + begin, v_.data() + begin,
                               adamw_args(step, lr, nullptr, nullptr, false, values));
    else
        on.summed_sgd_update(s, grads, count, into, begin, n, params + begin, m_.size() ? m_.data() + begin : nullptr,
                             sgd_args(lr, nullptr, nullptr, false, values));
}

StepValues Optimizer::step_values(int64_t step, float lr) const {
    StepValues v;
    v.lr = lr;
    v.step = uint32_t(step);
    if (cfg_.type == OptimizerConfig::Type::adamw) {
        const AdamWCorrections c = adamw_corrections(adamw_args(step, lr, nullptr, nullptr, false, nullptr));
        v.adamw_bc1 = c.bc1;
        v.adamw_bc2_sqrt = c.bc2_sqrt;
    }
    return v;
}

std::vector<std::pair<std::string, DeviceBuffer<float>*>> Optimizer::state() {
    std::vector<std::pair<std::string, DeviceBuffer<float>*>> out;
    if (cfg_.type == OptimizerConfig::Type::adamw) {
        out.emplace_back("exp_avg", &m_);
        out.emplace_back("exp_avg_sq", &v_);
    } else if (m_.size()) {
        out.emplace_back("momentum_buffer", &m_);
    }
    return out;
}

}  // namespace mirrored
