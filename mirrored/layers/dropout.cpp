// dropout: zeroes each element with probability rate in training, scaling the rest by
// 1 / (1 - rate) (torch.nn.Dropout). Masks are a pure function of (seed, layer, step, global
// row, element), so N replicas draw the masks one replica draws for the same global batch.
#include "mirrored/layers/activations.h"
#include "mirrored/layers/layer.h"
#include "mirrored/util.h"

namespace mirrored {

namespace {

class Dropout final : public Layer {
public:
    using Layer::Layer;

    void declare(Builder& b) override {
        slot_ = b.new_slot();
        out_buf_ = b.act_buffer(slot_, in_.size());
    }

    bool active(const Pass& p) const { return p.training && spec_.rate > 0.0f; }
    DropoutArgs args(const Pass& p) const {
        return DropoutArgs{spec_.rate, p.seed, uint32_t(slot_), p.step, p.row_offset, p.values};
    }

    const void* forward(Pass& p, const void* x) const override {
        if (!active(p)) return x;
        void* y = p.acts->act(slot_, out_buf_);
        p.dev->dropout_forward(p.stream, args(p), p.rows, int(in_.size()), x, y);
        return y;
    }

    void backward(Pass& p, void* dy, void* dx) const override {
        if (!dx) return;
        if (active(p)) p.dev->dropout_backward(p.stream, args(p), p.rows, int(in_.size()), dy, dx);
        else p.dev->copy_on_device(p.stream, dx, dy, p.dev->act_bytes(size_t(p.rows) * in_.size()));
    }

    std::string detail() const override {
        char r[32];
        std::snprintf(r, sizeof r, "rate %.2f", spec_.rate);
        return r;
    }

private:
    int slot_ = -1, out_buf_ = -1;
};

void read(SpecReader& r, const std::string& p, LayerSpec& s) { s.rate = float(r.number(p + ".rate", 0.5, 0.0, 0.999)); }

std::vector<std::pair<std::string, std::string>> fields(const LayerSpec& s) {
    return {{"rate", decimal_text(s.rate)}};
}

}  // namespace

extern const LayerKind kDropoutKind{"dropout", read, fields, [](const LayerSpec& s) -> std::unique_ptr<Layer> {
                                        return std::make_unique<Dropout>(s);
                                    }};

}  // namespace mirrored
