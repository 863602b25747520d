// rmsnorm: scales each sample's last axis (the channels of every pixel, or a vector's features) by
// the inverse root mean square, then by gamma - no mean subtracted, no bias (Llama's RMSNorm,
// torch.nn.RMSNorm(c, eps), Hugging Face's LlamaRMSNorm; kernels/ops/rmsnorm.h).
#include "kernels/ops/rmsnorm.h"
#include "mirrored/layers/activations.h"
#include "mirrored/layers/layer.h"
#include "mirrored/util.h"

namespace mirrored {

namespace {

struct RmsNormOptions final : OptionsOf<RmsNormOptions> {
    float epsilon = 1e-6f;  // Llama's rms_norm_eps
    Fields fields() const override { return {{"epsilon", decimal_text(epsilon)}}; }
    bool operator==(const RmsNormOptions&) const = default;
};

class RmsNorm final : public Layer {
public:
    explicit RmsNorm(const LayerSpec& s) : Layer(s), epsilon_(spec_.get<RmsNormOptions>().epsilon) {}

    void declare(Builder& b) override {
        InitArgs ones;
        ones.kind = InitKind::ones;
        gamma_ = b.param(name_ + ".weight", {in_.c}, ones);
        slot_ = b.new_slot();
        out_buf_ = b.act_buffer(slot_, in_.size());
        rstd_ = b.f32_buffer(slot_, size_t(in_.h) * in_.w);                   // one per normalised row of a sample
        if (b.frozen(gamma_)) sink_ = b.f32_buffer(slot_, 0, size_t(in_.c));  // its gradient goes nowhere
    }
    void place(const std::vector<TensorRef>& refs) override { gamma_off_ = refs[size_t(gamma_)].offset; }

    const void* forward(Pass& p, const void* x) const override {
        p.acts->input(slot_) = x;
        void* y = p.acts->act(slot_, out_buf_);
        rmsnorm_forward(*p.dev, p.stream, p.rows * in_.h * in_.w, in_.c, epsilon_, x, p.params + gamma_off_, y,
                        p.acts->f32(slot_, rstd_));
        return y;
    }

    void backward(Pass& p, void* dy, void* dx) const override {
        rmsnorm_backward(*p.dev, p.stream, p.rows * in_.h * in_.w, in_.c, dy, p.acts->input(slot_),
                         p.acts->f32(slot_, rstd_), p.params + gamma_off_, dx,
                         grad_or_sink(p, gamma_off_, slot_, sink_, 0), p.accumulate);
    }

    bool has_params() const override { return true; }

private:
    float epsilon_;
    int gamma_ = -1, slot_ = -1, out_buf_ = -1, rstd_ = -1, sink_ = -1;
    size_t gamma_off_ = 0;
};

OptionsPtr read(SpecReader& r, const std::string& p) {
    auto o = std::make_shared<RmsNormOptions>();
    o->epsilon = float(r.number(p + ".epsilon", 1e-6, 1e-12, 1.0));
    return o;
}

}  // namespace

extern const LayerKind kRmsNormKind{"rmsnorm", read, create_layer<RmsNorm>};

}  // namespace mirrored
