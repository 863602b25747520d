// Optimizers as single fused updates over the flat parameter buffer, and the learning-rate
// schedule. Each replica owns its optimizer state; every replica applies the same update to the
// same (all-reduced) gradients, so replicas stay identical.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/registry.h"
#include "base/spec_reader.h"
#include "mirrored/optimizer_config.h"
#include "kernels/buffer.h"
#include "kernels/device.h"

namespace mirrored {

// Learning rate for optimizer step `step` (0-based) of `total_steps`.
double learning_rate(const OptimizerConfig& c, int64_t step, int64_t total_steps, int replicas);

// The parameters an optimizer keeps state for: [0, n), or (strategy.shard) sorted, disjoint
// [begin, end) ranges only - perhaps none -, its state buffers holding them one after another.
using OwnedRanges = std::vector<std::pair<size_t, size_t>>;

// One update rule over the flat parameter buffer: its state buffers hold the owned parameters'.
class Optimizer {
public:
    Optimizer(Device& dev, const OptimizerConfig& cfg, size_t n, const OwnedRanges& owned);
    virtual ~Optimizer() = default;
    Optimizer(const Optimizer&) = delete;
    Optimizer& operator=(const Optimizer&) = delete;

    // params -= update(grads) over the n trainable values; step is 0-based. grad_stats (device,
    // Device::sum_squares' output) is needed when clipping or skipping; loss_scale (device) divides
    // the gradients; skip_nonfinite leaves everything unchanged when a gradient overflowed.
    // values (device, may be null): lr and the bias corrections are read from there instead of
    // step and lr (a replayed graph), with the same bits when they hold step_values(step, lr).
    void apply(Stream s, float* params, const float* grads, int64_t step, float lr, const float* grad_stats,
               const float* loss_scale, bool skip_nonfinite, const StepValues* values = nullptr) {
        apply_range(dev_, s, params, grads, 0, n_, step, lr, grad_stats, loss_scale, skip_nonfinite, values);
    }
    // The same over [begin, end) only (inside one owned range), issued on `on` (a device that can reach this optimizer's
    // memory): replicas that share one parameter copy each update their slice, concurrently.
    // params points at element 0, grads at element begin's gradient (gradients may be kept for
    // the owned ranges only: strategy.shard: gradients).
    void apply_range(Device& on, Stream s, float* params, const float* grads, size_t begin, size_t end, int64_t step,
                     float lr, const float* grad_stats, const float* loss_scale, bool skip_nonfinite,
                     const StepValues* values = nullptr);
    // The same over [begin, end) with the gradients of the replicas sharing this parameter copy
    // summed as sum_into (kernels/ops/peer_sums.h) sums them (grads[into]'s first), inside the update's own pass
    // (summed_sgd_update, kernels/ops/optimizer.h): what clipping or loss scaling would need, the norm of the sum
    // before the update, is not there, so neither may be on. grads point at element 0.
    void apply_summed_range(Device& on, Stream s, float* params, float* const* grads, int count, int into, size_t begin,
                            size_t end, int64_t step, float lr, const StepValues* values = nullptr);
    // Weight decay on these sorted, disjoint [begin, end) ranges only (the model's matrices);
    // unset, on every parameter. An update then runs once per piece of decayed or undecayed
    // parameters, each parameter still touched once.
    void decay_only(std::vector<std::pair<size_t, size_t>> ranges);
    // The values of 0-based step `step` at learning rate lr, as the update computes them.
    virtual StepValues step_values(int64_t step, float lr) const {
        StepValues v;
        v.lr = lr;
        v.step = uint32_t(step);
        return v;
    }
    // Named state buffers (the owned ranges' values one after another), for checkpoints.
    virtual std::vector<std::pair<std::string, DeviceBuffer<float>*>> state() = 0;
    const OptimizerConfig& config() const { return cfg_; }
    size_t size() const { return n_; }  // parameters
    // The owned ranges (one, [0, n), unless sharded) and where each starts in the state buffers.
    struct Owned {
        size_t begin, end, state_at;
    };
    const std::vector<Owned>& owned() const { return owned_; }
    size_t state_size() const { return state_size_; }

protected:
    // One update rule over [begin, end) with this weight decay (0 or optimizer.weight_decay);
    // grads points at element begin's gradient.
    virtual void update_range(Device& on, Stream s, float* params, const float* grads, size_t begin, size_t end,
                              int64_t step, float lr, float weight_decay, const float* grad_stats,
                              const float* loss_scale, bool skip_nonfinite, const StepValues* values) = 0;
    virtual void update_summed_range(Device& on, Stream s, float* params, float* const* grads, int count, int into,
                                     size_t begin, size_t end, int64_t step, float lr, float weight_decay,
                                     const StepValues* values) = 0;
    // The fields every update's arguments share: clipping, loss scaling, overflow skipping and
    // the step's device-side values.
    template <typename Args>
    Args with_step_inputs(Args a, const float* grad_stats, const float* loss_scale, bool skip_nonfinite,
                          const StepValues* values) const {
        a.clip_norm = float(cfg_.grad_clip_norm);
        a.grad_stats = grad_stats;
        a.loss_scale = loss_scale;
        a.skip_nonfinite = skip_nonfinite;
        a.values = values;
        return a;
    }
    void check_range(size_t begin, size_t end) const;
    // A zeroed state buffer of state_size() floats.
    DeviceBuffer<float> zeroed_state() const;
    // Where parameter `begin` (inside an owned range) keeps its state in buffer b.
    float* state_at(DeviceBuffer<float>& b, size_t begin) const {
        return b.data() + (begin - owner(begin).begin) + owner(begin).state_at;
    }

    Device& dev_;
    OptimizerConfig cfg_;
    size_t n_;

private:
    // Calls fn(begin, end, weight decay) for each piece of [begin, end) decayed alike, in order.
    template <typename Fn>
    void for_each_piece(size_t begin, size_t end, Fn&& fn) const;
    const Owned& owner(size_t begin) const;  // the owned range holding parameter `begin`
    std::vector<Owned> owned_;
    size_t state_size_ = 0;
    std::vector<std::pair<size_t, size_t>> decayed_;
    bool decay_all_ = true;
};

// An optimizer type: its name, its default learning rate, how its own keys are read, how many
// state buffers of the parameters' size it keeps (the memory plan), the short description the
// checkpoint's model hash covers, and how it is made.
struct OptimizerKind {
    const char* name;
    double default_lr;
    OptionsPtr (*read)(SpecReader& r, const std::string& path);
    int (*state_buffers)(const Options& o);
    std::string (*describe)(const Options& o);
    std::unique_ptr<Optimizer> (*create)(Device& dev, const OptimizerConfig& cfg, size_t n, const OwnedRanges& owned);
};
const Registry<OptimizerKind>& optimizer_kinds();  // optimizer.cpp lists every type
// cfg.options, or the type's defaults when there are none.
OptionsPtr optimizer_options(const OptimizerConfig& cfg);
std::unique_ptr<Optimizer> make_optimizer(Device& dev, const OptimizerConfig& cfg, size_t n);  // owns [0, n)
std::unique_ptr<Optimizer> make_optimizer(Device& dev, const OptimizerConfig& cfg, size_t n, const OwnedRanges& owned);
int optimizer_state_buffers(const OptimizerConfig& cfg);
std::string optimizer_description(const OptimizerConfig& cfg);  // "adamw", "sgd+momentum", "sgd"
// An optimizer config from code (type and its own keys through its reader; the rest as given).
OptimizerConfig make_optimizer_config(const std::string& type, const Fields& keys = {});

}  // namespace mirrored
