// dense: y = act(x W^T + b), as torch.nn.Linear (weight [out, in]) followed by the activation;
// on a sequence, at every position.
#include "mirrored/layers/activations.h"
#include "mirrored/layers/layer.h"
#include "mirrored/layers/lora.h"
#include "kernels/ops/activation.h"
#include "kernels/ops/gemm.h"

namespace mirrored {

namespace {

struct DenseOptions final : OptionsOf<DenseOptions> {
    int units = 0;
    Activation activation = Activation::none;
    InitKind init = InitKind::he_uniform;
    bool bias = true;
    Fields fields() const override {
        return {{"units", std::to_string(units)},
                {"activation", activation_name(activation)},
                {"init", init_kind_name(init)},
                {"bias", bias ? "true" : "false"}};
    }
    bool operator==(const DenseOptions&) const = default;
};

class Dense final : public Layer {
public:
    explicit Dense(const LayerSpec& s) : Layer(s), o_(spec_.get<DenseOptions>()) {}

    void declare(Builder& b) override {
        if (in_.image)
            fail("dense needs a vector input, got an image " + in_.str() + "; add {type: flatten} before it");
        const int units = o_.units, inputs = in_.c;
        InitArgs wi;
        wi.kind = o_.init;
        wi.fan_in = inputs;
        wi.fan_out = units;
        w_ = b.param(name_ + ".weight", {units, inputs}, wi);
        piece_rows_ = b.split_rows(w_, size_t(inputs));
        if (o_.bias) b_ = b.param(name_ + ".bias", {units}, InitArgs{});
        slot_ = b.new_slot();
        lora_.declare(b, name_ + ".weight", inputs, units, slot_, in_.positions());
        if (!lora_.empty() && o_.activation != Activation::none)
            fail("LoRA adds to a product before its activation: " + name_ + " has " + activation_name(o_.activation) +
                 " fused (adapt another module)");
        out_buf_ = b.act_buffer(slot_, size_t(units) * in_.positions());
        // GELU's derivative needs the pre-activation; ReLU's reads the output instead (y > 0
        // exactly when z > 0), so a ReLU layer keeps one buffer and writes it once.
        if (keeps_preactivation(o_.activation)) z_buf_ = b.act_buffer(slot_, size_t(units) * in_.positions());
        out_ = Shape::sequence(in_.positions(), units);
    }
    void place(const std::vector<TensorRef>& refs) override {
        w_off_ = refs[size_t(w_)].offset;
        if (b_ >= 0) b_off_ = refs[size_t(b_)].offset;
        lora_.place(refs);
    }

    const void* forward(Pass& p, const void* x) const override {
        const int units = out_.c, inputs = in_.c, rows = p.rows * in_.positions();
        p.acts->input(slot_) = x;
        void* y = p.acts->act(slot_, out_buf_);
        void* z = z_buf_ >= 0 ? p.acts->act(slot_, z_buf_) : y;
        // z[rows, units] = x[rows, inputs] . W[units, inputs]^T + b, y = act(z)
        dense_forward(*p.dev, p.stream, o_.activation, rows, units, inputs, x, p.weight(w_off_),
                      b_ >= 0 ? p.params + b_off_ : nullptr, z, y, p.types(p.vt));
        lora_.forward(p, rows, x, y);  // no activation when adapted
        return y;
    }

    void backward(Pass& p, void* dy, void* dx) const override {
        const int units = out_.c, inputs = in_.c, rows = p.rows * in_.positions();
        if (o_.activation != Activation::none) {
            const void* z = p.acts->act(slot_, z_buf_ >= 0 ? z_buf_ : out_buf_);
            activation_backward(*p.dev, p.stream, o_.activation, size_t(rows) * units, z, dy, dy);
        }
        float* const db = b_ >= 0 ? p.grad(b_off_) : nullptr;  // null: no bias, or frozen
        if (piece_rows_ < units) {                             // Builder::split_rows: db, then dW's blocks
            if (db) bias_gradient(*p.dev, p.stream, rows, units, dy, db, p.accumulate);
            weight_grad_by_blocks(p, rows, units, inputs, dy, p.acts->input(slot_), w_off_, piece_rows_);
        } else if (float* const dw = p.grad(w_off_)) {
            // dW[units, inputs] (+)= dz[rows, units]^T . x[rows, inputs], db (+)= column sums of dz
            dense_weight_grad(*p.dev, p.stream, rows, units, inputs, dy, p.acts->input(slot_), dw, db, p.accumulate,
                              p.types(DType::f32));
        } else if (db) {
            bias_gradient(*p.dev, p.stream, rows, units, dy, db, p.accumulate);
        }
        // dx[rows, inputs] = dz[rows, units] . W[units, inputs], plus the adapters' part (an adapted
        // weight is frozen, never split: their gradients belong to the layer's one unit)
        if (dx)
            gemm(*p.dev, p.stream, false, false, rows, inputs, units, 1.0f, dy, units, p.weight(w_off_), inputs, 0.0f,
                 dx, inputs, p.types(p.vt));
        if (!lora_.empty()) lora_.backward(p, rows, p.acts->input(slot_), dy, dx);
    }

    bool has_params() const override { return true; }
    double forward_flops() const override {
        return 2.0 * in_.c * out_.c * in_.positions() + lora_.forward_flops(in_.positions());
    }
    std::string detail() const override { return activation_name(o_.activation); }

private:
    const DenseOptions& o_;
    LoraAdapters lora_;
    int piece_rows_ = 0;
    int w_ = -1, b_ = -1, slot_ = -1, out_buf_ = -1, z_buf_ = -1;
    size_t w_off_ = 0, b_off_ = 0;
};

OptionsPtr read(SpecReader& r, const std::string& p) {
    auto o = std::make_shared<DenseOptions>();
    o->units = int(r.integer(p + ".units", 0, 1, 1 << 24));
    if (o->units == 0) r.fail(p + ".units", "required for a dense layer: a positive integer");
    o->activation = read_activation(r, p + ".activation");
    o->init = read_init(r, p + ".init", o->activation);
    o->bias = r.boolean(p + ".bias", true);
    return o;
}

}  // namespace

extern const LayerKind kDenseKind{"dense", read, create_layer<Dense>};

}  // namespace mirrored
