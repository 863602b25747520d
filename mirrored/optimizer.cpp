#include "mirrored/optimizer.h"

#include <algorithm>
#include <cmath>

#include "base/error.h"
#include "kernels/ops/flat.h"

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
        default:
            return base;
    }
}

Optimizer::Optimizer(Device& dev, const OptimizerConfig& cfg, size_t n, const OwnedRanges& owned)
    : dev_(dev), cfg_(cfg), n_(n) {
    for (const auto& [b, e] : owned) {
        if (b > e || e > n || (!owned_.empty() && b < owned_.back().end))
            throw Error(kExitFailure, "optimizer: owned ranges unsorted, overlapping or past the parameters");
        if (b == e) continue;
        owned_.push_back({b, e, state_size_});
        state_size_ += e - b;
    }
}

const Optimizer::Owned& Optimizer::owner(size_t begin) const {
    auto it =
        std::upper_bound(owned_.begin(), owned_.end(), begin, [](size_t x, const Owned& o) { return x < o.begin; });
    if (it == owned_.begin()) throw Error(kExitFailure, "optimizer: parameter outside the owned ranges");
    return *std::prev(it);
}

void Optimizer::check_range(size_t begin, size_t end) const {
    if (end > n_ || begin > end) throw Error(kExitFailure, "optimizer: range past the parameters");
    if (begin < end && end > owner(begin).end)
        throw Error(kExitFailure, "optimizer: range beyond this replica's owned parameters");
}

void Optimizer::decay_only(std::vector<std::pair<size_t, size_t>> ranges) {
    for (size_t i = 0; i < ranges.size(); ++i)
        if (ranges[i].first > ranges[i].second || ranges[i].second > n_ ||
            (i && ranges[i].first < ranges[i - 1].second))
            throw Error(kExitFailure, "optimizer: weight-decay ranges unsorted, overlapping or past the parameters");
    decayed_ = std::move(ranges);
    decay_all_ = false;
}

template <typename Fn>
void Optimizer::for_each_piece(size_t begin, size_t end, Fn&& fn) const {
    check_range(begin, end);
    const float wd = float(cfg_.weight_decay);
    if (decay_all_ || wd == 0.0f) return fn(begin, end, wd);
    size_t at = begin;
    for (const auto& [b, e] : decayed_) {
        if (e <= at) continue;
        if (b >= end) break;
        if (b > at) fn(at, b, 0.0f);
        const size_t stop = std::min(e, end);
        fn(std::max(b, at), stop, wd);
        at = stop;
    }
    if (at < end) fn(at, end, 0.0f);
}

void Optimizer::apply_range(Device& on, Stream s, float* params, const float* grads, size_t begin, size_t end,
                            int64_t step, float lr, const float* grad_stats, const float* loss_scale,
                            bool skip_nonfinite, const StepValues* values) {
    for_each_piece(begin, end, [&](size_t b, size_t e, float wd) {
        update_range(on, s, params, grads + (b - begin), b, e, step, lr, wd, grad_stats, loss_scale, skip_nonfinite,
                     values);
    });
}

void Optimizer::apply_summed_range(Device& on, Stream s, float* params, float* const* grads, int count, int into,
                                   size_t begin, size_t end, int64_t step, float lr, const StepValues* values) {
    for_each_piece(begin, end, [&](size_t b, size_t e, float wd) {
        update_summed_range(on, s, params, grads, count, into, b, e, step, lr, wd, values);
    });
}

DeviceBuffer<float> Optimizer::zeroed_state() const {
    DeviceBuffer<float> b(dev_, state_size_);
    fill_floats(dev_, dev_.compute_stream(), state_size_, 0.0f, b.data());
    return b;
}

extern const OptimizerKind kSgdKind, kAdamWKind;

const Registry<OptimizerKind>& optimizer_kinds() {
    static const Registry<OptimizerKind> kinds("optimizer", {&kSgdKind, &kAdamWKind});
    return kinds;
}

OptionsPtr optimizer_options(const OptimizerConfig& cfg) {
    if (cfg.options) return cfg.options;
    FieldsReader none("optimizer", {});
    return optimizer_kinds().get(cfg.type, "optimizer.type").read(none, "optimizer");
}

std::unique_ptr<Optimizer> make_optimizer(Device& dev, const OptimizerConfig& cfg, size_t n, const OwnedRanges& owned) {
    OptimizerConfig c = cfg;
    c.options = optimizer_options(cfg);
    return optimizer_kinds().get(cfg.type, "optimizer.type").create(dev, c, n, owned);
}

std::unique_ptr<Optimizer> make_optimizer(Device& dev, const OptimizerConfig& cfg, size_t n) {
    return make_optimizer(dev, cfg, n, {{0, n}});
}

int optimizer_state_buffers(const OptimizerConfig& cfg) {
    return optimizer_kinds().get(cfg.type, "optimizer.type").state_buffers(*optimizer_options(cfg));
}

std::string optimizer_description(const OptimizerConfig& cfg) {
    return optimizer_kinds().get(cfg.type, "optimizer.type").describe(*optimizer_options(cfg));
}

OptimizerConfig make_optimizer_config(const std::string& type, const Fields& keys) {
    const OptimizerKind& kind = optimizer_kinds().get(type);
    FieldsReader r("optimizer", keys);
    OptimizerConfig c;
    c.type = type;
    c.lr = kind.default_lr;
    c.options = kind.read(r, "optimizer");
    r.finish();
    return c;
}

}  // namespace mirrored
