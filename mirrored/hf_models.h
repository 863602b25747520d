// Hugging Face model folders (config.json, model.safetensors or shards named by
// model.safetensors.index.json, the tokenizer's files): what a pretrained GPT-2 or Llama-family
// model (Llama 2/3, Mistral, SmolLM, TinyLlama) is downloaded as. `model.init_from: DIR` builds the
// model config.json describes and starts from its weights; `mirrored export --names hf` writes one.
//
// Both directions share one table (hf_tensors): each of Hugging Face's tensors, the model's tensor
// it lies in, its rows there (q/k/v and gate/up are stacked by rows here) and whether it is stored
// transposed (GPT-2's Conv1D keeps [in, out]).
#pragma once

#include <optional>
#include <functional>
#include <string>
#include <vector>

#include "mirrored/checkpoint.h"
#include "mirrored/model.h"

namespace mirrored {

// The model config.json describes, as the YAML list model.layers would hold: GPT-2 (model_type
// gpt2: embedding, position_embedding, transformer_block x n_layer, layernorm, a tied lm_head) or
// the Llama family (llama, mistral: embedding, llama_block x num_hidden_layers, rmsnorm, lm_head).
// ConfigError naming DIR/config.json, the key and what mirrored would need otherwise.
// config.json's eos_token_id (the first where it lists several), if any.
std::optional<int> hf_end_of_text(const std::string& dir);

struct HfModelConfig {
    std::string layers;     // YAML
    int max_positions = 0;  // n_positions, max_position_embeddings: the longest context it was trained on
};
HfModelConfig hf_model_config(const std::string& dir);

struct HfTensor {
    std::string name;         // Hugging Face's
    std::vector<int> shape;   // as Hugging Face stores it
    std::string ours;         // the model's tensor (TensorInfo::name)
    int row = 0;              // its first row there (q/k/v, gate/up stacked by rows)
    bool transposed = false;  // stored [in, out]: GPT-2's Conv1D
};

// Hugging Face's tensors of `model` under the names its PyTorch classes give them
// (GPT2LMHeadModel, LlamaForCausalLM), in the model's order; a tied head is not listed. ConfigError
// naming the layer when the model is not one Hugging Face's classes hold (what = the command).
std::vector<HfTensor> hf_tensors(const Model& model, const std::string& what);

// Reads DIR's weights into the model's flat layout, a tensor at a time: shard by shard, each
// memory-mapped and each tensor converted from F32, BF16 or F16 once, into a buffer of that
// tensor's size that `put` takes (the range of the flat parameters it fills; state and gaps are not
// put) - so no whole copy of the model is held besides the parameters themselves. `get` reads a
// range back (a tied lm_head saved anyway is compared with the embedding). Every tensor of
// hf_tensors must be there once, with its shape, and finite; a tensor nothing reads is an error
// (but for buffers Hugging Face saves: GPT-2's attention masks, rotary inv_freq, a tied lm_head
// equal to the embedding). CheckpointError naming the file and the tensor.
using ParamPut = std::function<void(size_t offset, const float* values, size_t count)>;
using ParamGet = std::function<void(size_t offset, float* values, size_t count)>;
void read_hf_weights(const std::string& dir, const Model& model, const ParamPut& put, const ParamGet& get);
// The same into a host array of the model's flat size.
void read_hf_weights(const std::string& dir, const Model& model, float* params);

// The model's parameters as a Hugging Face folder's model.safetensors (F32) and config.json
// (`context`: max_position_embeddings for a Llama). ConfigError as hf_tensors.
struct HfModelFiles {
    SafetensorsFile weights;
    std::string config_json;
};
HfModelFiles hf_model_files(const Model& model, const float* params);

// A LoRA model's adapters as PEFT saves them: adapter_model.safetensors
// (base_model.model.<Hugging Face's module>.lora_A.weight [rank, in], lora_B.weight [out, rank])
// and adapter_config.json (r, lora_alpha, target_modules; base_model_name_or_path: base_model).
HfModelFiles hf_adapter_files(const Model& model, const float* params, const std::string& base_model);
// The parameters with every adapter merged into its weight: W[rows] += (alpha / rank) B A.
std::vector<float> merged_params(const Model& model, const float* params);

}  // namespace mirrored
