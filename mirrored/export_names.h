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

}  // namespace mirrored
