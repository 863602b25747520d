// What transformer_block and llama_block share: a block of two residual branches,
// h = x + first(x), y = h + second(h), whose sub-layers it builds itself; with train.recompute:
// blocks, the branches run again at the start of backward (Builder::begin_recompute).
#pragma once

#include <memory>
#include <string>

#include "mirrored/layers/activations.h"
#include "mirrored/layers/layer.h"
#include "kernels/ops/elementwise.h"

namespace mirrored {

class PreNormBlock : public Layer {
public:
    using Layer::Layer;

    const void* forward(Pass& p, const void* x) const override {
        p.acts->input(slot_) = x;
        const void* h = nullptr;
        const void* m = branches(p, x, &h);
        void* y = p.acts->act(slot_, y_);
        add_act_values(*p.dev, p.stream, Activation::none, p.rows, int(in_.size()), m, h, y);
        return y;
    }
    bool recomputes() const override { return recompute_; }
    bool has_params() const override { return true; }

protected:
    // h = x + the first branch into *h; returns the second branch's output (before its residual add).
    virtual const void* branches(Pass& p, const void* x, const void** h) const = 0;
    // At the start of backward: the activations it reads, as forward made them (when recomputed).
    void recompute_branches(Pass& p) const {
        if (!recompute_) return;
        const bool was = p.recomputing;
        p.recomputing = true;
        const void* h = nullptr;
        branches(p, p.acts->input(slot_), &h);
        p.recomputing = was;
    }
    // A sub-layer from the keys a config would give it.
    static std::unique_ptr<Layer> sub_layer(const std::string& type, const Fields& keys) {
        return layer_kinds().get(type).create(make_layer_spec(type, keys));
    }

    int slot_ = -1, y_ = -1;  // the block's slot and its output
    bool recompute_ = false;
};

}  // namespace mirrored
