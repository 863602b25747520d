// dropout: zeroes each element with probability rate in training, scaling the rest by
// 1 / (1 - rate) (torch.nn.Dropout). Masks are a pure function of (seed, layer, step, global
// row, element), so N replicas draw the masks one replica draws for the same global batch.
#include "kernels/ops/dropout.h"
#include "mirrored/layers/activations.h"
#include "mirrored/layers/layer.h"
#include "mirrored/util.h"

namespace mirrored {

namespace {

struct DropoutOptions final : OptionsOf<DropoutOptions> {
    float rate = 0.5f;
    Fields fields() const override { return {{"rate", decimal_text(rate)}}; }
    bool operator==(const DropoutOptions&) const = default;
};

class Dropout final : public Layer {
public:
    explicit Dropout(const LayerSpec& s) : Layer(s), rate_(spec_.get<DropoutOptions>().rate) {}

    void declare(Builder& b) override {
        slot_ = b.new_slot();
        out_buf_ = b.act_buffer(slot_, in_.size());
    }

    bool active(const Pass& p) const { return p.training && rate_ > 0.0f; }
    DropoutArgs args(const Pass& p) const {
        return DropoutArgs{rate_, p.seed, uint32_t(slot_), p.step, p.row_offset, p.values};
    }

    const void* forward(Pass& p, const void* x) const override {
        if (!active(p)) return x;
        void* y = p.acts->act(slot_, out_buf_);
        dropout_forward(*p.dev, p.stream, args(p), p.rows, int(in_.size()), x, y);
        return y;
    }

    void backward(Pass& p, void* dy, void* dx) const override {
        if (!dx) return;
        if (active(p)) dropout_backward(*p.dev, p.stream, args(p), p.rows, int(in_.size()), dy, dx);
        else p.dev->copy_on_device(p.stream, dx, dy, p.dev->act_bytes(size_t(p.rows) * in_.size()));
    }

    std::string detail() const override {
        char r[32];
        std::snprintf(r, sizeof r, "rate %.2f", rate_);
        return r;
    }

private:
    float rate_;
    int slot_ = -1, out_buf_ = -1;
};

OptionsPtr read(SpecReader& r, const std::string& p) {
    auto o = std::make_shared<DropoutOptions>();
    o->rate = float(r.number(p + ".rate", 0.5, 0.0, 0.999));
    return o;
}

}  // namespace

extern const LayerKind kDropoutKind{"dropout", read, create_layer<Dropout>};

}  // namespace mirrored
