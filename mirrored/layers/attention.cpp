// attention: multi-head causal self-attention over a sequence [t, c] (GPT-2's CausalSelfAttention):
// qkv = x W_attn^T + b_attn (one product for the three, [t, 3c]: q, k, v side by side, head h in
// columns h*d .. h*d + d of each, d = c / heads); per head softmax(q k^T / sqrt(d)) over the
// positions up to each one; the heads' outputs side by side, then y = a W_proj^T + b_proj.
// Tensors as nanoGPT names them: c_attn.weight [3c, c], c_attn.bias, c_proj.weight [c, c], c_proj.bias.
//
// Llama's attention is the same layer with `kv_heads` (grouped-query attention: fewer key/value
// heads than query heads, kernels/ops/attention.h's AttentionHeads; qkv then [t, (heads + 2 kv) d]),
// `rope_theta` (rotary position embeddings on q and k after the projection, Hugging Face's
// rotate-half, kernels/ops/rope.h), `bias: false`, and `names: llama` (self_attn.qkv_proj - q_proj,
// k_proj and v_proj stacked by rows - and o_proj).
//
// `dropout` drops attention probabilities in training (nanoGPT's attn_dropout), the masks a pure
// function of (seed, layer, step, global row) as the dropout layer's.
//
// The unfused path (the default): the [t, t] probabilities of every head are kept for backward,
// and the products run as strided-batched GEMMs over the samples, one call per head (on CPUs per
// block of samples, and in backward per block of queries: block() and query_block()). `fused: true`
// runs attention_forward/backward (kernels/ops/attention.h) instead: an online softmax that keeps one log-sum-exp
// per row, not the probabilities (memory linear in t, the probabilities recomputed in backward);
// heads at most 128 wide, no probability dropout.
#include <algorithm>
#include <cmath>

#include "mirrored/util.h"

#include "kernels/ops/attention.h"
#include "kernels/ops/dropout.h"
#include "kernels/ops/gemm.h"
#include "kernels/ops/rope.h"
#include "mirrored/layers/activations.h"
#include "mirrored/layers/layer.h"
#include "mirrored/layers/lora.h"
#include "mirrored/layers/rope_scaling.h"
#include "kernels/ops/activation.h"

namespace mirrored {

namespace {

struct AttentionOptions final : OptionsOf<AttentionOptions> {
    int heads = 0;
    int kv_heads = 0;  // 0: as many as heads
    float dropout = 0.0f;
    bool fused = false;
    float rope_theta = 0.0f;  // 0: no rotary embeddings
    RopeScaling rope_scaling;
    bool bias = true;
    bool out_bias = true;  // the output projection's (Qwen2: q, k and v have biases, o_proj none)
    bool llama_names = false;
    Fields fields() const override {
        Fields f = {{"heads", std::to_string(heads)}};
        // written only when not their defaults, so older checkpoints still match
        if (kv_heads && kv_heads != heads) f.push_back({"kv_heads", std::to_string(kv_heads)});
        if (dropout > 0) f.push_back({"dropout", decimal_text(dropout)});
        if (fused) f.push_back({"fused", "true"});
        if (rope_theta > 0) f.push_back({"rope_theta", decimal_text(rope_theta)});
        add_rope_scaling_fields(f, rope_scaling);
        if (!bias) f.push_back({"bias", "false"});
        if (out_bias != bias) f.push_back({"out_bias", out_bias ? "true" : "false"});
        if (llama_names) f.push_back({"names", "llama"});
        return f;
    }
    bool operator==(const AttentionOptions&) const = default;
};

class Attention final : public Layer {
public:
    explicit Attention(const LayerSpec& s)
        : Layer(s), o_(spec_.get<AttentionOptions>()), heads_(o_.heads), dropout_(o_.dropout), fused_(o_.fused) {}

    void declare(Builder& b) override {
        if (in_.image) fail("attention needs a sequence [t, c], got an image " + in_.str());
        const int c = in_.c;
        if (c % heads_) fail("heads: " + std::to_string(heads_) + " does not divide the width " + std::to_string(c));
        a_ = AttentionHeads{heads_, o_.kv_heads ? o_.kv_heads : heads_, c / heads_};
        if (heads_ % a_.kv_heads)
            fail("kv_heads: " + std::to_string(a_.kv_heads) + " does not divide heads: " + std::to_string(heads_));
        if (o_.rope_theta > 0 && (a_.d % 2 || a_.d > kMaxRopeHeadWidth))
            fail("rotary embeddings need heads of an even width up to " + std::to_string(kMaxRopeHeadWidth) +
                 "; these are " + std::to_string(a_.d));
        const int w = int(a_.qkv_width());
        InitArgs wi;
        wi.kind = InitKind::gpt2_normal;
        const std::string qkv = name_ + (o_.llama_names ? ".qkv_proj" : ".c_attn"),
                          proj = name_ + (o_.llama_names ? ".o_proj" : ".c_proj");
        attn_w_ = b.param(qkv + ".weight", {w, c}, wi);
        if (o_.bias) attn_b_ = b.param(qkv + ".bias", {w}, InitArgs{});
        proj_w_ = b.param(proj + ".weight", {c, c}, wi);
        if (o_.out_bias) proj_b_ = b.param(proj + ".bias", {c}, InitArgs{});
        const size_t t = size_t(in_.positions()), probs = size_t(heads_) * t * t;
        slot_ = b.new_slot();
        lora_qkv_.declare(b, qkv + ".weight", c, w, slot_, int(t));
        lora_out_.declare(b, proj + ".weight", c, c, slot_, int(t), 1);
        qkv_ = b.act_buffer(slot_, t * size_t(w));
        heads_out_ = b.act_buffer(slot_, t * c);
        proj_out_ = b.act_buffer(slot_, t * c);
        dqkv_ = b.act_buffer(slot_, t * size_t(w));
        dheads_ = b.act_buffer(slot_, t * c);
        if (fused_) {
            if (d() > kMaxFusedHeadWidth)
                fail("fused attention takes heads at most " + std::to_string(kMaxFusedHeadWidth) + " wide; these are " +
                     std::to_string(d()) + " (more heads, or fused: false)");
            if (dropout_ > 0) fail("fused attention drops no probabilities: dropout 0, or fused: false");
            lse_ = b.f32_buffer(slot_, size_t(heads_) * t);
            delta_ = b.f32_buffer(slot_, size_t(heads_) * t);
            return;
        }
        probs_ = b.act_buffer(slot_, probs);
        dprobs_ = b.act_buffer(slot_, probs);
        if (dropout_ > 0) dropped_ = b.act_buffer(slot_, probs);  // kept beside probs: backward needs both
    }
    void place(const std::vector<TensorRef>& refs) override {
        attn_w_off_ = refs[size_t(attn_w_)].offset;
        proj_w_off_ = refs[size_t(proj_w_)].offset;
        if (o_.bias) attn_b_off_ = refs[size_t(attn_b_)].offset;
        if (o_.out_bias) proj_b_off_ = refs[size_t(proj_b_)].offset;
        lora_qkv_.place(refs);
        lora_out_.place(refs);
    }

    const void* forward(Pass& p, const void* x) const override {
        if (p.decode) return decode(p, x);
        const int t = in_.positions(), c = in_.c, rows = p.rows * t;
        const Buffers B = buffers(p);
        const int w = int(a_.qkv_width());
        p.acts->input(slot_) = x;
        project_qkv(p, rows, x, B.qkv);
        if (o_.rope_theta > 0) rope_rotate(*p.dev, p.stream, rope(p), false, B.qkv);
        if (fused_) {
            attention_forward(*p.dev, p.stream, p.rows, t, a_, scale(), B.qkv, B.heads, p.acts->f32(slot_, lse_));
            project_out(p, rows, B.heads, B.out);
            return B.out;
        }
        for (int s0 = 0; s0 < p.rows; s0 += block(p)) {  // a block of samples at a time
            const int n = std::min(block(p), p.rows - s0);
            const Buffers S = samples_at(p, B, s0);
            for (int h = 0; h < heads_; ++h)  // scores = q k^T
                batched(p, n, false, true, t, t, d(), at(p, S.qkv, q(h)), w, size_t(t) * w, at(p, S.qkv, k(h)), w,
                        size_t(t) * w, at(p, S.probs, cell(h, 0, 0)), t, tt());
            causal_softmax(*p.dev, p.stream, n * heads_, t, scale(), S.probs, S.probs);
            if (drops(p)) dropout_forward(*p.dev, p.stream, dropout_args(p, s0), n, int(tt()), S.probs, S.mixed);
            for (int h = 0; h < heads_; ++h)  // a = probs v
                batched(p, n, false, false, t, d(), t, at(p, S.mixed, cell(h, 0, 0)), t, tt(), at(p, S.qkv, v(h)), w,
                        size_t(t) * w, at(p, S.heads, size_t(h) * d()), c, size_t(t) * c);
        }
        project_out(p, rows, B.heads, B.out);
        return B.out;
    }

    void backward(Pass& p, void* dy, void* dx) const override {
        const int t = in_.positions(), c = in_.c, rows = p.rows * t, w = int(a_.qkv_width());
        const Buffers B = buffers(p);
        void* dqkv = p.acts->act(slot_, dqkv_);
        void* dheads = p.acts->act(slot_, dheads_);
        weight_grad(p, rows, c, c, dy, B.heads, proj_w_off_, proj_b_off_);
        gemm(*p.dev, p.stream, false, false, rows, c, c, 1.0f, dy, c, p.weight(proj_w_off_), c, 0.0f, dheads, c,
             p.types(p.vt));
        if (!lora_out_.empty()) lora_out_.backward(p, rows, B.heads, dy, dheads);
        if (fused_) {
            attention_backward(*p.dev, p.stream, p.rows, t, a_, scale(), B.qkv, B.heads, dheads,
                               p.acts->f32(slot_, lse_), p.acts->f32(slot_, delta_), dqkv);
            return input_grads(p, dqkv, dx);
        }
        void* dprobs_all = p.acts->act(slot_, dprobs_);
        const int qb = query_block(p);
        for (int s0 = 0; s0 < p.rows; s0 += block(p)) {
            const int n = std::min(block(p), p.rows - s0);
            const Buffers S = samples_at(p, B, s0);
            void* dprobs = at(p, dprobs_all, size_t(s0) * tt());
            void* da = at(p, dheads, size_t(s0) * t * c);
            void* dqkv_s = at(p, dqkv, size_t(s0) * t * w);
            const size_t sq = size_t(t) * w, sa = size_t(t) * c;  // a sample's qkv, heads
            for (int h = 0; h < heads_; ++h)
                for (int b0 = 0; b0 < t; b0 += qb) {
                    const int b1 = std::min(t, b0 + qb);
                    // dprobs = da v^T for queries b0..b1 (keys 0..b1)
                    batched(p, n, false, true, b1 - b0, b1, d(), at(p, da, size_t(b0) * c + size_t(h) * d()), c, sa,
                            at(p, S.qkv, v(h)), w, sq, at(p, dprobs, cell(h, b0, 0)), t, tt());
                    // dv = probs^T da for keys b0..b1 (queries b0..t), summed over a group's heads
                    batched(p, n, true, false, b1 - b0, d(), t - b0, at(p, S.mixed, cell(h, b0, b0)), t, tt(),
                            at(p, da, size_t(b0) * c + size_t(h) * d()), c, sa, at(p, dqkv_s, row(b0) + v(h)), w, sq,
                            group_beta(h));
                }
            if (drops(p))  // element-wise, so in place
                dropout_backward(*p.dev, p.stream, dropout_args(p, s0), n, int(tt()), dprobs, dprobs);
            causal_softmax_backward(*p.dev, p.stream, n * heads_, t, scale(), S.probs, dprobs, dprobs);
            for (int h = 0; h < heads_; ++h)
                for (int b0 = 0; b0 < t; b0 += qb) {  // the scale is in dscores
                    const int b1 = std::min(t, b0 + qb);
                    // dq = dscores k for queries b0..b1
                    batched(p, n, false, false, b1 - b0, d(), b1, at(p, dprobs, cell(h, b0, 0)), t, tt(),
                            at(p, S.qkv, k(h)), w, sq, at(p, dqkv_s, row(b0) + q(h)), w, sq);
                    // dk = dscores^T q for keys b0..b1, summed over a group's heads
                    batched(p, n, true, false, b1 - b0, d(), t - b0, at(p, dprobs, cell(h, b0, b0)), t, tt(),
                            at(p, S.qkv, row(b0) + q(h)), w, sq, at(p, dqkv_s, row(b0) + k(h)), w, sq, group_beta(h));
                }
        }
        input_grads(p, dqkv, dx);
    }

    bool has_params() const override { return true; }
    // the four products of the projections and the two of attention (scores, then the mix)
    double forward_flops() const override {
        const double t = in_.positions(), c = in_.c;
        return 2.0 * t * c * (double(a_.qkv_width()) + c) + 2.0 * 2.0 * t * t * c + lora_qkv_.forward_flops(int(t)) +
               lora_out_.forward_flops(int(t));
    }
    std::string detail() const override {
        std::string s = std::to_string(heads_) + " heads";
        if (a_.kv_heads != heads_) s += " (" + std::to_string(a_.kv_heads) + " key/value)";
        if (o_.rope_theta > 0) s += ", rope " + decimal_text(o_.rope_theta);
        return s + (fused_ ? ", fused" : "") + (dropout_ > 0 ? ", dropout " + decimal_text(dropout_) : "");
    }

private:
    // One new position of each sequence (Pass::decode, a model built for sequences of one): its q,
    // k, v row appended to the sequence's part of this layer's cache, its query attending over the
    // rows so far. The projections take every sequence at once.
    const void* decode(Pass& p, const void* x) const {
        const int w = int(a_.qkv_width()), c = in_.c, position = p.decode->position;
        if (p.rows != p.decode->sequences() || in_.positions() != 1 || position < 0 || position >= p.decode->capacity())
            throw std::logic_error("attention: a decoding pass is one position of each sequence within the cache");
        const Buffers B = buffers(p);
        project_qkv(p, p.rows, x, B.qkv);
        if (o_.rope_theta > 0)
            rope_rotate(*p.dev, p.stream,
                        RopeShape{p.rows, 1, position, w, a_.heads + a_.kv_heads, a_.d, o_.rope_theta, o_.rope_scaling},
                        false, B.qkv);
        void* cache = p.decode->cache(slot_, p.dev->act_bytes(size_t(w)));
        const size_t per_sequence = size_t(p.decode->capacity()) * size_t(w);
        for (int r = 0; r < p.rows; ++r) {
            void* rows_so_far = at(p, cache, size_t(r) * per_sequence);
            p.dev->copy_on_device(p.stream, at(p, rows_so_far, size_t(position) * size_t(w)),
                                  at(p, B.qkv, size_t(r) * w), p.dev->act_bytes(size_t(w)));
            attention_decode(*p.dev, p.stream, position + 1, a_, scale(), rows_so_far, at(p, B.heads, size_t(r) * c));
        }
        project_out(p, p.rows, B.heads, B.out);
        return B.out;
    }
    // The qkv projection's weight gradient from dqkv (through the rotation back first), and
    // dx = dqkv W_attn.
    void input_grads(Pass& p, void* dqkv, void* dx) const {
        const int c = in_.c, rows = p.rows * in_.positions(), w = int(a_.qkv_width());
        if (o_.rope_theta > 0) rope_rotate(*p.dev, p.stream, rope(p), true, dqkv);
        weight_grad(p, rows, w, c, dqkv, p.acts->input(slot_), attn_w_off_, attn_b_off_);
        if (dx)
            gemm(*p.dev, p.stream, false, false, rows, c, w, 1.0f, dqkv, w, p.weight(attn_w_off_), c, 0.0f, dx, c,
                 p.types(p.vt));
        if (!lora_qkv_.empty()) lora_qkv_.backward(p, rows, p.acts->input(slot_), dqkv, dx);
    }
    // qkv[rows, w] = x W_attn^T + b, plus the adapters'; out[rows, c] = heads W_proj^T + b, plus theirs
    void project_qkv(Pass& p, int rows, const void* x, void* qkv) const {
        const int c = in_.c, w = int(a_.qkv_width());
        dense_forward(*p.dev, p.stream, Activation::none, rows, w, c, x, p.weight(attn_w_off_), bias(p, attn_b_off_),
                      qkv, qkv, p.types(p.vt));
        lora_qkv_.forward(p, rows, x, qkv);
    }
    void project_out(Pass& p, int rows, const void* heads, void* out) const {
        const int c = in_.c;
        dense_forward(*p.dev, p.stream, Activation::none, rows, c, c, heads, p.weight(proj_w_off_),
                      bias(p, proj_b_off_), out, out, p.types(p.vt));
        lora_out_.forward(p, rows, heads, out);
    }
    // q and k of every head rotated by their positions (the query heads, then the key heads)
    RopeShape rope(const Pass& p) const {
        return RopeShape{p.rows,        in_.positions(), 0, int(a_.qkv_width()), a_.heads + a_.kv_heads, a_.d,
                         o_.rope_theta, o_.rope_scaling};
    }
    // a projection's bias (kNoBias: it has none - bias: false, or out_bias: false for the output's)
    const float* bias(const Pass& p, size_t offset) const { return offset == kNoBias ? nullptr : p.params + offset; }
    float* bias_grad(const Pass& p, size_t offset) const { return offset == kNoBias ? nullptr : p.grad(offset); }
    // dW[units, inputs] (+)= dz^T x and db (+)= column sums of dz, each unless frozen
    void weight_grad(Pass& p, int rows, int units, int inputs, const void* dz, const void* x, size_t w_off,
                     size_t b_off) const {
        float* const db = bias_grad(p, b_off);
        if (float* const dw = p.grad(w_off))
            dense_weight_grad(*p.dev, p.stream, rows, units, inputs, dz, x, dw, db, p.accumulate, p.types(DType::f32));
        else if (db) bias_gradient(*p.dev, p.stream, rows, units, dz, db, p.accumulate);
    }
    // A key/value head's gradient is the sum over its group's query heads: the first writes it.
    float group_beta(int h) const { return h % a_.group() ? 1.0f : 0.0f; }

    struct Buffers {
        void* qkv;
        void* probs;
        void* mixed;  // the probabilities the values are mixed with: probs, or probs after dropout
        void* heads;
        void* out;
    };
    Buffers buffers(Pass& p) const {
        void* probs = fused_ ? nullptr : p.acts->act(slot_, probs_);
        return {p.acts->act(slot_, qkv_), probs, drops(p) ? p.acts->act(slot_, dropped_) : probs,
                p.acts->act(slot_, heads_out_), p.acts->act(slot_, proj_out_)};
    }
    bool drops(const Pass& p) const { return p.training && dropout_ > 0; }
    DropoutArgs dropout_args(const Pass& p, int first_sample) const {
        return DropoutArgs{dropout_, p.seed, uint32_t(slot_), p.step, p.row_offset + first_sample, p.values};
    }
    // Samples whose probabilities are made and used at a time: on CPUs a cache's worth
    // (Device::column_block_bytes), so that the scores stay in the core's cache from their product
    // through the softmax to the next product instead of streaming through memory; on GPUs all.
    int block(const Pass& p) const {
        return Device::column_block_images(p.dev->act_bytes(tt()), p.dev->column_block_bytes(), p.rows);
    }
    // Queries per block of backward's products: a block of queries meets only the keys up to its
    // last, and a block of keys only the queries from its first on, so that the gradients of the
    // scores above the diagonal (nearly half) are neither computed nor read. On CPUs (backward
    // 9-11% faster on the shipped GPT; the forward's products, split so, were slower than whole);
    // on GPUs (no column blocks) one block, one product per head.
    int query_block(const Pass& p) const {
        return p.dev->column_block_bytes() ? std::min(kQueryBlock, in_.positions()) : in_.positions();
    }
    static constexpr int kQueryBlock = 64;
    size_t row(int i) const { return size_t(i) * a_.qkv_width(); }  // qkv's row i
    size_t cell(int h, int i, int j) const {                        // a sample's probabilities: head h, query i, key j
        return (size_t(h) * in_.positions() + size_t(i)) * in_.positions() + size_t(j);
    }
    // The buffers from sample s0 on (out, the projection's, stays whole).
    Buffers samples_at(const Pass& p, const Buffers& B, int s0) const {
        const size_t t = size_t(in_.positions()), c = size_t(in_.c), s = size_t(s0);
        return {at(p, B.qkv, s * t * a_.qkv_width()), at(p, B.probs, s * tt()), at(p, B.mixed, s * tt()),
                at(p, B.heads, s * t * c), B.out};
    }
    int d() const { return in_.c / heads_; }
    size_t q(int h) const { return a_.q_at(h); }
    size_t k(int h) const { return a_.k_at(h); }
    size_t v(int h) const { return a_.v_at(h); }
    size_t tt() const { return size_t(heads_) * in_.positions() * in_.positions(); }  // a sample's probabilities
    float scale() const { return 1.0f / std::sqrt(float(d())); }
    static void* at(const Pass& p, void* base, size_t elements) {
        return static_cast<char*>(base) + p.dev->act_bytes(elements);
    }
    // One product per sample of `count`, every operand an activation; beta 1 adds to c.
    static void batched(Pass& p, int count, bool ta, bool tb, int m, int n, int k, const void* a, int lda, size_t sa,
                        const void* b, int ldb, size_t sb, void* c, int ldc, size_t sc, float beta = 0.0f) {
        gemm_batched(*p.dev, p.stream, ta, tb, m, n, k, 1.0f, a, lda, int64_t(sa), b, ldb, int64_t(sb), beta, c, ldc,
                     int64_t(sc), count, p.types(p.vt));
    }

    const AttentionOptions& o_;
    AttentionHeads a_;
    LoraAdapters lora_qkv_, lora_out_;  // LoRA beside the two projections (Adaptation)
    int heads_;
    float dropout_;
    bool fused_;
    int attn_w_ = -1, attn_b_ = -1, proj_w_ = -1, proj_b_ = -1;
    static constexpr size_t kNoBias = SIZE_MAX;
    size_t attn_w_off_ = 0, attn_b_off_ = kNoBias, proj_w_off_ = 0, proj_b_off_ = kNoBias;
    int slot_ = -1, qkv_ = -1, probs_ = -1, heads_out_ = -1, proj_out_ = -1, dqkv_ = -1, dprobs_ = -1, dheads_ = -1,
        dropped_ = -1, lse_ = -1, delta_ = -1;
};

OptionsPtr read(SpecReader& r, const std::string& p) {
    auto o = std::make_shared<AttentionOptions>();
    o->heads = int(r.integer(p + ".heads", 0, 1, 1024));
    if (o->heads == 0) r.fail(p + ".heads", "required for attention: the number of heads, dividing the width");
    o->kv_heads = int(r.integer(p + ".kv_heads", 0, 1, 1024));
    if (o->kv_heads && o->heads % o->kv_heads)
        r.fail(p + ".kv_heads",
               "must divide heads (" + std::to_string(o->heads) + "): each key/value head serves a group");
    if (o->kv_heads == o->heads) o->kv_heads = 0;
    o->dropout = float(r.number(p + ".dropout", 0.0, 0.0, 0.999));
    o->fused = r.boolean(p + ".fused", false);
    o->rope_theta = float(r.number(p + ".rope_theta", 0.0, 0.0, 1e9));
    if (o->rope_theta > 0 && o->rope_theta <= 1)
        r.fail(p + ".rope_theta", "the rotary base must be above 1 (Llama: 10000, Llama 3: 500000), or 0 for none");
    o->rope_scaling = read_rope_scaling(r, p);
    if (o->rope_scaling.kind != RopeScaling::Kind::none && o->rope_theta == 0)
        r.fail(p + ".rope_scaling", "scales rotary embeddings: set rope_theta too");
    o->bias = r.boolean(p + ".bias", true);
    o->out_bias = r.boolean(p + ".out_bias", o->bias);
    o->llama_names = r.choice(p + ".names", "nanogpt", {"nanogpt", "llama"}) == "llama";
    return o;
}

}  // namespace

extern const LayerKind kAttentionKind{"attention", read, create_layer<Attention>};

}  // namespace mirrored
