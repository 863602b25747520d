// The loss a model trains with: its outputs (the logits of the last layer) against a batch's
// labels, on the device, into the gradient backward starts from and the metric sums the trainer
// reports. Each kind lives in mirrored/losses/ and registers a LossKind; `model.loss` names it.
#pragma once

#include <memory>
#include <string>

#include "base/registry.h"
#include "base/spec_reader.h"
#include "kernels/device.h"

namespace mirrored {

// What a loss reads as a sample's label: one class index (int32), or one float per output.
enum class LabelKind { classes, targets };

class Loss {
public:
    virtual ~Loss() = default;
    // Enqueues on s, for one micro-batch of `rows` samples: metrics (device, [kMetricSlots]) +=
    // the rows' loss sum, their correct count (or share), the rows; and, when dlogits is not null
    // (training), dlogits = the gradient of the global batch's mean loss (grad_scale = 1 / its
    // rows) times *loss_scale (device, may be null). labels: [rows] class indexes or [rows, outputs]
    // targets, as LossKind::labels says.
    virtual void apply(Device& d, Stream s, int rows, int outputs, const void* logits, const void* labels,
                       float grad_scale, const float* loss_scale, void* dlogits, double* metrics) const = 0;
};

// model.loss: the kind's name and its own keys (none yet: `loss: NAME`; a kind with keys reads
// `loss: {type: NAME, key: value}`).
struct LossConfig {
    std::string type = "softmax_cross_entropy";
    OptionsPtr options;  // null: the kind's defaults
    bool operator==(const LossConfig& o) const { return type == o.type && same_options(options, o.options); }
};

// A loss kind: its name, the labels it reads, whether its metric's correct count is an accuracy
// worth reporting, whether its float targets are probabilities (in [0, 1]), how its own keys are
// read, and how it is made.
struct LossKind {
    const char* name;
    LabelKind labels;
    bool accuracy;
    bool probability_targets;
    OptionsPtr (*read)(SpecReader& r, const std::string& path);
    std::unique_ptr<Loss> (*create)(const Options& options);
};
const Registry<LossKind>& loss_kinds();  // loss.cpp lists every kind
const LossKind& loss_kind(const LossConfig& c);
std::unique_ptr<Loss> make_loss(const LossConfig& c);
// Bytes of one sample's label on the device: an int32 class index, or `outputs` floats, at each of
// `positions` positions (a sequence model's tokens).
size_t label_bytes(const LossConfig& c, int outputs, int positions = 1);

}  // namespace mirrored
