// dense: y = act(x W^T + b), as torch.nn.Linear (weight [out, in]) followed by the activation;
// on a sequence, at every position.
#include "mirrored/layers/activations.h"
#include "mirrored/layers/layer.h"

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
        out_buf_ = b.act_buffer(slot_, size_t(units) * in_.positions());
        // GELU's derivative needs the pre-activation; ReLU's reads the output instead (y > 0
        // exactly when z > 0), so a ReLU layer keeps one buffer and writes it once.
        if (keeps_preactivation(o_.activation)) z_buf_ = b.act_buffer(slot_, size_t(units) * in_.positions());
        out_ = Shape::sequence(in_.positions(), units);
    }
    void place(const std::vector<TensorRef>& refs) override {
        w_off_ = refs[size_t(w_)].offset;
        if (b_ >= 0) b_off_ = refs[size_t(b_)].offset;
    }

    const void* forward(Pass& p, const void* x) const override {
        const int units = out_.c, inputs = in_.c, rows = p.rows * in_.positions();
        p.acts->input(slot_) = x;
        void* y = p.acts->act(slot_, out_buf_);
        void* z = z_buf_ >= 0 ? p.acts->act(slot_, z_buf_) : y;
        // z[rows, units] = x[rows, inputs] . W[units, inputs]^T + b, y = act(z)
        p.dev->dense_forward(p.stream, o_.activation, rows, units, inputs, x, p.weight(w_off_),
                             b_ >= 0 ? p.params + b_off_ : nullptr, z, y, p.types(p.vt));
        return y;
    }

    void backward(Pass& p, void* dy, void* dx) const override {
        const int units = out_.c, inputs = in_.c, rows = p.rows * in_.positions();
        if (o_.activation != Activation::none) {
            const void* z = p.acts->act(slot_, z_buf_ >= 0 ? z_buf_ : out_buf_);
            p.dev->act_backward(p.stream, o_.activation, size_t(rows) * units, z, dy, dy);
        }
        if (piece_rows_ < units) {  // Builder::split_rows: db, then dW's blocks
            if (b_ >= 0) p.dev->bias_grad(p.stream, rows, units, dy, p.grad(b_off_), p.accumulate);
            weight_grad_by_blocks(p, rows, units, inputs, dy, p.acts->input(slot_), w_off_, piece_rows_);
        } else {
            // dW[units, inputs] (+)= dz[rows, units]^T . x[rows, inputs], db (+)= column sums of dz
            p.dev->dense_weight_grad(p.stream, rows, units, inputs, dy, p.acts->input(slot_), p.grad(w_off_),
                                     b_ >= 0 ? p.grad(b_off_) : nullptr, p.accumulate, p.types(DType::f32));
        }
        // dx[rows, inputs] = dz[rows, units] . W[units, inputs]
        if (dx)
            p.dev->gemm(p.stream, false, false, rows, inputs, units, 1.0f, dy, units, p.weight(w_off_), inputs, 0.0f,
                        dx, inputs, p.types(p.vt));
    }

    bool has_params() const override { return true; }
    double forward_flops() const override { return 2.0 * in_.c * out_.c * in_.positions(); }
    std::string detail() const override { return activation_name(o_.activation); }

private:
    const DenseOptions& o_;
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
