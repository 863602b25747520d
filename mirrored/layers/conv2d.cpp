// conv2d: y = act(conv(x, W) + b) over NHWC images, as torch.nn.Conv2d (weight [out, in, kh, kw])
// followed by the activation. im2col + GEMM: the columns [n*oh*ow, in*kh*kw] times W^T give the
// output NHWC directly, one GEMM for the whole batch on GPUs, one per cache-sized block of images
// on CPUs (Device::column_block_bytes); a 1x1 convolution with stride 1 and no padding is a plain
// GEMM on the input. The columns live in the shared scratch and are made again in backward rather
// than kept per layer. Where the device prefers pixel-major columns (the CPU: a row is whole
// pixels copied, not a transpose), the layer multiplies by the weights permuted to
// [out, kh, kw, in] and permutes their gradient back; the parameters, checkpoints and exports
// keep PyTorch's order. There the forward product also takes the weights transposed,
// [kh, kw, in, out], so that it multiplies untransposed operands: with a convolution's few
// outputs and many rows the CPU's GEMMs run that 1.25-1.9x faster than cols . W^T. Where the
// device multiplies straight from the images (conv_forward, conv_weight_grad,
// conv_input_grad: CPUs with the JIT kernels), no columns are made for what it takes.
#include <algorithm>

#include "kernels/ops/conv.h"
#include "mirrored/layers/activations.h"
#include "mirrored/layers/layer.h"
#include "kernels/ops/flat.h"
#include "kernels/ops/activation.h"
#include "kernels/ops/gemm.h"

namespace mirrored {

namespace {

struct Conv2dOptions final : OptionsOf<Conv2dOptions> {
    int filters = 0;
    WindowKeys window;
    Activation activation = Activation::none;
    InitKind init = InitKind::he_uniform;
    bool bias = true;
    Fields fields() const override {
        return {{"filters", std::to_string(filters)},
                {"kernel_size", std::to_string(window.kernel)},
                {"stride", std::to_string(window.stride)},
                {"padding", window.padding_text()},
                {"activation", activation_name(activation)},
                {"init", init_kind_name(init)},
                {"bias", bias ? "true" : "false"}};
    }
    bool operator==(const Conv2dOptions&) const = default;
};

class Conv2d final : public Layer {
public:
    explicit Conv2d(const LayerSpec& s) : Layer(s), o_(spec_.get<Conv2dOptions>()) {}

    void declare(Builder& b) override {
        if (!in_.image) fail("conv2d needs an image input [height, width, channels], got " + in_.str());
        const int k = o_.window.kernel, pad = o_.window.pad();
        g_ = Window2d{0, in_.h, in_.w, in_.c, k, k, o_.window.stride, o_.window.stride, pad, pad};
        if (in_.h + 2 * pad < k || in_.w + 2 * pad < k)
            fail("a " + std::to_string(k) + "x" + std::to_string(k) + " kernel does not fit the input " + in_.str() +
                 " with padding " + std::to_string(pad));
        direct_ = k == 1 && o_.window.stride == 1 && pad == 0;
        const int K = in_.c * k * k, F = o_.filters;
        InitArgs wi;
        wi.kind = o_.init;
        wi.fan_in = K;  // PyTorch's fans for a conv: in x kh x kw, out x kh x kw
        wi.fan_out = F * k * k;
        w_ = b.param(name_ + ".weight", {F, in_.c, k, k}, wi);
        if (o_.bias) b_ = b.param(name_ + ".bias", {F}, InitArgs{});
        if (b.frozen(w_) || (b_ >= 0 && b.frozen(b_))) fail("model.freeze: conv2d's tensors cannot be frozen");
        out_ = Shape::picture(g_.oh(), g_.ow(), F);
        slot_ = b.new_slot();
        out_buf_ = b.act_buffer(slot_, out_.size());
        // As dense: GELU's derivative needs the pre-activation, ReLU's reads the output.
        if (keeps_preactivation(o_.activation)) z_buf_ = b.act_buffer(slot_, out_.size());
        if (!direct_) {
            b.scratch(column_elements());                       // a block of images' columns, or their gradient
            permuted_ = b.f32_buffer(slot_, 0, size_t(F) * K);  // the weights or their gradient, pixel-major
            permuted_grad_ = b.f32_buffer(slot_, 0, size_t(F) * K);
            transposed_ = b.f32_buffer(slot_, 0, size_t(F) * K);  // [K, F]: the forward product's
        }
    }
    void place(const std::vector<TensorRef>& refs) override {
        w_off_ = refs[size_t(w_)].offset;
        if (b_ >= 0) b_off_ = refs[size_t(b_)].offset;
    }

    bool pixel_major(const Pass& p) const { return !direct_ && p.dev->pixel_major_columns(); }

    // The whole batch's window, pixel-major (the product without columns).
    Window2d batch_window(const Pass& p) const {
        Window2d g = g_;
        g.n = p.rows;
        g.pixel_major = true;
        return g;
    }

    // Images per block of columns: the whole batch (one product: GPUs), or as many as keep a
    // block's columns within the device's cache budget (CPUs: a batch's columns stream through
    // memory, a block's stay in cache between im2col and the products).
    int block_images(const Pass& p) const {
        if (direct_) return std::max(p.rows, 1);
        return Device::column_block_images(p.dev->act_bytes(column_elements()), p.dev->column_block_bytes(), p.rows);
    }
    size_t column_elements() const { return size_t(g_.oh()) * g_.ow() * in_.c * g_.kh * g_.kw; }  // an image's

    // Images [first, first + count) of the batch.
    struct Block {
        int first, count;
    };
    template <typename F>
    void for_each_block(const Pass& p, F&& f) const {
        const int step = block_images(p);
        for (int first = 0; first < p.rows; first += step) f(Block{first, std::min(step, p.rows - first)});
        if (p.rows == 0) f(Block{0, 0});
    }

    // Element offsets of a block's input and output rows.
    size_t in_at(const Block& b) const { return size_t(b.first) * in_.h * in_.w * in_.c; }
    size_t out_at(const Block& b) const { return size_t(b.first) * out_.h * out_.w * out_.c; }
    static const void* at(const Pass& p, const void* base, size_t elements) {
        return static_cast<const char*>(base) + p.dev->act_bytes(elements);
    }
    static void* at(const Pass& p, void* base, size_t elements) {
        return static_cast<char*>(base) + p.dev->act_bytes(elements);
    }

    // The columns of a block of x in the scratch (or x itself for a direct 1x1).
    const void* columns(Pass& p, const void* x, const Block& b) const {
        if (direct_) return at(p, x, in_at(b));
        Window2d g = g_;
        g.n = b.count;
        g.pixel_major = pixel_major(p);
        im2col(*p.dev, p.stream, g, at(p, x, in_at(b)), p.acts->scratch());
        return p.acts->scratch();
    }

    // Pixel-major: the weights in the columns' order, [F, kh, kw, C] (kept for backward), and
    // that transposed, [kh, kw, C, F], which is returned.
    const float* permute_weights(Pass& p) const {
        float* w = p.acts->f32(slot_, permuted_);
        float* wt = p.acts->f32(slot_, transposed_);
        nhwc_to_nchw(*p.dev, p.stream, out_.c, g_.kh, g_.kw, in_.c, p.weight(w_off_), w, true);
        nhwc_to_nchw(*p.dev, p.stream, 1, out_.c, 1, in_.c * g_.kh * g_.kw, w, wt, false);  // [F, K] -> [K, F]
        return wt;
    }

    const void* forward(Pass& p, const void* x) const override {
        const int F = out_.c, K = in_.c * g_.kh * g_.kw;
        p.acts->input(slot_) = x;
        void* y = p.acts->act(slot_, out_buf_);
        void* z = z_buf_ >= 0 ? p.acts->act(slot_, z_buf_) : y;
        const float* bias = b_ >= 0 ? p.params + b_off_ : nullptr;
        if (pixel_major(p)) {  // z[M, F] = cols[M, K] . Wt[K, F] + b, y = act(z)
            const float* wt = permute_weights(p);
            if (conv_forward(*p.dev, p.stream, batch_window(p), x, wt, F, z, p.types(p.vt))) {  // no columns
                if (bias || o_.activation != Activation::none)
                    bias_activation(*p.dev, p.stream, o_.activation, p.rows * out_.h * out_.w, F, bias, z, y);
                return y;
            }
            for_each_block(p, [&](const Block& b) {
                const int rows = b.count * out_.h * out_.w;
                void *zb = at(p, z, out_at(b)), *yb = at(p, y, out_at(b));
                gemm(*p.dev, p.stream, false, false, rows, F, K, 1.0f, columns(p, x, b), K, wt, F, 0.0f, zb, F,
                     p.types(p.vt));
                if (bias || o_.activation != Activation::none)
                    bias_activation(*p.dev, p.stream, o_.activation, rows, F, bias, zb, yb);
            });
            return y;
        }
        // z[M, F] = cols[M, K] . W[F, K]^T + b, y = act(z): a dense layer over the columns
        for_each_block(p, [&](const Block& b) {
            dense_forward(*p.dev, p.stream, o_.activation, b.count * out_.h * out_.w, F, K, columns(p, x, b),
                          p.weight(w_off_), bias, at(p, z, out_at(b)), at(p, y, out_at(b)), p.types(p.vt));
        });
        return y;
    }

    void backward(Pass& p, void* dy, void* dx) const override {
        const int M = p.rows * out_.h * out_.w, F = out_.c, K = in_.c * g_.kh * g_.kw;
        if (o_.activation != Activation::none) {
            const void* z = p.acts->act(slot_, z_buf_ >= 0 ? z_buf_ : out_buf_);
            activation_backward(*p.dev, p.stream, o_.activation, size_t(M) * F, z, dy, dy);
        }
        float* db = b_ >= 0 ? p.grad(b_off_) : nullptr;
        const bool permuted = pixel_major(p);
        // dW[F, K] (+)= dz[M, F]^T . cols[M, K], block by block (the permuted dW into the layer's
        // buffer, then back); db (+)= column sums of dz
        float* dw = permuted ? p.acts->f32(slot_, permuted_grad_) : p.grad(w_off_);
        const bool one_block = block_images(p) >= p.rows;
        if (db && (permuted || !one_block)) bias_gradient(*p.dev, p.stream, M, F, dy, db, p.accumulate);
        const void* w = permuted ? p.acts->f32(slot_, permuted_) : p.weight(w_off_);  // as forward left it
        // Pixel-major: the device may take either product without columns (conv_weight_grad,
        // conv_input_grad); the blocks below make columns only for what it did not take.
        bool dw_done = false, dx_done = !dx;
        if (permuted) {
            const Window2d g = batch_window(p);
            dw_done = conv_weight_grad(*p.dev, p.stream, g, p.acts->input(slot_), dy, F, dw);
            if (dx) dx_done = conv_input_grad(*p.dev, p.stream, g, dy, static_cast<const float*>(w), F, dx);
        }
        if (!dw_done || !dx_done)
            for_each_block(p, [&](const Block& b) {
                const int rows = b.count * out_.h * out_.w;
                const void* dz = at(p, dy, out_at(b));
                const bool accumulate = b.first > 0 || (!permuted && p.accumulate);
                if (!dw_done)
                    dense_weight_grad(*p.dev, p.stream, rows, F, K, dz, columns(p, p.acts->input(slot_), b), dw,
                                      permuted || !one_block ? nullptr : db, accumulate, p.types(DType::f32));
                if (dx_done) return;
                if (direct_) {  // dx[M, C] = dz[M, F] . W[F, C]
                    gemm(*p.dev, p.stream, false, false, rows, K, F, 1.0f, dz, F, w, K, 0.0f, at(p, dx, in_at(b)), K,
                         p.types(p.vt));
                    return;
                }
                // dcols[M, K] = dz[M, F] . W[F, K], into the scratch (the block's columns are done)
                void* dcols = p.acts->scratch();
                gemm(*p.dev, p.stream, false, false, rows, K, F, 1.0f, dz, F, w, K, 0.0f, dcols, K, p.types(p.vt));
                Window2d g = g_;
                g.n = b.count;
                g.pixel_major = permuted;
                col2im(*p.dev, p.stream, g, dcols, at(p, dx, in_at(b)));
            });
        if (permuted) unpermute_weight_grad(p);
    }

    // dW (+)= the pixel-major gradient back in [F, C, kh, kw] order.
    void unpermute_weight_grad(Pass& p) const {
        const float* g = p.acts->f32(slot_, permuted_grad_);
        float* dw = p.grad(w_off_);
        const int F = out_.c, K = in_.c * g_.kh * g_.kw;
        if (!p.accumulate) {
            nhwc_to_nchw(*p.dev, p.stream, F, g_.kh, g_.kw, in_.c, g, dw, false);
            return;
        }
        float* tmp = p.acts->f32(slot_, permuted_);  // the permuted weights are no longer needed
        nhwc_to_nchw(*p.dev, p.stream, F, g_.kh, g_.kw, in_.c, g, tmp, false);
        axpy_floats(*p.dev, p.stream, size_t(F) * K, 1.0f, tmp, dw);
    }

    bool has_params() const override { return true; }
    double forward_flops() const override { return 2.0 * out_.h * out_.w * out_.c * in_.c * g_.kh * g_.kw; }
    std::string detail() const override {
        return std::to_string(g_.kh) + "x" + std::to_string(g_.kw) + "/" + std::to_string(g_.sh) + " " +
               activation_name(o_.activation);
    }

private:
    const Conv2dOptions& o_;
    Window2d g_;
    bool direct_ = false;
    int w_ = -1, b_ = -1, slot_ = -1, out_buf_ = -1, z_buf_ = -1, permuted_ = -1, permuted_grad_ = -1, transposed_ = -1;
    size_t w_off_ = 0, b_off_ = 0;
};

OptionsPtr read(SpecReader& r, const std::string& p) {
    auto o = std::make_shared<Conv2dOptions>();
    o->filters = int(r.integer(p + ".filters", 0, 1, 1 << 16));
    if (o->filters == 0) r.fail(p + ".filters", "required for a conv2d layer: a positive integer");
    o->window.kernel = int(r.integer(p + ".kernel_size", 3, 1, 15));
    o->window.stride = int(r.integer(p + ".stride", 1, 1, 15));
    read_padding(r, p + ".padding", o->window);
    o->activation = read_activation(r, p + ".activation");
    o->init = read_init(r, p + ".init", o->activation);
    o->bias = r.boolean(p + ".bias", true);
    return o;
}

}  // namespace

extern const LayerKind kConv2dKind{"conv2d", read, create_layer<Conv2d>};

}  // namespace mirrored
