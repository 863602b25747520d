// conv2d: y = act(conv(x, W) + b) over NHWC images, as torch.nn.Conv2d (weight [out, in, kh, kw])
// followed by the activation. im2col + GEMM: the columns [n*oh*ow, in*kh*kw] times W^T give the
// output NHWC directly, one GEMM for the whole batch; a 1x1 convolution with stride 1 and no
// padding is a plain GEMM on the input. The columns live in the shared scratch and are made
// again in backward rather than kept per layer. Where the device prefers pixel-major columns
// (the CPU: a row is whole pixels copied, not a transpose), the layer multiplies by the weights
// permuted to [out, kh, kw, in] and permutes their gradient back; the parameters, checkpoints
// and exports keep PyTorch's order.
#include "mirrored/layers/activations.h"
#include "mirrored/layers/layer.h"

namespace mirrored {

namespace {

class Conv2d final : public Layer {
public:
    using Layer::Layer;

    void declare(Builder& b) override {
        if (!in_.image) fail("conv2d needs an image input [height, width, channels], got " + in_.str());
        const int k = spec_.kernel, pad = spec_.same ? (k - 1) / 2 : spec_.padding;
        g_ = Window2d{0, in_.h, in_.w, in_.c, k, k, spec_.stride, spec_.stride, pad, pad};
        if (in_.h + 2 * pad < k || in_.w + 2 * pad < k)
            fail("a " + std::to_string(k) + "x" + std::to_string(k) + " kernel does not fit the input " + in_.str() +
                 " with padding " + std::to_string(pad));
        direct_ = k == 1 && spec_.stride == 1 && pad == 0;
        const int K = in_.c * k * k, F = spec_.filters;
        InitArgs wi;
        wi.kind = spec_.init;
        wi.fan_in = K;          // PyTorch's fans for a conv: in x kh x kw, out x kh x kw
        wi.fan_out = F * k * k;
        w_ = b.param(name_ + ".weight", {F, in_.c, k, k}, wi);
        if (spec_.bias) b_ = b.param(name_ + ".bias", {F}, InitArgs{});
        out_ = Shape::picture(g_.oh(), g_.ow(), F);
        slot_ = b.new_slot();
        out_buf_ = b.act_buffer(slot_, out_.size());
        // As dense: GELU's derivative needs the pre-activation, ReLU's reads the output.
        if (spec_.activation == Activation::gelu) z_buf_ = b.act_buffer(slot_, out_.size());
        if (!direct_) {
            b.scratch(size_t(g_.oh()) * g_.ow() * K);
            permuted_ = b.f32_buffer(slot_, 0, size_t(F) * K);  // the weights or their gradient, pixel-major
            permuted_grad_ = b.f32_buffer(slot_, 0, size_t(F) * K);
        }
    }
    void place(const std::vector<TensorRef>& refs) override {
        w_off_ = refs[size_t(w_)].offset;
        if (b_ >= 0) b_off_ = refs[size_t(b_)].offset;
    }

    bool pixel_major(const Pass& p) const { return !direct_ && p.dev->pixel_major_columns(); }

    Window2d window(const Pass& p) const {
        Window2d g = g_;
        g.n = p.rows;
        g.pixel_major = pixel_major(p);
        return g;
    }

    // The columns of x in the scratch (or x itself for a direct 1x1).
    const void* columns(Pass& p, const void* x) const {
        if (direct_) return x;
        p.dev->im2col(p.stream, window(p), x, p.acts->scratch());
        return p.acts->scratch();
    }

    // The weights in the columns' order: [F, C, kh, kw] as they are, or [F, kh, kw, C].
    const void* weights(Pass& p) const {
        if (!pixel_major(p)) return p.weight(w_off_);
        float* w = p.acts->f32(slot_, permuted_);
        p.dev->nhwc_to_nchw(p.stream, out_.c, g_.kh, g_.kw, in_.c, p.weight(w_off_), w, true);
        return w;
    }

    const void* forward(Pass& p, const void* x) const override {
        const int M = p.rows * out_.h * out_.w, F = out_.c, K = in_.c * g_.kh * g_.kw;
        p.acts->input(slot_) = x;
        void* y = p.acts->act(slot_, out_buf_);
        void* z = z_buf_ >= 0 ? p.acts->act(slot_, z_buf_) : y;
        // z[M, F] = cols[M, K] . W[F, K]^T + b, y = act(z): a dense layer over the columns
        p.dev->dense_forward(p.stream, spec_.activation, M, F, K, columns(p, x), weights(p),
                             b_ >= 0 ? p.params + b_off_ : nullptr, z, y, p.types(p.vt));
        return y;
    }

    void backward(Pass& p, void* dy, void* dx) const override {
        const int M = p.rows * out_.h * out_.w, F = out_.c, K = in_.c * g_.kh * g_.kw;
        if (spec_.activation != Activation::none) {
            const void* z = p.acts->act(slot_, z_buf_ >= 0 ? z_buf_ : out_buf_);
            p.dev->act_backward(p.stream, spec_.activation, size_t(M) * F, z, dy, dy);
        }
        float* db = b_ >= 0 ? p.grads + b_off_ : nullptr;
        const void* cols = columns(p, p.acts->input(slot_));
        if (pixel_major(p)) {
            // the permuted dW[F, K] = dz^T . cols into the layer's buffer, db (+)= column sums of dz
            p.dev->dense_weight_grad(p.stream, M, F, K, dy, cols, p.acts->f32(slot_, permuted_grad_), nullptr,
                                     false, p.types(DType::f32));
            if (db) p.dev->bias_grad(p.stream, M, F, dy, db, p.accumulate);
        } else {
            // dW[F, K] (+)= dz[M, F]^T . cols[M, K], db (+)= column sums of dz
            p.dev->dense_weight_grad(p.stream, M, F, K, dy, cols, p.grads + w_off_, db, p.accumulate,
                                     p.types(DType::f32));
        }
        if (dx && direct_) {  // dx[M, C] = dz[M, F] . W[F, C]
            p.dev->gemm(p.stream, false, false, M, K, F, 1.0f, dy, F, p.weight(w_off_), K, 0.0f, dx, K, p.types(p.vt));
        } else if (dx) {
            // dcols[M, K] = dz[M, F] . W[F, K], into the scratch (the columns are no longer needed)
            void* dcols = p.acts->scratch();
            const void* w = pixel_major(p) ? p.acts->f32(slot_, permuted_) : p.weight(w_off_);  // as forward left it
            p.dev->gemm(p.stream, false, false, M, K, F, 1.0f, dy, F, w, K, 0.0f, dcols, K, p.types(p.vt));
            p.dev->col2im(p.stream, window(p), dcols, dx);
        }
        if (pixel_major(p)) unpermute_weight_grad(p);
    }

    // dW (+)= the pixel-major gradient back in [F, C, kh, kw] order.
    void unpermute_weight_grad(Pass& p) const {
        const float* g = p.acts->f32(slot_, permuted_grad_);
        float* dw = p.grads + w_off_;
        const int F = out_.c, K = in_.c * g_.kh * g_.kw;
        if (!p.accumulate) {
            p.dev->nhwc_to_nchw(p.stream, F, g_.kh, g_.kw, in_.c, g, dw, false);
            return;
        }
        float* tmp = p.acts->f32(slot_, permuted_);  // the permuted weights are no longer needed
        p.dev->nhwc_to_nchw(p.stream, F, g_.kh, g_.kw, in_.c, g, tmp, false);
        p.dev->axpy(p.stream, size_t(F) * K, 1.0f, tmp, dw);
    }

    bool has_params() const override { return true; }
    double forward_flops() const override { return 2.0 * out_.h * out_.w * out_.c * in_.c * g_.kh * g_.kw; }
    std::string detail() const override {
        return std::to_string(g_.kh) + "x" + std::to_string(g_.kw) + "/" + std::to_string(g_.sh) + " " +
               activation_name(spec_.activation);
    }

private:
    Window2d g_;
    bool direct_ = false;
    int w_ = -1, b_ = -1, slot_ = -1, out_buf_ = -1, z_buf_ = -1, permuted_ = -1, permuted_grad_ = -1;
    size_t w_off_ = 0, b_off_ = 0;
};

void read(SpecReader& r, const std::string& p, LayerSpec& s) {
    s.filters = int(r.integer(p + ".filters", 0, 1, 1 << 16));
    if (s.filters == 0) r.fail(p + ".filters", "required for a conv2d layer: a positive integer");
    s.kernel = int(r.integer(p + ".kernel_size", 3, 1, 15));
    s.stride = int(r.integer(p + ".stride", 1, 1, 15));
    read_padding(r, p + ".padding", s);
    s.activation = read_activation(r, p + ".activation");
    s.init = read_init(r, p + ".init", s.activation);
    s.bias = r.boolean(p + ".bias", true);
}

std::vector<std::pair<std::string, std::string>> fields(const LayerSpec& s) {
    return {{"filters", std::to_string(s.filters)},
            {"kernel_size", std::to_string(s.kernel)},
            {"stride", std::to_string(s.stride)},
            {"padding", padding_text(s)},
            {"activation", activation_name(s.activation)},
            {"init", init_kind_name(s.init)},
            {"bias", s.bias ? "true" : "false"}};
}

}  // namespace

extern const LayerKind kConv2dKind{"conv2d", read, fields, [](const LayerSpec& s) -> std::unique_ptr<Layer> {
                                       return std::make_unique<Conv2d>(s);
                                   }};

}  // namespace mirrored
