// layernorm: normalises each sample's last axis (the channels of every pixel, or a vector's
// features) to mean 0 and variance 1, then gamma * x + beta (torch.nn.LayerNorm(c)).
#include "kernels/ops/layernorm.h"
#include "mirrored/layers/activations.h"
#include "mirrored/layers/layer.h"
#include "mirrored/util.h"

namespace mirrored {

namespace {

struct LayerNormOptions final : OptionsOf<LayerNormOptions> {
    float epsilon = 1e-5f;
    Fields fields() const override { return {{"epsilon", decimal_text(epsilon)}}; }
    bool operator==(const LayerNormOptions&) const = default;
};

class LayerNorm final : public Layer {
public:
    explicit LayerNorm(const LayerSpec& s) : Layer(s), epsilon_(spec_.get<LayerNormOptions>().epsilon) {}

    void declare(Builder& b) override {
        InitArgs ones;
        ones.kind = InitKind::ones;
        gamma_ = b.param(name_ + ".weight", {in_.c}, ones);
        beta_ = b.param(name_ + ".bias", {in_.c}, InitArgs{});
        slot_ = b.new_slot();
        out_buf_ = b.act_buffer(slot_, in_.size());
        const size_t per_row = size_t(in_.h) * in_.w;  // normalised rows per sample
        mean_ = b.f32_buffer(slot_, per_row);
        rstd_ = b.f32_buffer(slot_, per_row);
        // a frozen weight's gradient, which the op computes with dx, goes nowhere
        if (b.frozen(gamma_) || b.frozen(beta_)) sink_ = b.f32_buffer(slot_, 0, 2 * size_t(in_.c));
    }
    void place(const std::vector<TensorRef>& refs) override {
        gamma_off_ = refs[size_t(gamma_)].offset;
        beta_off_ = refs[size_t(beta_)].offset;
    }

    const void* forward(Pass& p, const void* x) const override {
        p.acts->input(slot_) = x;
        void* y = p.acts->act(slot_, out_buf_);
        layernorm_forward(*p.dev, p.stream, p.rows * in_.h * in_.w, in_.c, epsilon_, x, p.params + gamma_off_,
                          p.params + beta_off_, y, p.acts->f32(slot_, mean_), p.acts->f32(slot_, rstd_));
        return y;
    }

    void backward(Pass& p, void* dy, void* dx) const override {
        layernorm_backward(*p.dev, p.stream, p.rows * in_.h * in_.w, in_.c, dy, p.acts->input(slot_),
                           p.acts->f32(slot_, mean_), p.acts->f32(slot_, rstd_), p.params + gamma_off_, dx,
                           grad_or_sink(p, gamma_off_, slot_, sink_, 0),
                           grad_or_sink(p, beta_off_, slot_, sink_, size_t(in_.c)), p.accumulate);
    }

    bool has_params() const override { return true; }

private:
    float epsilon_;
    int gamma_ = -1, beta_ = -1, slot_ = -1, out_buf_ = -1, mean_ = -1, rstd_ = -1, sink_ = -1;
    size_t gamma_off_ = 0, beta_off_ = 0;
};

OptionsPtr read(SpecReader& r, const std::string& p) {
    auto o = std::make_shared<LayerNormOptions>();
    o->epsilon = float(r.number(p + ".epsilon", 1e-5, 1e-12, 1.0));
    return o;
}

}  // namespace

extern const LayerKind kLayerNormKind{"layernorm", read, create_layer<LayerNorm>};

}  // namespace mirrored
