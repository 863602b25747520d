// The layers at the two ends of a language model:
// - embedding: token ids [t] -> their rows of a table [vocab, dim] (torch.nn.Embedding), a sequence
//   [t, dim]. The model's input stays f32 (ids are exact integers) whatever the precision.
// - position_embedding: adds a learned row per position, table [max_len, c] (GPT-2's wpe).
// - lm_head: each position's [c] -> [vocab] scores, x W^T without bias; with tie_weights (the
//   default) W is the token embedding's table (GPT-2's weight tying), so its gradient gathers both.
#include "kernels/ops/embedding.h"
#include "kernels/ops/flat.h"
#include "mirrored/layers/activations.h"
#include "mirrored/layers/layer.h"
#include "kernels/ops/activation.h"
#include "kernels/ops/gemm.h"

namespace mirrored {

namespace {

InitArgs gpt2_init() {
    InitArgs a;
    a.kind = InitKind::gpt2_normal;
    return a;
}

struct EmbeddingOptions final : OptionsOf<EmbeddingOptions> {
    int vocab = 0, dim = 0;
    Fields fields() const override { return {{"vocab", std::to_string(vocab)}, {"dim", std::to_string(dim)}}; }
    bool operator==(const EmbeddingOptions&) const = default;
};

class Embedding final : public Layer {
public:
    explicit Embedding(const LayerSpec& s) : Layer(s), o_(spec_.get<EmbeddingOptions>()) {}

    void declare(Builder& b) override {
        if (in_.image || in_.positions() != 1)
            fail("embedding reads a vector of token ids (model.input_shape: [context]), got " + in_.str());
        w_ = b.param(name_ + ".weight", {o_.vocab, o_.dim}, gpt2_init());
        b.set_token_embedding(w_);
        builder_ = &b;
        slot_ = b.new_slot();
        out_buf_ = b.act_buffer(slot_, size_t(in_.c) * size_t(o_.dim));
        out_ = Shape::sequence(in_.c, o_.dim);
    }
    void place(const std::vector<TensorRef>& refs) override {
        w_off_ = refs[size_t(w_)].offset;
        tied_ = builder_->tensors()[size_t(w_)].tied;
    }

    const void* forward(Pass& p, const void* x) const override {
        p.acts->input(slot_) = x;
        void* y = p.acts->act(slot_, out_buf_);
        embedding_forward(*p.dev, p.stream, p.rows * in_.c, o_.vocab, o_.dim, static_cast<const float*>(x),
                          p.weight(w_off_), y);
        return y;
    }

    void backward(Pass& p, void* dy, void* dx) const override {
        (void)dx;  // ids have no gradient
        float* dw = p.grad(w_off_);
        if (!dw) return;  // frozen
        // A tied head wrote (or added to) this gradient already in its backward, which runs first.
        if (!tied_ && !p.accumulate) fill_floats(*p.dev, p.stream, size_t(o_.vocab) * size_t(o_.dim), 0.0f, dw);
        embedding_backward(*p.dev, p.stream, p.rows * in_.c, o_.vocab, o_.dim,
                           static_cast<const float*>(p.acts->input(slot_)), dy, dw);
    }

    bool has_params() const override { return true; }
    std::string detail() const override { return tied_ ? "tied to the head" : ""; }

private:
    const EmbeddingOptions& o_;
    const Builder* builder_ = nullptr;
    int w_ = -1, slot_ = -1, out_buf_ = -1;
    size_t w_off_ = 0;
    bool tied_ = false;
};

OptionsPtr read_embedding(SpecReader& r, const std::string& p) {
    auto o = std::make_shared<EmbeddingOptions>();
    o->vocab = int(r.integer(p + ".vocab", 0, 1, 1 << 24));
    if (o->vocab == 0) r.fail(p + ".vocab", "required for an embedding: the vocabulary size (data.vocab)");
    o->dim = int(r.integer(p + ".dim", 0, 1, 1 << 16));
    if (o->dim == 0) r.fail(p + ".dim", "required for an embedding: the width of each token's vector");
    return o;
}

struct PositionOptions final : OptionsOf<PositionOptions> {
    int max_len = 0;
    Fields fields() const override { return {{"max_len", std::to_string(max_len)}}; }
    bool operator==(const PositionOptions&) const = default;
};

class PositionEmbedding final : public Layer {
public:
    explicit PositionEmbedding(const LayerSpec& s) : Layer(s), max_len_(spec_.get<PositionOptions>().max_len) {}

    void declare(Builder& b) override {
        if (in_.image) fail("position_embedding needs a sequence [t, c], got an image " + in_.str());
        if (in_.positions() > max_len_)
            fail("the sequence has " + std::to_string(in_.positions()) + " positions, more than max_len " +
                 std::to_string(max_len_));
        w_ = b.param(name_ + ".weight", {max_len_, in_.c}, gpt2_init());
        slot_ = b.new_slot();
        out_buf_ = b.act_buffer(slot_, in_.size());
    }
    void place(const std::vector<TensorRef>& refs) override { w_off_ = refs[size_t(w_)].offset; }

    // y = x + the table's first t rows, every sample: a bias over the sample's [t * c] values;
    // decoding one position, its row.
    const void* forward(Pass& p, const void* x) const override {
        void* y = p.acts->act(slot_, out_buf_);
        const int first = p.decode ? p.decode->position : 0;
        if (first + in_.positions() > max_len_)
            throw std::logic_error("position_embedding: position " + std::to_string(first) + " past max_len");
        p.dev->copy_on_device(p.stream, y, x, p.dev->act_bytes(size_t(p.rows) * in_.size()));
        bias_activation(*p.dev, p.stream, Activation::none, p.rows, int(in_.size()),
                        p.params + w_off_ + size_t(first) * in_.c, y, y);
        return y;
    }

    void backward(Pass& p, void* dy, void* dx) const override {
        if (float* dw = p.grad(w_off_)) {  // else frozen
            bias_gradient(*p.dev, p.stream, p.rows, int(in_.size()), dy, dw, p.accumulate);
            if (!p.accumulate && in_.positions() < max_len_)  // the rows no position of these sequences reached
                fill_floats(*p.dev, p.stream, size_t(max_len_ - in_.positions()) * in_.c, 0.0f, dw + in_.size());
        }
        if (dx) p.dev->copy_on_device(p.stream, dx, dy, p.dev->act_bytes(size_t(p.rows) * in_.size()));
    }

    bool has_params() const override { return true; }

private:
    int max_len_;
    int w_ = -1, slot_ = -1, out_buf_ = -1;
    size_t w_off_ = 0;
};

OptionsPtr read_position(SpecReader& r, const std::string& p) {
    auto o = std::make_shared<PositionOptions>();
    o->max_len = int(r.integer(p + ".max_len", 0, 1, 1 << 16));
    if (o->max_len == 0) r.fail(p + ".max_len", "required for a position_embedding: the longest sequence");
    return o;
}

struct HeadOptions final : OptionsOf<HeadOptions> {
    bool tie = true;
    int units = 0;  // untied: the vocabulary
    Fields fields() const override {
        return {{"tie_weights", tie ? "true" : "false"}, {"units", std::to_string(units)}};
    }
    bool operator==(const HeadOptions&) const = default;
};

class LmHead final : public Layer {
public:
    explicit LmHead(const LayerSpec& s) : Layer(s), o_(spec_.get<HeadOptions>()) {}

    void declare(Builder& b) override {
        if (in_.image) fail("lm_head needs a sequence [t, c], got an image " + in_.str());
        int vocab = o_.units;
        if (o_.tie) {
            w_ = b.token_embedding();
            if (w_ < 0) fail("tie_weights needs an embedding layer before the head (or tie_weights: false, units: V)");
            const std::vector<int>& shape = b.tensors()[size_t(w_)].shape;
            if (shape[1] != in_.c)
                fail("tie_weights: the embedding is " + std::to_string(shape[1]) + " wide, the head's input " +
                     std::to_string(in_.c) + "; they must match");
            vocab = shape[0];
            b.tie(w_);
        } else {
            if (vocab == 0) fail("an untied head needs units: the vocabulary size");
            w_ = b.param(name_ + ".weight", {vocab, in_.c}, gpt2_init());
            block_rows_ = b.split_rows(w_, size_t(in_.c));
        }
        slot_ = b.new_slot();
        out_buf_ = b.act_buffer(slot_, size_t(in_.positions()) * size_t(vocab));
        out_ = Shape::sequence(in_.positions(), vocab);
    }
    void place(const std::vector<TensorRef>& refs) override { w_off_ = refs[size_t(w_)].offset; }

    const void* forward(Pass& p, const void* x) const override {
        p.acts->input(slot_) = x;
        void* y = p.acts->act(slot_, out_buf_);
        dense_forward(*p.dev, p.stream, Activation::none, p.rows * in_.positions(), out_.c, in_.c, x, p.weight(w_off_),
                      nullptr, y, y, p.types(p.vt));
        return y;
    }

    void backward(Pass& p, void* dy, void* dx) const override {
        const int rows = p.rows * in_.positions(), vocab = out_.c, c = in_.c;
        if (block_rows_ > 0 && block_rows_ < vocab)  // Builder::split_rows
            weight_grad_by_blocks(p, rows, vocab, c, dy, p.acts->input(slot_), w_off_, block_rows_);
        else if (float* dw = p.grad(w_off_))  // else frozen
            dense_weight_grad(*p.dev, p.stream, rows, vocab, c, dy, p.acts->input(slot_), dw, nullptr, p.accumulate,
                              p.types(DType::f32));
        if (dx)
            gemm(*p.dev, p.stream, false, false, rows, c, vocab, 1.0f, dy, vocab, p.weight(w_off_), c, 0.0f, dx, c,
                 p.types(p.vt));
    }

    bool has_params() const override { return true; }
    double forward_flops() const override { return 2.0 * in_.c * out_.c * in_.positions(); }
    std::string detail() const override { return o_.tie ? "tied to the embedding" : ""; }

private:
    const HeadOptions& o_;
    int w_ = -1, slot_ = -1, out_buf_ = -1, block_rows_ = 0;
    size_t w_off_ = 0;
};

OptionsPtr read_head(SpecReader& r, const std::string& p) {
    auto o = std::make_shared<HeadOptions>();
    o->tie = r.boolean(p + ".tie_weights", true);
    o->units = int(r.integer(p + ".units", 0, 0, 1 << 24));
    if (o->tie && o->units) r.fail(p + ".units", "a tied head takes its size from the embedding; drop units");
    return o;
}

}  // namespace

extern const LayerKind kEmbeddingKind{"embedding", read_embedding, create_layer<Embedding>, /*container=*/false,
                                      /*reads_token_ids=*/true};
extern const LayerKind kPositionEmbeddingKind{"position_embedding", read_position, create_layer<PositionEmbedding>};
extern const LayerKind kLmHeadKind{"lm_head", read_head, create_layer<LmHead>};

}  // namespace mirrored
