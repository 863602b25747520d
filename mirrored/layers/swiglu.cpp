// swiglu: Llama's gated activation on a sequence [t, 2w] -> [t, w]: silu(gate) * up, the gate the
// first w values of each position and up the last w (a dense layer of 2w units before it is
// Hugging Face's gate_proj and up_proj as one product; kernels/ops/swiglu.h).
#include "kernels/ops/swiglu.h"
#include "mirrored/layers/activations.h"
#include "mirrored/layers/layer.h"

namespace mirrored {

namespace {

class Swiglu final : public Layer {
public:
    using Layer::Layer;

    void declare(Builder& b) override {
        if (in_.image) fail("swiglu needs a sequence or vector [t, 2w], got an image " + in_.str());
        if (in_.c % 2) fail("swiglu halves its input's width (gate, then up); " + std::to_string(in_.c) + " is odd");
        out_ = Shape::sequence(in_.positions(), in_.c / 2);
        slot_ = b.new_slot();
        out_buf_ = b.act_buffer(slot_, out_.size());
    }

    const void* forward(Pass& p, const void* x) const override {
        p.acts->input(slot_) = x;
        void* y = p.acts->act(slot_, out_buf_);
        swiglu_forward(*p.dev, p.stream, p.rows * in_.positions(), out_.c, x, y);
        return y;
    }

    void backward(Pass& p, void* dy, void* dx) const override {
        if (dx) swiglu_backward(*p.dev, p.stream, p.rows * in_.positions(), out_.c, p.acts->input(slot_), dy, dx);
    }

private:
    int slot_ = -1, out_buf_ = -1;
};

}  // namespace

extern const LayerKind kSwigluKind{"swiglu", read_no_options, create_layer<Swiglu>};

}  // namespace mirrored
