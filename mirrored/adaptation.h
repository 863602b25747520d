// Fine-tuning part of a model: model.lora (low-rank adapters on Hugging Face's projection modules,
// the rest frozen) and model.freeze (tensors kept fixed by name). Either changes which tensors
// train, so it is part of the model a checkpoint is written for.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "mirrored/config.h"
#include "mirrored/model.h"

namespace mirrored {

// The Adaptation a model config asks for: LoRA's slices found by Hugging Face's module names
// (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj; GPT-2's c_attn, c_proj) in the
// model's table (mirrored/hf_models.h), which may be rows of a stacked tensor here. ConfigError
// naming model.lora.targets when a target matches nothing.
Adaptation make_adaptation(const ModelConfig& m, const std::vector<int>& input_shape, uint64_t seed);

// The model a config describes, adaptation included, at an input shape (empty: the config's).
std::unique_ptr<Model> build_model(const Config& c, std::vector<int> input_shape = {}, bool recompute_blocks = false,
                                   size_t gradient_piece_floats = 0);

}  // namespace mirrored
