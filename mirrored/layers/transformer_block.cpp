// transformer_block: GPT-2's pre-LN block on a sequence [t, c]:
//   h = x + drop(attn(ln_1(x))),  y = h + drop(mlp(ln_2(h))),  mlp = c_proj(gelu(c_fc(.)))
// with the sub-layers named as nanoGPT names them (ln_1, attn.c_attn, attn.c_proj, ln_2,
// mlp.c_fc, mlp.c_proj). `dropout` is nanoGPT's: on the attention probabilities and on both
// branches before their residual add (with `fused_attention`, whose kernel keeps no
// probabilities, on the branches only). `activation`: gelu (exact, nanoGPT's nn.GELU()) or
// gelu_tanh (GPT-2's). The same block can be written as two residual layers of layernorm,
// attention and dense layers; this type is the short form. With train.recompute: blocks it keeps
// only its input and output between forward and backward, and runs its forward again first in
// backward (Builder::begin_recompute).
#include "mirrored/layers/activations.h"
#include "mirrored/layers/pre_norm_block.h"
#include "mirrored/util.h"
#include "kernels/ops/elementwise.h"

namespace mirrored {

namespace {

struct BlockOptions final : OptionsOf<BlockOptions> {
    int heads = 0;
    int mlp_ratio = 4;
    float dropout = 0.0f;
    float epsilon = 1e-5f;
    Activation activation = Activation::gelu;
    bool fused_attention = false;
    Fields fields() const override {
        Fields f = {{"heads", std::to_string(heads)},
                    {"mlp_ratio", std::to_string(mlp_ratio)},
                    {"dropout", decimal_text(dropout)},
                    {"epsilon", decimal_text(epsilon)}};
        // only when not the default: the checkpoints of blocks written before the key still match
        if (activation != Activation::gelu) f.push_back({"activation", activation_name(activation)});
        if (fused_attention) f.push_back({"fused_attention", "true"});
        return f;
    }
    bool operator==(const BlockOptions&) const = default;
};

class TransformerBlock final : public PreNormBlock {
public:
    explicit TransformerBlock(const LayerSpec& s) : PreNormBlock(s), o_(spec_.get<BlockOptions>()) {}

    void declare(Builder& b) override {
        if (in_.image) fail("transformer_block needs a sequence [t, c], got an image " + in_.str());
        const std::string c = std::to_string(in_.c), eps = decimal_text(o_.epsilon);
        const std::string wide = std::to_string(in_.c * o_.mlp_ratio);
        recompute_ = b.begin_recompute();
        ln_1_ = sub_layer("layernorm", {{"epsilon", eps}});
        attn_ = sub_layer("attention", {{"heads", std::to_string(o_.heads)},
                                        {"dropout", o_.fused_attention ? "0" : decimal_text(o_.dropout)},
                                        {"fused", o_.fused_attention ? "true" : "false"}});
        ln_2_ = sub_layer("layernorm", {{"epsilon", eps}});
        fc_ = sub_layer("dense", {{"units", wide}, {"activation", activation_name(o_.activation)}});
        proj_ = sub_layer("dense", {{"units", c}});
        ln_1_->build(b, name_ + ".ln_1", key_, in_);
        attn_->build(b, name_ + ".attn", key_, ln_1_->out());
        ln_2_->build(b, name_ + ".ln_2", key_, in_);
        fc_->build(b, name_ + ".mlp.c_fc", key_, ln_2_->out());
        proj_->build(b, name_ + ".mlp.c_proj", key_, fc_->out());
        if (o_.dropout > 0) {
            const std::string rate = decimal_text(o_.dropout);
            attn_drop_ = sub_layer("dropout", {{"rate", rate}});
            mlp_drop_ = sub_layer("dropout", {{"rate", rate}});
            attn_drop_->build(b, name_ + ".attn_dropout", key_, in_);
            mlp_drop_->build(b, name_ + ".mlp_dropout", key_, in_);
        }
        slot_ = b.new_slot();
        const size_t n = in_.size();
        h_ = b.act_buffer(slot_, n);
        g_ = b.act_buffer(slot_, n);
        dwide_ = b.act_buffer(slot_, size_t(in_.positions()) * size_t(in_.c) * size_t(o_.mlp_ratio));
        dnorm_ = b.act_buffer(slot_, n);
        dh_ = b.act_buffer(slot_, n);
        b.end_recompute();
        y_ = b.act_buffer(slot_, n);  // the next layer's input: kept, recomputed or not
    }
    void place(const std::vector<TensorRef>& refs) override {
        for (Layer* l : {ln_1_.get(), attn_.get(), ln_2_.get(), fc_.get(), proj_.get()}) l->place(refs);
    }

    void backward(Pass& p, void* dy, void* dx) const override {
        recompute_branches(p);
        const size_t n = size_t(p.rows) * in_.size();
        void* g = p.acts->act(slot_, g_);
        void* dwide = p.acts->act(slot_, dwide_);
        void* dnorm = p.acts->act(slot_, dnorm_);
        void* dh = p.acts->act(slot_, dh_);
        // the MLP branch: its layers may overwrite their output gradient, so they get a copy of dy
        if (mlp_drop_) mlp_drop_->run_backward(p, dy, g);
        else p.dev->copy_on_device(p.stream, g, dy, p.dev->act_bytes(n));
        proj_->run_backward(p, g, dwide);
        fc_->run_backward(p, dwide, dnorm);
        ln_2_->run_backward(p, dnorm, dh);
        add_values(*p.dev, p.stream, n, dy, dh);  // dh = dy + the branch's
        // the attention branch
        if (attn_drop_) attn_drop_->run_backward(p, dh, g);
        else p.dev->copy_on_device(p.stream, g, dh, p.dev->act_bytes(n));
        attn_->run_backward(p, g, dnorm);
        ln_1_->run_backward(p, dnorm, dx);
        if (dx) add_values(*p.dev, p.stream, n, dh, dx);
    }

    double forward_flops() const override {
        return attn_->forward_flops() + fc_->forward_flops() + proj_->forward_flops();
    }
    std::string detail() const override {
        return std::to_string(o_.heads) + " heads, mlp " + std::to_string(o_.mlp_ratio) + "x " +
               activation_name(o_.activation) + (o_.dropout > 0 ? ", dropout " + decimal_text(o_.dropout) : "");
    }

private:
    // h = x + drop(attn(ln_1(x))) into *h; returns drop(mlp(ln_2(h))), the MLP branch.
    const void* branches(Pass& p, const void* x, const void** h_out) const override {
        void* h = p.acts->act(slot_, h_);
        const void* a = attn_->forward(p, ln_1_->forward(p, x));
        if (attn_drop_) a = attn_drop_->forward(p, a);
        add_act_values(*p.dev, p.stream, Activation::none, p.rows, int(in_.size()), a, x, h);
        const void* m = proj_->forward(p, fc_->forward(p, ln_2_->forward(p, h)));
        if (mlp_drop_) m = mlp_drop_->forward(p, m);
        *h_out = h;
        return m;
    }

    const BlockOptions& o_;
    std::unique_ptr<Layer> ln_1_, attn_, ln_2_, fc_, proj_, attn_drop_, mlp_drop_;
    int h_ = -1, g_ = -1, dwide_ = -1, dnorm_ = -1, dh_ = -1;
};

OptionsPtr read(SpecReader& r, const std::string& p) {
    auto o = std::make_shared<BlockOptions>();
    o->heads = int(r.integer(p + ".heads", 0, 1, 1024));
    if (o->heads == 0) r.fail(p + ".heads", "required for a transformer_block: the attention heads");
    o->mlp_ratio = int(r.integer(p + ".mlp_ratio", 4, 1, 64));
    o->dropout = float(r.number(p + ".dropout", 0.0, 0.0, 0.999));
    o->epsilon = float(r.number(p + ".epsilon", 1e-5, 1e-12, 1.0));
    o->fused_attention = r.boolean(p + ".fused_attention", false);
    o->activation =
        r.choice(p + ".activation", "gelu", {"gelu", "gelu_tanh"}) == "gelu" ? Activation::gelu : Activation::gelu_tanh;
    return o;
}

}  // namespace

extern const LayerKind kTransformerBlockKind{"transformer_block", read, create_layer<TransformerBlock>};

}  // namespace mirrored
