// flatten: an image [h, w, c] becomes a vector in PyTorch's order (c, h, w) - torch.flatten of an
// NCHW tensor - so a dense layer after it has exactly the weight a PyTorch user expects. Stored
// NHWC, so the flatten of a multi-channel image is a transpose; of one channel, nothing.
#include "kernels/ops/conv.h"
#include "mirrored/layers/activations.h"
#include "mirrored/layers/layer.h"

namespace mirrored {

namespace {

class Flatten final : public Layer {
public:
    using Layer::Layer;

    void declare(Builder& b) override {
        out_ = Shape::vector(int(in_.size()));
        transposes_ = in_.image && in_.c > 1 && size_t(in_.h) * in_.w > 1;
        if (transposes_) {
            slot_ = b.new_slot();
            out_buf_ = b.act_buffer(slot_, in_.size());
        }
    }

    const void* forward(Pass& p, const void* x) const override {
        if (!transposes_) return x;
        void* y = p.acts->act(slot_, out_buf_);
        nhwc_to_nchw(*p.dev, p.stream, p.rows, in_.h, in_.w, in_.c, x, y, false);
        return y;
    }

    void backward(Pass& p, void* dy, void* dx) const override {
        if (!dx) return;
        if (transposes_) nhwc_to_nchw(*p.dev, p.stream, p.rows, in_.h, in_.w, in_.c, dy, dx, true);
        else p.dev->copy_on_device(p.stream, dx, dy, p.dev->act_bytes(size_t(p.rows) * in_.size()));
    }

private:
    bool transposes_ = false;
    int slot_ = -1, out_buf_ = -1;
};

}  // namespace

extern const LayerKind kFlattenKind{"flatten", read_no_options, create_layer<Flatten>};

}  // namespace mirrored
