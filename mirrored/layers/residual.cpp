// residual: y = act(F(x) + S(x)), F its layers and S the identity or, with shortcut: conv1x1, a
// 1x1 convolution (stride by the change in size, no bias) followed by batchnorm - the projection
// shortcut of He et al. 2016, named as torchvision names it (layers.i.shortcut.0/.1). With
// train.recompute: blocks it keeps only its input and output (and pre-activation) between
// forward and backward, and runs F and S again first in backward (Builder::begin_recompute).
#include "mirrored/layers/activations.h"
#include "mirrored/layers/layer.h"
#include "mirrored/layers/sequential.h"
#include "kernels/ops/elementwise.h"
#include "kernels/ops/activation.h"

namespace mirrored {

namespace {

struct ResidualOptions final : OptionsOf<ResidualOptions> {
    bool projection = false;  // shortcut: conv1x1, else identity
    Activation activation = Activation::none;
    Fields fields() const override {
        return {{"shortcut", projection ? "conv1x1" : "identity"}, {"activation", activation_name(activation)}};
    }
    bool operator==(const ResidualOptions&) const = default;
};

class Residual final : public Layer {
public:
    explicit Residual(const LayerSpec& s) : Layer(s), o_(spec_.get<ResidualOptions>()), branch_(s.layers) {}

    void declare(Builder& b) override {
        recompute_ = b.begin_recompute();
        out_ = branch_.build(b, name_ + ".layers", key_ + ".layers", in_, false);
        if (o_.projection) {
            if (!out_.image || !in_.image) fail("shortcut: conv1x1 needs image input and output");
            if (in_.h % out_.h || in_.w % out_.w || in_.h / out_.h != in_.w / out_.w)
                fail("shortcut: conv1x1 cannot map " + in_.str() + " to " + out_.str() + " with one stride");
            const LayerSpec conv = make_layer_spec("conv2d", {{"filters", std::to_string(out_.c)},
                                                              {"kernel_size", "1"},
                                                              {"stride", std::to_string(in_.h / out_.h)},
                                                              {"bias", "false"},
                                                              {"init", "he_uniform"}});
            const LayerSpec bn = make_layer_spec("batchnorm", {{"sync", sync_of(spec_) ? "true" : "false"}});
            shortcut_ = std::make_unique<Sequential>(std::vector<LayerSpec>{conv, bn});
            const Shape s = shortcut_->build(b, name_ + ".shortcut", key_ + ".shortcut", in_, false);
            if (!(s == out_)) fail("the shortcut's output " + s.str() + " differs from the block's " + out_.str());
        } else if (!(out_ == in_)) {
            fail("the block's layers change the shape from " + in_.str() + " to " + out_.str() +
                 "; add shortcut: conv1x1 for a projection");
        }
        slot_ = b.new_slot();
        g1_ = b.act_buffer(slot_, out_.size());
        if (shortcut_) g2_ = b.act_buffer(slot_, in_.size());
        b.end_recompute();
        // kept, recomputed or not: the output is the next layer's input; GELU's derivative needs
        // the pre-activation, ReLU's reads the output (as dense layers do)
        out_buf_ = b.act_buffer(slot_, out_.size());
        if (keeps_preactivation(o_.activation)) z_buf_ = b.act_buffer(slot_, out_.size());
    }
    void check_batch(int rows, int global_rows) const override {
        branch_.check_batch(rows, global_rows);
        if (shortcut_) shortcut_->check_batch(rows, global_rows);
    }
    void place(const std::vector<TensorRef>& refs) override {
        branch_.place(refs);
        if (shortcut_) shortcut_->place(refs);
    }

    const void* forward(Pass& p, const void* x) const override {
        p.acts->input(slot_) = x;
        const void* f = branch_.forward(p, x);
        const void* s = shortcut_ ? shortcut_->forward(p, x) : x;
        void* y = p.acts->act(slot_, out_buf_);
        if (z_buf_ < 0) {
            add_act_values(*p.dev, p.stream, o_.activation, p.rows, int(out_.size()), f, s, y);
            return y;
        }
        void* z = p.acts->act(slot_, z_buf_);
        add_act_values(*p.dev, p.stream, Activation::none, p.rows, int(out_.size()), f, s, z);
        bias_activation(*p.dev, p.stream, o_.activation, p.rows, int(out_.size()), nullptr, z, y);
        return y;
    }

    void backward(Pass& p, void* dy, void* dx) const override {
        if (recompute_) {  // the activations the backward reads, as the forward made them
            const bool was = p.recomputing;
            p.recomputing = true;
            const void* x = p.acts->input(slot_);
            branch_.forward(p, x);
            if (shortcut_) shortcut_->forward(p, x);
            p.recomputing = was;
        }
        const size_t n = size_t(p.rows) * out_.size();
        if (o_.activation != Activation::none)
            activation_backward(*p.dev, p.stream, o_.activation, n, p.acts->act(slot_, z_buf_ >= 0 ? z_buf_ : out_buf_),
                                dy, dy);
        void* g1 = p.acts->act(slot_, g1_);  // the branch overwrites its copy; dy stays for the shortcut
        p.dev->copy_on_device(p.stream, g1, dy, p.dev->act_bytes(n));
        // the shortcut, built last, first: gradient units complete in the reverse of their order
        void* g2 = shortcut_ && dx ? p.acts->act(slot_, g2_) : nullptr;
        if (shortcut_) shortcut_->backward(p, dy, g2);
        branch_.backward(p, g1, dx);
        if (shortcut_) {
            if (dx) add_values(*p.dev, p.stream, size_t(p.rows) * in_.size(), g2, dx);
        } else if (dx) {
            add_values(*p.dev, p.stream, n, dy, dx);
        }
    }

    bool recomputes() const override { return recompute_; }
    bool has_params() const override { return branch_.has_params() || (shortcut_ && shortcut_->has_params()); }
    double forward_flops() const override {
        double f = 0;
        for (const auto& l : branch_.layers()) f += l->forward_flops();
        if (shortcut_)
            for (const auto& l : shortcut_->layers()) f += l->forward_flops();
        return f;
    }
    std::string detail() const override {
        return std::to_string(branch_.layers().size()) + " layers" + (shortcut_ ? " + conv1x1 shortcut" : "") + " " +
               activation_name(o_.activation);
    }

private:
    // The shortcut's batchnorm synchronises when the block's own ones do.
    static bool sync_of(const LayerSpec& s) {
        for (const LayerSpec& l : s.layers)
            if (l.field("sync") == "true") return true;  // a layer that sums its statistics over the replicas
        return false;
    }

    const ResidualOptions& o_;
    Sequential branch_;
    std::unique_ptr<Sequential> shortcut_;
    int slot_ = -1, z_buf_ = -1, out_buf_ = -1, g1_ = -1, g2_ = -1;
    bool recompute_ = false;
};

// The block's `layers` are read before, by read_layer_list (a container).
OptionsPtr read(SpecReader& r, const std::string& p) {
    auto o = std::make_shared<ResidualOptions>();
    o->projection = r.choice(p + ".shortcut", "identity", {"identity", "conv1x1"}) == "conv1x1";
    o->activation = read_activation(r, p + ".activation");
    return o;
}

}  // namespace

extern const LayerKind kResidualKind{"residual", read, create_layer<Residual>, /*container=*/true};

}  // namespace mirrored
