// llama_block: the decoder layer of the Llama family (Llama 2/3, Mistral, Qwen, SmolLM) on a
// sequence [t, c], Hugging Face's LlamaDecoderLayer:
//   h = x + o_proj(attention(rope(qkv_proj(input_layernorm(x)))))
//   y = h + down_proj(silu(gate_proj(n)) * up_proj(n)),  n = post_attention_layernorm(h)
// RMSNorm (epsilon), grouped-query attention (kv_heads), rotary embeddings (rope_theta, and
// rope_scaling as Llama 3.1 has), no biases (bias: true puts them on the attention's projections;
// with out_bias: false on q, k and v only, as Qwen2 has them). Sub-layers
// named as Hugging Face names them, with q/k/v and gate/up each stored as one tensor stacked by
// rows (self_attn.qkv_proj: q_proj, k_proj, v_proj; mlp.gate_up_proj: gate_proj, up_proj), so
// that each pair of products is one. With train.recompute: blocks it keeps only its input and
// output between forward and backward, as transformer_block.
#include "mirrored/layers/pre_norm_block.h"
#include "mirrored/layers/rope_scaling.h"
#include "mirrored/util.h"
#include "kernels/ops/elementwise.h"

namespace mirrored {

namespace {

struct LlamaOptions final : OptionsOf<LlamaOptions> {
    int heads = 0;
    int kv_heads = 0;
    int intermediate_size = 0;
    float rope_theta = 10000.0f;
    RopeScaling rope_scaling;
    float epsilon = 1e-6f;
    bool bias = false;
    bool out_bias = false;
    bool fused_attention = false;
    Fields fields() const override {
        Fields f = {{"heads", std::to_string(heads)},
                    {"kv_heads", std::to_string(kv_heads)},
                    {"intermediate_size", std::to_string(intermediate_size)},
                    {"rope_theta", decimal_text(rope_theta)},
                    {"epsilon", decimal_text(epsilon)}};
        add_rope_scaling_fields(f, rope_scaling);
        if (bias) f.push_back({"bias", "true"});
        if (out_bias != bias) f.push_back({"out_bias", out_bias ? "true" : "false"});
        if (fused_attention) f.push_back({"fused_attention", "true"});
        return f;
    }
    bool operator==(const LlamaOptions&) const = default;
};

class LlamaBlock final : public PreNormBlock {
public:
    explicit LlamaBlock(const LayerSpec& s) : PreNormBlock(s), o_(spec_.get<LlamaOptions>()) {}

    void declare(Builder& b) override {
        if (in_.image) fail("llama_block needs a sequence [t, c], got an image " + in_.str());
        const std::string eps = decimal_text(o_.epsilon), init = init_kind_name(InitKind::gpt2_normal);
        recompute_ = b.begin_recompute();
        in_norm_ = sub_layer("rmsnorm", {{"epsilon", eps}});
        Fields attention = {{"heads", std::to_string(o_.heads)},
                            {"kv_heads", std::to_string(o_.kv_heads)},
                            {"rope_theta", decimal_text(o_.rope_theta)},
                            {"bias", o_.bias ? "true" : "false"},
                            {"out_bias", o_.out_bias ? "true" : "false"},
                            {"names", "llama"},
                            {"fused", o_.fused_attention ? "true" : "false"}};
        add_rope_scaling_fields(attention, o_.rope_scaling);
        attn_ = sub_layer("attention", attention);
        post_norm_ = sub_layer("rmsnorm", {{"epsilon", eps}});
        gate_up_ = sub_layer("dense",
                             {{"units", std::to_string(2 * o_.intermediate_size)}, {"bias", "false"}, {"init", init}});
        act_ = sub_layer("swiglu", {});
        down_ = sub_layer("dense", {{"units", std::to_string(in_.c)}, {"bias", "false"}, {"init", init}});
        in_norm_->build(b, name_ + ".input_layernorm", key_, in_);
        attn_->build(b, name_ + ".self_attn", key_, in_norm_->out());
        post_norm_->build(b, name_ + ".post_attention_layernorm", key_, in_);
        gate_up_->build(b, name_ + ".mlp.gate_up_proj", key_, post_norm_->out());
        act_->build(b, name_ + ".mlp.act_fn", key_, gate_up_->out());
        down_->build(b, name_ + ".mlp.down_proj", key_, act_->out());
        slot_ = b.new_slot();
        const size_t n = in_.size(), t = size_t(in_.positions()), wide = size_t(o_.intermediate_size);
        h_ = b.act_buffer(slot_, n);
        dwide_ = b.act_buffer(slot_, t * wide);
        dgate_up_ = b.act_buffer(slot_, 2 * t * wide);
        dnorm_ = b.act_buffer(slot_, n);
        dh_ = b.act_buffer(slot_, n);
        b.end_recompute();
        y_ = b.act_buffer(slot_, n);  // the next layer's input: kept, recomputed or not
    }
    void place(const std::vector<TensorRef>& refs) override {
        for (Layer* l : {in_norm_.get(), attn_.get(), post_norm_.get(), gate_up_.get(), act_.get(), down_.get()})
            l->place(refs);
    }

    void backward(Pass& p, void* dy, void* dx) const override {
        recompute_branches(p);
        const size_t n = size_t(p.rows) * in_.size();
        void* dwide = p.acts->act(slot_, dwide_);
        void* dgate_up = p.acts->act(slot_, dgate_up_);
        void* dnorm = p.acts->act(slot_, dnorm_);
        void* dh = p.acts->act(slot_, dh_);
        // the MLP branch (its projections have no activation: dy is read, never written)
        down_->run_backward(p, dy, dwide);
        act_->run_backward(p, dwide, dgate_up);
        gate_up_->run_backward(p, dgate_up, dnorm);
        post_norm_->run_backward(p, dnorm, dh);
        add_values(*p.dev, p.stream, n, dy, dh);  // dh = dy + the branch's
        // the attention branch (which reads dh, never writes it)
        attn_->run_backward(p, dh, dnorm);
        in_norm_->run_backward(p, dnorm, dx);
        if (dx) add_values(*p.dev, p.stream, n, dh, dx);
    }

    double forward_flops() const override {
        return attn_->forward_flops() + gate_up_->forward_flops() + down_->forward_flops();
    }
    std::string detail() const override { return attn_->detail() + ", swiglu " + std::to_string(o_.intermediate_size); }

private:
    // h = x + attn(input_layernorm(x)) into *h; returns the MLP branch.
    const void* branches(Pass& p, const void* x, const void** h_out) const override {
        void* h = p.acts->act(slot_, h_);
        const void* a = attn_->forward(p, in_norm_->forward(p, x));
        add_act_values(*p.dev, p.stream, Activation::none, p.rows, int(in_.size()), a, x, h);
        const void* m = down_->forward(p, act_->forward(p, gate_up_->forward(p, post_norm_->forward(p, h))));
        *h_out = h;
        return m;
    }

    const LlamaOptions& o_;
    std::unique_ptr<Layer> in_norm_, attn_, post_norm_, gate_up_, act_, down_;
    int h_ = -1, dwide_ = -1, dgate_up_ = -1, dnorm_ = -1, dh_ = -1;
};

OptionsPtr read(SpecReader& r, const std::string& p) {
    auto o = std::make_shared<LlamaOptions>();
    o->heads = int(r.integer(p + ".heads", 0, 1, 1024));
    if (o->heads == 0) r.fail(p + ".heads", "required for a llama_block: the attention's query heads");
    o->kv_heads = int(r.integer(p + ".kv_heads", o->heads, 1, 1024));
    if (o->heads % o->kv_heads)
        r.fail(p + ".kv_heads",
               "must divide heads (" + std::to_string(o->heads) + "): each key/value head serves a group");
    o->intermediate_size = int(r.integer(p + ".intermediate_size", 0, 1, 1 << 20));
    if (o->intermediate_size == 0)
        r.fail(p + ".intermediate_size",
               "required for a llama_block: the MLP's width (Hugging Face's intermediate_size; Llama: about 8/3 of the "
               "model's width)");
    o->rope_theta = float(r.number(p + ".rope_theta", 10000.0, 1.0, 1e9));
    if (o->rope_theta <= 1)
        r.fail(p + ".rope_theta", "the rotary base must be above 1 (Llama: 10000, Llama 3: 500000)");
    o->epsilon = float(r.number(p + ".epsilon", 1e-6, 1e-12, 1.0));
    o->rope_scaling = read_rope_scaling(r, p);
    o->bias = r.boolean(p + ".bias", false);
    o->out_bias = r.boolean(p + ".out_bias", o->bias);
    o->fused_attention = r.boolean(p + ".fused_attention", false);
    return o;
}

}  // namespace

extern const LayerKind kLlamaBlockKind{"llama_block", read, create_layer<LlamaBlock>};

}  // namespace mirrored
