// Pooling over windows (maxpool2d, avgpool2d, global_avgpool share it): the window geometry,
// the forward and the gradient routing; each type in its own file chooses the window.
#pragma once

#include "kernels/ops/conv.h"
#include "mirrored/layers/activations.h"
#include "mirrored/layers/layer.h"

namespace mirrored {

class Pool : public Layer {
public:
    Pool(const LayerSpec& spec, PoolKind kind) : Layer(spec), kind_(kind) {}

    const void* forward(Pass& p, const void* x) const override {
        p.acts->input(slot_) = x;
        void* y = p.acts->act(slot_, out_buf_);
        pool_forward(*p.dev, p.stream, kind_, window(p), x, y);
        return y;
    }
    void backward(Pass& p, void* dy, void* dx) const override {
        if (dx) pool_backward(*p.dev, p.stream, kind_, window(p), p.acts->input(slot_), dy, dx);
    }
    std::string detail() const override {
        return std::to_string(g_.kh) + "x" + std::to_string(g_.kw) + "/" + std::to_string(g_.sh);
    }

protected:
    // Sets the window and declares the output; out is the pooled image or, for global pooling,
    // the vector of channels.
    void declare_window(Builder& b, int kh, int kw, int stride, int pad, bool to_vector) {
        if (!in_.image) fail(spec_.type + " needs an image input [height, width, channels], got " + in_.str());
        g_ = Window2d{0, in_.h, in_.w, in_.c, kh, kw, stride, stride, pad, pad};
        if (in_.h + 2 * pad < kh || in_.w + 2 * pad < kw)
            fail("a " + std::to_string(kh) + "x" + std::to_string(kw) + " window does not fit the input " + in_.str());
        if (2 * pad > kh || 2 * pad > kw) fail("padding may be at most half the pool size");
        out_ = to_vector ? Shape::vector(in_.c) : Shape::picture(g_.oh(), g_.ow(), in_.c);
        slot_ = b.new_slot();
        out_buf_ = b.act_buffer(slot_, out_.size());
    }
    Window2d window(const Pass& p) const {
        Window2d g = g_;
        g.n = p.rows;
        return g;
    }

    PoolKind kind_;
    Window2d g_;
    int slot_ = -1, out_buf_ = -1;
};

// A pooling window's keys: kernel_size (default 2), stride (default: the kernel size), padding.
struct PoolOptions final : OptionsOf<PoolOptions> {
    WindowKeys window;
    Fields fields() const override {
        return {{"kernel_size", std::to_string(window.kernel)},
                {"stride", std::to_string(window.stride)},
                {"padding", window.padding_text()}};
    }
    bool operator==(const PoolOptions&) const = default;
};
OptionsPtr read_pool(SpecReader& r, const std::string& p);

// maxpool2d and avgpool2d: the window of their keys.
class WindowPool : public Pool {
public:
    WindowPool(const LayerSpec& spec, PoolKind kind) : Pool(spec, kind) {}
    void declare(Builder& b) override {
        const WindowKeys& w = spec_.get<PoolOptions>().window;
        declare_window(b, w.kernel, w.kernel, w.stride, w.pad(), false);
    }
};

}  // namespace mirrored
