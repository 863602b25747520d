// Tensor names as another code base's modules name them, for `mirrored export --names`: the file
// then loads into that code's model with load_state_dict(strict=True), nothing renamed by hand.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "mirrored/checkpoint.h"
#include "mirrored/layers/layer.h"

namespace mirrored {

// nanoGPT's GPT (model.py): a model written as embedding, position_embedding, transformer_block
// x N (mlp_ratio 4, exact GELU, epsilon 1e-5, as nanoGPT's blocks are), layernorm, lm_head tied to
// the embedding (nanoGPT's always is), named
// transformer.wte, transformer.wpe, transformer.h.<i>.<sub-layer>, transformer.ln_f and
// lm_head.weight - a tied head under both names, as nanoGPT's state_dict lists it. For each of
// `names` (the checkpoint's), its new name(s) in order. ConfigError naming what differs otherwise.
std::vector<std::pair<std::string, std::string>> nanogpt_names(const std::vector<LayerSpec>& layers,
                                                               const std::vector<std::string>& names);

// Hugging Face's LlamaForCausalLM: a model written as embedding, llama_block x N (one shape for all:
// heads, kv_heads, intermediate_size, rope_theta, epsilon, bias), rmsnorm, lm_head. Its state dict
// (model.embed_tokens, model.layers.<i>.self_attn.{q,k,v,o}_proj, mlp.{gate,up,down}_proj, the
// norms, model.norm, lm_head - q/k/v and gate/up split out of the stacked tensors by rows) from a
// checkpoint's `tensors`, and its config.json for `context` positions. ConfigError naming what
// differs otherwise.
struct HfModel {
    SafetensorsFile weights;
    std::string config_json;
};
HfModel hf_llama(const std::vector<LayerSpec>& layers, int context, const SafetensorsFile& tensors);

}  // namespace mirrored
