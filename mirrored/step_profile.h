// bench-step --layers: replica 0's training step timed layer by layer - the device time between
// timing events on GPUs (real or simulated), the clock on CPU replicas, whose ops run as they are
// issued. Profiled steps run uncaptured and each waits for its events afterwards, so they are for
// finding where a step's time goes, not for measuring throughput.
#pragma once

#include <vector>

#include "kernels/device.h"
#include "mirrored/layers/layer.h"

namespace mirrored {

class StepProfile final : public LayerProbe {
public:
    // layers: the model's top-level layers; units: its gradient units (Model::gradient_units);
    // micro_batches: forward/backward passes per step.
    StepProfile(Device& d, int layers, int units, int micro_batches);
    ~StepProfile() override;
    StepProfile(const StepProfile&) = delete;
    StepProfile& operator=(const StepProfile&) = delete;

    void mark(Device& d, Stream s, int label) override;
    // After a profiled step: waits for its last mark and adds each interval to the label that
    // ends it.
    void collect();

    struct Totals {                             // seconds, summed over the collected steps
        std::vector<double> forward, backward;  // per top-level layer
        double input = 0, loss = 0, reduce = 0, update = 0, step = 0;
        int steps = 0;
    };
    const Totals& totals() const { return totals_; }

private:
    Device& dev_;
    const int layers_;
    const size_t capacity_;      // marks in a step, at most
    const bool clock_;           // CPU replicas: the host clock
    std::vector<Event> events_;  // one per mark of a step (GPUs)
    std::vector<double> times_;  // the clock's marks (CPU)
    std::vector<int> labels_;    // this step's marks so far
    Totals totals_;
};

}  // namespace mirrored
