#include "mirrored/step_profile.h"

#include "base/error.h"
#include "mirrored/util.h"

namespace mirrored {

StepProfile::StepProfile(Device& d, int layers, int units, int micro_batches)
    : dev_(d),
      layers_(layers),
      // per micro-batch: each layer's forward and backward, the loss, and after a gradient unit
      // that reduces, its layer's backward so far and the reduction (every micro-batch reduces
      // when the gradients are staged)
      capacity_(5 + size_t(micro_batches) * (2 * size_t(layers) + 2 * size_t(units) + 1)),
      clock_(!d.traits().asynchronous) {
    totals_.forward.assign(size_t(layers), 0.0);
    totals_.backward.assign(size_t(layers), 0.0);
    labels_.reserve(capacity_);
    if (clock_) times_.reserve(capacity_);
    else
        for (size_t i = 0; i < capacity_; ++i) events_.push_back(d.event_create(true));
}

StepProfile::~StepProfile() {
    for (Event e : events_) dev_.event_destroy(e);
}

void StepProfile::mark(Device& d, Stream s, int label) {
    if (&d != &dev_) return;  // replica 0's device only
    if (label == kBegin) {
        labels_.clear();
        times_.clear();
    }
    if (labels_.size() == capacity_)
        throw Error(kExitFailure, "step profile: more marks in a step than its layers and micro-batches allow");
    if (clock_) times_.push_back(now_s());
    else d.event_record(events_[labels_.size()], s);
    labels_.push_back(label);
}

void StepProfile::collect() {
    if (labels_.size() < 2 || labels_.front() != kBegin || labels_.back() != kEnd)
        throw Error(kExitFailure, "step profile: the step was not marked from begin to end");
    if (!clock_) dev_.event_synchronize(events_[labels_.size() - 1]);
    auto at = [&](size_t i) {
        return clock_ ? times_[i] : 1e-3 * double(dev_.event_elapsed_ms(events_[0], events_[i]));
    };
    for (size_t i = 1; i < labels_.size(); ++i) {
        const double t = at(i) - at(i - 1);
        const int label = labels_[i];
        if (label >= 0 && label < layers_) totals_.forward[size_t(label)] += t;
        else if (label >= layers_) totals_.backward[size_t(label - layers_)] += t;
        else if (label == kInput) totals_.input += t;
        else if (label == kLoss) totals_.loss += t;
        else if (label == kReduced) totals_.reduce += t;
        else if (label == kEnd) totals_.update += t;
    }
    totals_.step += at(labels_.size() - 1) - at(0);
    ++totals_.steps;
    labels_.clear();
    times_.clear();
}

}  // namespace mirrored
