// Layers applied in order, with the two gradient buffers their backward pass alternates
// between: the model's top level, and the branch of a residual block.
#pragma once

#include <memory>
#include <vector>

#include "mirrored/layers/layer.h"

namespace mirrored {

class Sequential {
public:
    explicit Sequential(const std::vector<LayerSpec>& specs);
    // Builds layer i as `<name>.<i>` (config key `<key>.<i>`) from `in`; returns the output shape.
    // top: layer i's tensors belong to top-level layer i (gradient buckets become ready by it).
    Shape build(Builder& b, const std::string& name, const std::string& key, const Shape& in, bool top);
    void place(const std::vector<TensorRef>& refs);
    const void* forward(Pass& p, const void* x) const;
    // dy: the output gradient (overwritten); dx: the input gradient, or null when nothing before
    // needs it (then layers below the first one with parameters are skipped). Runs the layers
    // last to first (Layer::run_backward: each gradient unit reports when done).
    void backward(Pass& p, void* dy, void* dx) const;

    const std::vector<std::unique_ptr<Layer>>& layers() const { return layers_; }
    bool has_params() const;
    void check_batch(int rows, int global_rows) const;

private:
    std::vector<std::unique_ptr<Layer>> layers_;
    int slot_ = -1;
    int first_param_ = 0;  // the lowest layer with parameters
    bool top_ = false;     // the model's top level: marks its layers for Pass::probe
};

}  // namespace mirrored
