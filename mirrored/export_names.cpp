#include "mirrored/export_names.h"

#include <cstdlib>
#include <nlohmann/json.hpp>

#include "base/error.h"

namespace mirrored {

namespace {

[[noreturn]] void not_nanogpt(const std::string& what) {
    throw ConfigError("export --names nanogpt",
                      what +
                          "; nanoGPT's GPT is embedding, position_embedding, transformer_block x N (mlp_ratio 4, "
                          "activation gelu, epsilon 1e-5), layernorm (epsilon 1e-5), lm_head tied to the embedding");
}

bool default_epsilon(const LayerSpec& s) { return float(std::strtod(s.field("epsilon").c_str(), nullptr)) == 1e-5f; }

}  // namespace

std::vector<std::pair<std::string, std::string>> nanogpt_names(const std::vector<LayerSpec>& layers,
                                                               const std::vector<std::string>& names) {
    const size_t n = layers.size();
    if (n < 5 || layers[0].type != "embedding" || layers[1].type != "position_embedding" ||
        layers[n - 2].type != "layernorm" || layers[n - 1].type != "lm_head")
        not_nanogpt("the model is not written in that order");
    std::vector<std::pair<std::string, std::string>> prefixes = {{"layers.0.", "transformer.wte."},
                                                                 {"layers.1.", "transformer.wpe."}};
    for (size_t k = 2; k + 2 < n; ++k) {
        const LayerSpec& b = layers[k];
        const std::string at = "model.layers." + std::to_string(k) + ": ";
        if (b.type != "transformer_block") not_nanogpt(at + b.type + " between the embeddings and the final layernorm");
        if (b.field("mlp_ratio") != "4") not_nanogpt(at + "mlp_ratio " + b.field("mlp_ratio"));
        if (!b.field("activation").empty()) not_nanogpt(at + "activation " + b.field("activation"));  // gelu: unwritten
        if (!default_epsilon(b)) not_nanogpt(at + "epsilon " + b.field("epsilon"));
        prefixes.push_back({"layers." + std::to_string(k) + ".", "transformer.h." + std::to_string(k - 2) + "."});
    }
    if (!default_epsilon(layers[n - 2]))
        not_nanogpt("model.layers." + std::to_string(n - 2) + ": epsilon " + layers[n - 2].field("epsilon"));
    prefixes.push_back({"layers." + std::to_string(n - 2) + ".", "transformer.ln_f."});
    prefixes.push_back({"layers." + std::to_string(n - 1) + ".", "lm_head."});
    if (layers[n - 1].field("tie_weights") == "false")
        not_nanogpt("model.layers." + std::to_string(n - 1) + ": tie_weights false (nanoGPT ties lm_head to wte)");

    std::vector<std::pair<std::string, std::string>> out;
    for (const std::string& name : names) {
        bool found = false;
        for (const auto& [from, to] : prefixes)
            if (name.rfind(from, 0) == 0) {
                out.push_back({name, to + name.substr(from.size())});
                found = true;
                break;
            }
        if (!found) throw Error(kExitFailure, "export: tensor " + name + " belongs to no layer of the model");
        if (name == "layers.0.weight") out.push_back({name, "lm_head.weight"});  // tied: both names
    }
    return out;
}

HfModel hf_llama(const std::vector<LayerSpec>& layers, int context, const SafetensorsFile& tensors) {
    const auto fail = [](const std::string& what) {
        throw ConfigError("export --names hf", what +
                                                   "; Hugging Face's Llama is embedding, llama_block x N (all alike), "
                                                   "rmsnorm (the blocks' epsilon), lm_head");
    };
    const size_t n = layers.size();
    if (n < 4 || layers[0].type != "embedding" || layers[n - 2].type != "rmsnorm" || layers[n - 1].type != "lm_head")
        fail("the model is not written in that order");
    const LayerSpec& first = layers[1];
    for (size_t k = 1; k + 2 < n; ++k) {
        if (layers[k].type != "llama_block") fail("model.layers." + std::to_string(k) + ": " + layers[k].type);
        for (const char* key : {"heads", "kv_heads", "intermediate_size", "rope_theta", "epsilon", "bias"})
            if (layers[k].field(key) != first.field(key))
                fail("model.layers." + std::to_string(k) + ": " + key + " differs from the first block's");
    }
    if (layers[n - 2].field("epsilon") != first.field("epsilon")) fail("the final rmsnorm's epsilon differs");
    const auto tensor = [&](const std::string& name) -> const std::pair<std::vector<int>, std::vector<float>>& {
        const auto it = tensors.tensors.find(name);
        if (it == tensors.tensors.end()) throw CheckpointError("export: the checkpoint has no tensor " + name);
        return it->second;
    };
    const auto& embed = tensor("layers.0.weight");
    const int vocab = embed.first[0], c = embed.first[1];
    const int heads = std::atoi(first.field("heads").c_str()), kv = std::atoi(first.field("kv_heads").c_str());
    const int wide = std::atoi(first.field("intermediate_size").c_str()), d = c / heads;
    const bool bias = first.field("bias") == "true", tied = layers[n - 1].field("tie_weights") != "false";
    HfModel m;
    auto& out = m.weights.tensors;
    // rows [from, from + count) of a [rows, cols] tensor (or of a vector)
    const auto rows = [](const std::pair<std::vector<int>, std::vector<float>>& t, int from, int count) {
        const size_t cols = t.first.size() > 1 ? size_t(t.first[1]) : 1;
        std::vector<int> shape = t.first;
        shape[0] = count;
        return std::make_pair(shape, std::vector<float>(t.second.begin() + long(size_t(from) * cols),
                                                        t.second.begin() + long(size_t(from + count) * cols)));
    };
    out["model.embed_tokens.weight"] = embed;
    const int blocks = int(n) - 3;
    for (int i = 0; i < blocks; ++i) {
        const std::string from = "layers." + std::to_string(i + 1) + ".",
                          to = "model.layers." + std::to_string(i) + ".";
        out[to + "input_layernorm.weight"] = tensor(from + "input_layernorm.weight");
        out[to + "post_attention_layernorm.weight"] = tensor(from + "post_attention_layernorm.weight");
        for (const char* what : {"weight", "bias"}) {
            if (std::string(what) == "bias" && !bias) continue;
            const auto& qkv = tensor(from + "self_attn.qkv_proj." + what);
            out[to + "self_attn.q_proj." + what] = rows(qkv, 0, heads * d);
            out[to + "self_attn.k_proj." + what] = rows(qkv, heads * d, kv * d);
            out[to + "self_attn.v_proj." + what] = rows(qkv, (heads + kv) * d, kv * d);
            out[to + "self_attn.o_proj." + what] = tensor(from + "self_attn.o_proj." + what);
        }
        const auto& gate_up = tensor(from + "mlp.gate_up_proj.weight");
        out[to + "mlp.gate_proj.weight"] = rows(gate_up, 0, wide);
        out[to + "mlp.up_proj.weight"] = rows(gate_up, wide, wide);
        out[to + "mlp.down_proj.weight"] = tensor(from + "mlp.down_proj.weight");
    }
    out["model.norm.weight"] = tensor("layers." + std::to_string(n - 2) + ".weight");
    if (!tied) {
        const auto& head = tensor("layers." + std::to_string(n - 1) + ".weight");
        if (head.first[0] != vocab)
            fail("the head scores " + std::to_string(head.first[0]) + " tokens, the embedding has " +
                 std::to_string(vocab) + " (Hugging Face's Llama has one vocab_size)");
        out["lm_head.weight"] = head;
    }
    m.weights.metadata = {{"format", "pt"}};
    const nlohmann::json config = {{"architectures", {"LlamaForCausalLM"}},
                                   {"model_type", "llama"},
                                   {"hidden_size", c},
                                   {"intermediate_size", wide},
                                   {"num_attention_heads", heads},
                                   {"num_key_value_heads", kv},
                                   {"head_dim", d},
                                   {"num_hidden_layers", blocks},
                                   {"rms_norm_eps", std::strtod(first.field("epsilon").c_str(), nullptr)},
                                   {"rope_theta", std::strtod(first.field("rope_theta").c_str(), nullptr)},
                                   {"rope_scaling", nullptr},
                                   {"vocab_size", vocab},
                                   {"max_position_embeddings", context},
                                   {"tie_word_embeddings", tied},
                                   {"attention_bias", bias},
                                   {"mlp_bias", false},
                                   {"hidden_act", "silu"},
                                   {"initializer_range", 0.02},
                                   {"torch_dtype", "float32"}};
    m.config_json = config.dump(2) + "\n";
    return m;
}

}  // namespace mirrored
