// optimizer: the update rule's type and its keys, the learning rate and its schedule (the config
// section, read by config.cpp; optimizer.h turns it into updates).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/spec_reader.h"

namespace mirrored {

struct ScheduleConfig {
    enum class Type { constant, step, multistep, cosine };
    Type type = Type::constant;
    int64_t warmup_steps = 0;         // linear from lr/warmup to lr
    int64_t step_size = 1000;         // step: multiply by gamma every step_size steps
    std::vector<int64_t> milestones;  // multistep: multiply by gamma at each of these steps
    double gamma = 0.1;
    double min_lr_ratio = 0.0;  // cosine: final lr = lr * min_lr_ratio
    bool operator==(const ScheduleConfig&) const = default;
};

// optimizer: the type's own keys (sgd: momentum, nesterov; adamw: betas, eps) in `options`, read
// by its OptimizerKind; what every type shares beside it.
struct OptimizerConfig {
    std::string type = "sgd";
    OptionsPtr options;  // null: the type's defaults
    double lr = 0.05;
    double weight_decay = 0.0;
    // Which parameters weight_decay applies to: all, or matrices only (tensors of two or more
    // dimensions: weights and embeddings, not biases or norms' gains - nanoGPT's and llm.c's rule).
    enum class DecayOn { all, matrices } weight_decay_on = DecayOn::all;
    double grad_clip_norm = 0.0;  // 0: off
    bool scale_lr_with_replicas = false;
    ScheduleConfig schedule;
    bool operator==(const OptimizerConfig& o) const {
        return type == o.type && same_options(options, o.options) && lr == o.lr && weight_decay == o.weight_decay &&
               weight_decay_on == o.weight_decay_on && grad_clip_norm == o.grad_clip_norm &&
               scale_lr_with_replicas == o.scale_lr_with_replicas && schedule == o.schedule;
    }
};

}  // namespace mirrored
