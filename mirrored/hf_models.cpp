#include "mirrored/hf_models.h"

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "base/error.h"
#include "base/io.h"
#include "mirrored/safetensors.h"
#include "mirrored/util.h"

namespace mirrored {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr uint64_t kMaxConfigJsonBytes = 1 << 20;

json read_json(const std::string& path, const std::string& what) {
    std::string text;
    try {
        text = read_regular_file(path, kMaxConfigJsonBytes);
    } catch (const InputError& e) {
        throw ConfigError(std::string(e.what()) + " (" + what + ")");
    }
    try {
        return json::parse(text);
    } catch (const json::exception& e) {
        throw ConfigError(path + ": not valid JSON: " + e.what());
    }
}

// config.json's keys, each read once and checked, the file named in every message.
struct HfConfigReader {
    const json& j;
    std::string path;
    [[noreturn]] void fail(const std::string& key, const std::string& what) const {
        throw ConfigError(path + ": " + key + ": " + what);
    }
    bool has(const std::string& key) const { return j.contains(key) && !j[key].is_null(); }
    int integer(const std::string& key, int lo, int hi, std::optional<int> def = std::nullopt) const {
        if (!has(key)) {
            if (def) return *def;
            fail(key, "missing (expected an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "])");
        }
        const json& v = j[key];
        if (!v.is_number_integer() || v.get<int64_t>() < lo || v.get<int64_t>() > hi)
            fail(key,
                 "expected an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " + v.dump());
        return int(v.get<int64_t>());
    }
    double number(const std::string& key, double lo, double hi, double def) const {
        if (!has(key)) return def;
        const json& v = j[key];
        if (!v.is_number() || !(v.get<double>() >= lo) || !(v.get<double>() <= hi))
            fail(key, "expected a number in [" + decimal_text(lo) + ", " + decimal_text(hi) + "], got " + v.dump());
        return v.get<double>();
    }
    bool boolean(const std::string& key, bool def) const {
        if (!has(key)) return def;
        if (!j[key].is_boolean()) fail(key, "expected true or false, got " + j[key].dump());
        return j[key].get<bool>();
    }
    std::string text(const std::string& key, const std::string& def) const {
        if (!has(key)) return def;
        if (!j[key].is_string()) fail(key, "expected a string, got " + j[key].dump());
        return j[key].get<std::string>();
    }
};

HfModelConfig gpt2_layers(const HfConfigReader& r) {
    const int c = r.integer("n_embd", 1, 1 << 16), heads = r.integer("n_head", 1, 1024),
              layers = r.integer("n_layer", 1, 4096), vocab = r.integer("vocab_size", 1, 1 << 24),
              positions = r.integer("n_positions", 1, 1 << 16), inner = r.integer("n_inner", 1, 1 << 20, 4 * c);
    if (c % heads) r.fail("n_head", "n_embd " + std::to_string(c) + " is not a multiple of it");
    if (inner % c) r.fail("n_inner", "mirrored's transformer_block needs a multiple of n_embd (mlp_ratio)");
    const std::string act = r.text("activation_function", "gelu_new");
    if (act != "gelu_new" && act != "gelu_pytorch_tanh" && act != "gelu")
        r.fail("activation_function", "'" + act + "': mirrored has gelu_new (tanh) and gelu (exact)");
    if (!r.boolean("scale_attn_weights", true)) r.fail("scale_attn_weights", "false is not supported");
    if (r.boolean("scale_attn_by_inverse_layer_idx", false))
        r.fail("scale_attn_by_inverse_layer_idx", "true is not supported");
    if (!r.boolean("tie_word_embeddings", true)) r.fail("tie_word_embeddings", "GPT-2's head is tied: expected true");
    const std::string eps = decimal_text(r.number("layer_norm_epsilon", 1e-12, 1.0, 1e-5));
    std::string y = "[{type: embedding, vocab: " + std::to_string(vocab) + ", dim: " + std::to_string(c) +
                    "}, {type: position_embedding, max_len: " + std::to_string(positions) + "}";
    for (int i = 0; i < layers; ++i)
        y += ", {type: transformer_block, heads: " + std::to_string(heads) +
             ", mlp_ratio: " + std::to_string(inner / c) + ", epsilon: " + eps +
             ", activation: " + (act == "gelu" ? "gelu" : "gelu_tanh") + "}";
    return {y + ", {type: layernorm, epsilon: " + eps + "}, {type: lm_head, tie_weights: true}]", positions};
}

// config.json's rope_scaling as a llama_block's keys (", rope_scaling: llama3, rope_factor: 8, ..."):
// null or absent, linear, or llama3 (Llama 3.1 and later); the others (dynamic, yarn, longrope)
// change with the sequence or scale attention too, and are refused.
std::string rope_scaling_keys(const HfConfigReader& r) {
    if (!r.has("rope_scaling")) return "";
    const json& s = r.j["rope_scaling"];
    if (!s.is_object()) r.fail("rope_scaling", "expected null or an object, got " + s.dump());
    const HfConfigReader k{s, r.path + ": rope_scaling"};
    const std::string type = k.has("rope_type") ? k.text("rope_type", "") : k.text("type", "");
    if (type == "default") return "";
    if (type != "linear" && type != "llama3")
        r.fail("rope_scaling",
               "rope_type '" + type + "' is not supported: mirrored scales rotary embeddings as linear and llama3 do");
    if (!k.has("factor")) k.fail("factor", "missing (how many times the context grew)");
    std::string y = ", rope_scaling: " + type + ", rope_factor: " + decimal_text(k.number("factor", 1.0, 1e6, 1.0));
    if (type == "llama3")
        y += ", rope_low_freq_factor: " + decimal_text(k.number("low_freq_factor", 1e-6, 1e6, 1.0)) +
             ", rope_high_freq_factor: " + decimal_text(k.number("high_freq_factor", 1e-6, 1e6, 4.0)) +
             ", rope_original_max_positions: " +
             std::to_string(k.integer("original_max_position_embeddings", 1, 1 << 24, 8192));
    return y;
}

HfModelConfig llama_layers(const HfConfigReader& r, const std::string& type) {
    const int c = r.integer("hidden_size", 1, 1 << 16), heads = r.integer("num_attention_heads", 1, 1024),
              layers = r.integer("num_hidden_layers", 1, 4096), vocab = r.integer("vocab_size", 1, 1 << 24),
              kv = r.integer("num_key_value_heads", 1, 1024, heads), wide = r.integer("intermediate_size", 1, 1 << 20);
    if (c % heads) r.fail("num_attention_heads", "hidden_size " + std::to_string(c) + " is not a multiple of it");
    if (heads % kv) r.fail("num_key_value_heads", "num_attention_heads is not a multiple of it");
    if (r.integer("head_dim", 1, 1 << 16, c / heads) != c / heads)
        r.fail("head_dim",
               "mirrored's attention has heads of hidden_size / num_attention_heads = " + std::to_string(c / heads));
    if (const std::string act = r.text("hidden_act", "silu"); act != "silu")
        r.fail("hidden_act", "'" + act + "': mirrored's llama_block has silu (SwiGLU)");
    const std::string scaling = rope_scaling_keys(r);
    if (r.boolean("mlp_bias", false)) r.fail("mlp_bias", "true is not supported");
    const int positions = r.integer("max_position_embeddings", 1, INT32_MAX, 2048);
    if (type == "mistral" && r.has("sliding_window") && r.integer("sliding_window", 1, INT32_MAX) < positions)
        r.fail("sliding_window", "sliding-window attention is not supported (expected null)");
    if (type == "qwen2" && r.boolean("use_sliding_window", false))
        r.fail("use_sliding_window", "sliding-window attention is not supported (expected false)");
    const double theta = r.number("rope_theta", 1.0, 1e9, 10000.0), eps = r.number("rms_norm_eps", 1e-12, 1.0, 1e-6);
    // Qwen2 has biases on q, k and v (not on o_proj) without saying so in its config
    const bool qwen2 = type == "qwen2", bias = qwen2 || r.boolean("attention_bias", false),
               tied = r.boolean("tie_word_embeddings", false);
    std::string y = "[{type: embedding, vocab: " + std::to_string(vocab) + ", dim: " + std::to_string(c) + "}";
    for (int i = 0; i < layers; ++i)
        y += ", {type: llama_block, heads: " + std::to_string(heads) + ", kv_heads: " + std::to_string(kv) +
             ", intermediate_size: " + std::to_string(wide) + ", rope_theta: " + decimal_text(theta) +
             ", epsilon: " + decimal_text(eps) + scaling + (bias ? ", bias: true" : "") +
             (qwen2 ? ", out_bias: false" : "") + "}";
    return {y + ", {type: rmsnorm, epsilon: " + decimal_text(eps) + "}, {type: lm_head, " +
                (tied ? "tie_weights: true}]" : "tie_weights: false, units: " + std::to_string(vocab) + "}]"),
            positions};
}

int int_field(const LayerSpec& s, const char* key) { return std::atoi(s.field(key).c_str()); }

// The model's layers as one of Hugging Face's architectures, or why not.
enum class HfArch { gpt2, llama };
HfArch hf_arch(const std::vector<LayerSpec>& layers, const std::string& what) {
    const size_t n = layers.size();
    const auto fail = [&](const std::string& why) {
        throw ConfigError(what, why +
                                    "; Hugging Face's GPT-2 is embedding, position_embedding, transformer_block x N "
                                    "(all alike), layernorm, a tied lm_head; its Llama is embedding, llama_block x N "
                                    "(all alike), rmsnorm, lm_head");
    };
    const bool llama = n >= 4 && layers[1].type == "llama_block";
    const size_t first = llama ? 1 : 2;
    if (n < first + 3 || layers[0].type != "embedding" || layers[n - 1].type != "lm_head" ||
        layers[n - 2].type != (llama ? "rmsnorm" : "layernorm") ||
        (!llama && (layers[1].type != "position_embedding" || layers[2].type != "transformer_block")))
        fail("the model is not written in either order");
    for (size_t k = first; k + 2 < n; ++k) {
        const std::string at = "model.layers." + std::to_string(k) + ": ";
        if (layers[k].type != layers[first].type) fail(at + layers[k].type);
        const auto keys = [](const LayerSpec& s) {  // dropout, a training choice, is not part of the model
            Fields f = s.fields();
            std::erase_if(f, [](const auto& kv) { return kv.first == "dropout"; });
            return f;
        };
        if (keys(layers[k]) != keys(layers[first])) fail(at + "its keys differ from the first block's");
    }
    if (llama && layers[first].field("bias") != "true" && layers[first].field("out_bias") == "true")
        fail("model.layers.1: out_bias: true without bias: neither Llama nor Qwen2 has a bias on o_proj alone");
    if (llama && layers[n - 1].field("tie_weights") == "false" &&
        layers[n - 1].field("units") != layers[0].field("vocab"))
        fail("model.layers." + std::to_string(n - 1) + ": the head scores " + layers[n - 1].field("units") +
             " tokens, the embedding has " + layers[0].field("vocab") + " (Hugging Face's Llama has one vocab_size)");
    if (layers[n - 2].field("epsilon") != layers[first].field("epsilon"))
        fail("model.layers." + std::to_string(n - 2) + ": its epsilon differs from the blocks'");
    if (!llama) {
        if (layers[n - 1].field("tie_weights") == "false") fail("GPT-2's lm_head is tied to the embedding");
    }
    return llama ? HfArch::llama : HfArch::gpt2;
}

const TensorInfo& tensor_of(const Model& model, const std::string& name) {
    const TensorInfo* t = model.find(name);
    if (!t) throw std::logic_error("hf_tensors: the model has no tensor " + name);
    return *t;
}

}  // namespace

HfModelConfig hf_model_config(const std::string& dir) {
    const std::string path = (fs::path(dir) / "config.json").string();
    std::error_code ec;
    if (!fs::is_directory(dir, ec))
        throw ConfigError(dir +
                          ": not a folder (expected a Hugging Face model folder: config.json, "
                          "model.safetensors)");
    const json j = read_json(path, "a Hugging Face model folder has one");
    if (!j.is_object()) throw ConfigError(path + ": expected a JSON object");
    const HfConfigReader r{j, path};
    const std::string type = r.text("model_type", "");
    if (type == "gpt2") return gpt2_layers(r);
    if (type == "llama" || type == "mistral" || type == "qwen2") return llama_layers(r, type);
    throw ConfigError(path + ": model_type: " + (type.empty() ? std::string("missing") : "'" + type + "'") +
                      ": mirrored builds gpt2, llama, mistral and qwen2 models");
}

std::optional<int> hf_end_of_text(const std::string& dir) {
    const json j = read_json((fs::path(dir) / "config.json").string(), "a Hugging Face model folder has one");
    if (!j.is_object() || !j.contains("eos_token_id")) return std::nullopt;
    const json& e =
        j["eos_token_id"].is_array() && !j["eos_token_id"].empty() ? j["eos_token_id"][0] : j["eos_token_id"];
    if (!e.is_number_integer() || e.get<int64_t>() < 0 || e.get<int64_t>() > INT32_MAX) return std::nullopt;
    return int(e.get<int64_t>());
}

std::vector<HfTensor> hf_tensors(const Model& model, const std::string& what) {
    const std::vector<LayerSpec>& layers = model.layers();
    const HfArch arch = hf_arch(layers, what);
    const size_t n = layers.size();
    std::vector<HfTensor> out;
    const auto add = [&](const std::string& hf, const std::string& ours, int row = 0, int rows = -1,
                         bool transposed = false) {
        std::vector<int> shape = tensor_of(model, ours).shape;
        if (rows >= 0) shape[0] = rows;
        if (transposed) std::swap(shape[0], shape[1]);
        out.push_back({hf, shape, ours, row, transposed});
    };
    const auto L = [](size_t k) { return "layers." + std::to_string(k) + "."; };
    if (arch == HfArch::gpt2) {
        add("transformer.wte.weight", "layers.0.weight");
        add("transformer.wpe.weight", "layers.1.weight");
        for (size_t k = 2; k + 2 < n; ++k) {
            const std::string h = "transformer.h." + std::to_string(k - 2) + ".";
            for (const char* ln : {"ln_1", "ln_2"})
                for (const char* p : {".weight", ".bias"}) add(h + ln + p, L(k) + ln + p);
            for (const char* lin : {"attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"}) {
                add(h + lin + ".weight", L(k) + lin + ".weight", 0, -1, true);
                add(h + lin + ".bias", L(k) + lin + ".bias");
            }
        }
        add("transformer.ln_f.weight", L(n - 2) + "weight");
        add("transformer.ln_f.bias", L(n - 2) + "bias");
        return out;
    }
    const LayerSpec& block = layers[1];
    const int c = tensor_of(model, "layers.0.weight").shape[1], heads = int_field(block, "heads"),
              kv = int_field(block, "kv_heads"), wide = int_field(block, "intermediate_size"), d = c / heads;
    add("model.embed_tokens.weight", "layers.0.weight");
    for (size_t k = 1; k + 2 < n; ++k) {
        const std::string h = "model.layers." + std::to_string(k - 1) + ".", l = L(k);
        add(h + "input_layernorm.weight", l + "input_layernorm.weight");
        for (const char* p : {"weight", "bias"}) {
            if (std::string(p) == "bias" && block.field("bias") != "true") continue;
            const std::string qkv = l + "self_attn.qkv_proj." + p;
            add(h + "self_attn.q_proj." + p, qkv, 0, heads * d);
            add(h + "self_attn.k_proj." + p, qkv, heads * d, kv * d);
            add(h + "self_attn.v_proj." + p, qkv, (heads + kv) * d, kv * d);
            if (std::string(p) == "weight" || block.field("out_bias") != "false")
                add(h + "self_attn.o_proj." + p, l + "self_attn.o_proj." + p);
        }
        add(h + "post_attention_layernorm.weight", l + "post_attention_layernorm.weight");
        add(h + "mlp.gate_proj.weight", l + "mlp.gate_up_proj.weight", 0, wide);
        add(h + "mlp.up_proj.weight", l + "mlp.gate_up_proj.weight", wide, wide);
        add(h + "mlp.down_proj.weight", l + "mlp.down_proj.weight");
    }
    add("model.norm.weight", L(n - 2) + "weight");
    if (layers[n - 1].field("tie_weights") == "false") add("lm_head.weight", L(n - 1) + "weight");
    return out;
}

namespace {

// Hugging Face's model files in a folder: model.safetensors, or the shards the index names.
std::vector<std::string> hf_weight_files(const std::string& dir, std::map<std::string, std::string>& shard_of) {
    const fs::path folder(dir), single = folder / "model.safetensors", index = folder / "model.safetensors.index.json";
    std::error_code ec;
    if (fs::exists(index, ec)) {
        const json j = read_json(index.string(), "the index of a sharded checkpoint");
        if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
            throw CheckpointError(index.string() + ": expected an object with a weight_map of tensor -> file");
        std::vector<std::string> files;
        for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
            if (!it->is_string() || it->get<std::string>().find('/') != std::string::npos)
                throw CheckpointError(index.string() + ": weight_map." + it.key() +
                                      ": expected a file name in the folder");
            const std::string file = (folder / it->get<std::string>()).string();
            shard_of[it.key()] = file;
            if (std::find(files.begin(), files.end(), file) == files.end()) {
                if (!fs::is_regular_file(file, ec))
                    throw CheckpointError(index.string() + ": weight_map." + it.key() + " names " + file +
                                          ", which is missing (an incomplete download?)");
                files.push_back(file);
            }
        }
        if (files.empty()) throw CheckpointError(index.string() + ": the weight_map is empty");
        return files;
    }
    if (fs::exists(single, ec)) return {single.string()};
    if (fs::exists(folder / "pytorch_model.bin", ec))
        throw CheckpointError(dir +
                              ": holds pytorch_model.bin (a pickle), which mirrored does not read; "
                              "convert it to model.safetensors with Hugging Face's safetensors package");
    throw CheckpointError(dir + ": no model.safetensors nor model.safetensors.index.json");
}

bool ends_with(const std::string& s, const std::string& tail) {
    return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// What Hugging Face saves besides the weights: GPT-2's attention masks, rotary inverse frequencies.
bool hf_buffer(const std::string& name) {
    return ends_with(name, ".attn.bias") || ends_with(name, ".attn.masked_bias") ||
           ends_with(name, ".rotary_emb.inv_freq");
}

}  // namespace

void read_hf_weights(const std::string& dir, const Model& model, float* params) {
    read_hf_weights(
        dir, model, [params](size_t offset, const float* v, size_t n) { std::copy(v, v + n, params + offset); },
        [params](size_t offset, float* v, size_t n) { std::copy(params + offset, params + offset + n, v); });
}

void read_hf_weights(const std::string& dir, const Model& model, const ParamPut& put, const ParamGet& get) {
    const std::vector<HfTensor> wanted = hf_tensors(model, "model.init_from: " + dir);
    std::map<std::string, std::string> shard_of;
    const std::vector<std::string> files = hf_weight_files(dir, shard_of);
    std::map<std::string, const HfTensor*> by_name;
    for (const HfTensor& t : wanted) by_name[t.name] = &t;
    // GPT-2's own files name GPT2Model's tensors (h.0..., wte) where GPT2LMHeadModel's add "transformer."
    const auto hf_name = [](const std::string& stored) {
        static const char* kBare[] = {"h.", "wte.", "wpe.", "ln_f."};
        for (const char* p : kBare)
            if (stored.rfind(p, 0) == 0) return "transformer." + stored;
        return stored;
    };
    std::set<std::string> done;
    std::vector<float> scratch, dst;
    std::string tied_head;  // a file holding a tied lm_head.weight: compared with the embedding at the end
    for (const std::string& file : files) {
        const MappedSafetensors st(file);
        for (const auto& [stored, e] : st.tensors()) {
            const std::string name = hf_name(stored);
            if (!shard_of.empty() && shard_of.count(stored) && shard_of.at(stored) != file)
                continue;  // the index places it in another shard
            const auto it = by_name.find(name);
            if (it == by_name.end()) {
                if (hf_buffer(name)) continue;
                if (name == "lm_head.weight" && model.layers().back().field("tie_weights") != "false") {
                    tied_head = file;
                    continue;
                }
                throw CheckpointError(file + ": tensor " + stored +
                                      " belongs to no layer of the model config.json describes");
            }
            const HfTensor& t = *it->second;
            if (!done.insert(name).second) throw CheckpointError(file + ": tensor " + stored + " is stored twice");
            if (!SafetensorsEntry::is_float(e.dtype))
                throw CheckpointError(file + ": tensor " + stored + " is " + e.dtype +
                                      ", expected F32, BF16, F16 or F64");
            if (e.shape != t.shape)
                throw CheckpointError(file + ": tensor " + stored + " is " + shape_str(e.shape) + ", config.json's " +
                                      "model has " + shape_str(t.shape));
            const TensorInfo& ours = *model.find(t.ours);
            const size_t cols = ours.shape.size() > 1 ? size_t(ours.count / size_t(ours.shape[0])) : 1;
            const uint64_t rows = e.shape.empty() ? 1 : uint64_t(e.shape[0]), count = e.count();
            dst.resize(size_t(count));  // the tensor in the model's layout: rows t.row.. of ours
            if (t.transposed) {         // [in, out] -> rows of out
                scratch.resize(size_t(count));
                st.read_rows(stored, 0, rows, scratch.data());
                const size_t in = size_t(e.shape[0]), outs = size_t(e.shape[1]);
                for (size_t i = 0; i < in; ++i)
                    for (size_t o = 0; o < outs; ++o) dst[o * in + i] = scratch[i * outs + o];
            } else {
                st.read_rows(stored, 0, rows, dst.data());
            }
            for (uint64_t i = 0; i < count; ++i)
                if (!std::isfinite(dst[i]))
                    throw CheckpointError(file + ": tensor " + stored + " holds a non-finite value (" +
                                          decimal_text(dst[i]) + " at element " + std::to_string(i) + ")");
            put(ours.offset + size_t(t.row) * cols, dst.data(), dst.size());
        }
    }
    for (const HfTensor& t : wanted)
        if (!done.count(t.name))
            throw CheckpointError(dir + ": tensor " + t.name + " " + shape_str(t.shape) +
                                  " is missing (config.json's model needs it)");
    if (!tied_head.empty()) {  // saved although tied: it must be the embedding
        const MappedSafetensors st(tied_head);
        const TensorInfo& embed = *model.find("layers.0.weight");
        const SafetensorsEntry& e = st.tensors().at("lm_head.weight");
        if (e.shape != embed.shape || !SafetensorsEntry::is_float(e.dtype))
            throw CheckpointError(tied_head + ": lm_head.weight differs from the embedding, but config.json ties them");
        scratch.resize(embed.count);
        st.read_rows("lm_head.weight", 0, uint64_t(e.shape[0]), scratch.data());
        dst.resize(embed.count);
        get(embed.offset, dst.data(), embed.count);
        if (scratch != dst)
            throw CheckpointError(tied_head +
                                  ": lm_head.weight differs from the embedding, but config.json ties "
                                  "them (tie_word_embeddings)");
    }
}

HfModelFiles hf_model_files(const Model& model, const float* params) {
    const std::vector<HfTensor> tensors = hf_tensors(model, "export --names hf");
    HfModelFiles m;
    for (const HfTensor& t : tensors) {
        const TensorInfo& ours = *model.find(t.ours);
        const size_t cols = ours.shape.size() > 1 ? size_t(ours.count / size_t(ours.shape[0])) : 1;
        const float* src = params + ours.offset + size_t(t.row) * cols;
        size_t count = 1;
        for (int d : t.shape) count *= size_t(d);
        std::vector<float> v(count);
        if (t.transposed) {
            const size_t in = size_t(t.shape[0]), outs = size_t(t.shape[1]);
            for (size_t i = 0; i < in; ++i)
                for (size_t o = 0; o < outs; ++o) v[i * outs + o] = src[o * in + i];
        } else {
            std::copy(src, src + count, v.begin());
        }
        m.weights.tensors[t.name] = {t.shape, std::move(v)};
    }
    m.weights.metadata = {{"format", "pt"}};
    const std::vector<LayerSpec>& layers = model.layers();
    const LayerSpec& block = layers[layers[1].type == "llama_block" ? 1 : 2];
    const int vocab = tensor_of(model, "layers.0.weight").shape[0], c = tensor_of(model, "layers.0.weight").shape[1],
              heads = int_field(block, "heads"), blocks = int(layers.size()) - (block.type == "llama_block" ? 3 : 4);
    const double eps = std::strtod(block.field("epsilon").c_str(), nullptr);
    json config;
    if (block.type == "transformer_block") {
        const int positions = tensor_of(model, "layers.1.weight").shape[0];
        config = {{"architectures", {"GPT2LMHeadModel"}},
                  {"model_type", "gpt2"},
                  {"n_embd", c},
                  {"n_head", heads},
                  {"n_layer", blocks},
                  {"n_positions", positions},
                  {"n_ctx", positions},
                  {"n_inner", c * int_field(block, "mlp_ratio")},
                  {"vocab_size", vocab},
                  {"layer_norm_epsilon", eps},
                  {"activation_function", block.field("activation") == "gelu_tanh" ? "gelu_new" : "gelu"},
                  {"resid_pdrop", 0.0},
                  {"embd_pdrop", 0.0},
                  {"attn_pdrop", 0.0},
                  {"tie_word_embeddings", true},
                  {"initializer_range", 0.02},
                  {"torch_dtype", "float32"}};
    } else {
        const int kv = int_field(block, "kv_heads");
        // biases on q, k and v but not o_proj: Hugging Face's Qwen2 (Llama's attention_bias has both)
        const bool qwen2 = block.field("bias") == "true" && block.field("out_bias") == "false";
        config = {{"architectures", {qwen2 ? "Qwen2ForCausalLM" : "LlamaForCausalLM"}},
                  {"model_type", qwen2 ? "qwen2" : "llama"},
                  {"hidden_size", c},
                  {"intermediate_size", int_field(block, "intermediate_size")},
                  {"num_attention_heads", heads},
                  {"num_key_value_heads", kv},
                  {"head_dim", c / heads},
                  {"num_hidden_layers", blocks},
                  {"rms_norm_eps", eps},
                  {"rope_theta", std::strtod(block.field("rope_theta").c_str(), nullptr)},
                  {"rope_scaling", nullptr},
                  {"vocab_size", vocab},
                  {"max_position_embeddings", model.input_features()},
                  {"tie_word_embeddings", layers.back().field("tie_weights") != "false"},
                  {"attention_bias", block.field("bias") == "true"},
                  {"mlp_bias", false},
                  {"hidden_act", "silu"},
                  {"initializer_range", 0.02},
                  {"torch_dtype", "float32"}};
        if (qwen2) {
            config.erase("attention_bias");
            config.erase("mlp_bias");
            config["use_sliding_window"] = false;
            config["sliding_window"] = nullptr;
        }
        if (const std::string kind = block.field("rope_scaling"); !kind.empty() && kind != "none") {
            const auto number = [&](const char* key) { return std::strtod(block.field(key).c_str(), nullptr); };
            json s = {{"rope_type", kind}, {"factor", number("rope_factor")}};
            if (kind == "llama3") {
                s["low_freq_factor"] = number("rope_low_freq_factor");
                s["high_freq_factor"] = number("rope_high_freq_factor");
                s["original_max_position_embeddings"] = int_field(block, "rope_original_max_positions");
            }
            config["rope_scaling"] = s;
        }
    }
    m.config_json = config.dump(2) + "\n";
    return m;
}

namespace {

// Each LoRA adapter of the model with Hugging Face's module it adapts.
struct AdapterOf {
    LoraSlice slice;
    std::string weight;  // ours
    std::string module;  // Hugging Face's (q_proj's full name)
};
std::vector<AdapterOf> adapters_of(const Model& model) {
    const std::vector<HfTensor> table = hf_tensors(model, "export --names hf");
    std::vector<AdapterOf> out;
    for (const auto& [weight, slices] : model.adaptation().lora)
        for (const LoraSlice& s : slices)
            for (const HfTensor& t : table)
                if (t.ours == weight && t.row == s.row)
                    out.push_back({s, weight, t.name.substr(0, t.name.size() - std::string(".weight").size())});
    return out;
}

std::vector<float> tensor_values(const Model& model, const float* params, const std::string& name) {
    const TensorInfo& t = tensor_of(model, name);
    return std::vector<float>(params + t.offset, params + t.offset + t.count);
}

}  // namespace

HfModelFiles hf_adapter_files(const Model& model, const float* params, const std::string& base_model) {
    const Adaptation& a = model.adaptation();
    HfModelFiles m;
    std::set<std::string> targets;
    for (const AdapterOf& ad : adapters_of(model)) {
        for (const char* part : {".lora_A.weight", ".lora_B.weight"}) {
            const TensorInfo& t = tensor_of(model, ad.slice.name + part);
            m.weights.tensors["base_model.model." + ad.module + part] = {t.shape, tensor_values(model, params, t.name)};
        }
        targets.insert(ad.module.substr(ad.module.rfind('.') + 1));
    }
    m.weights.metadata = {{"format", "pt"}};
    const bool gpt2 = model.layers()[1].type == "position_embedding";
    const json config = {{"peft_type", "LORA"},
                         {"task_type", "CAUSAL_LM"},
                         {"r", a.lora_rank},
                         {"lora_alpha", a.lora_alpha},
                         {"lora_dropout", a.lora_dropout},
                         {"target_modules", std::vector<std::string>(targets.begin(), targets.end())},
                         {"bias", "none"},
                         {"fan_in_fan_out", gpt2},
                         {"inference_mode", true},
                         {"base_model_name_or_path", base_model}};
    m.config_json = config.dump(2) + "\n";
    return m;
}

std::vector<float> merged_params(const Model& model, const float* params) {
    std::vector<float> out(params, params + model.flat_size());
    const Adaptation& a = model.adaptation();
    for (const AdapterOf& ad : adapters_of(model)) {
        const TensorInfo& w = tensor_of(model, ad.weight);
        const std::vector<float> A = tensor_values(model, params, ad.slice.name + ".lora_A.weight"),
                                 B = tensor_values(model, params, ad.slice.name + ".lora_B.weight");
        const size_t in = w.count / size_t(w.shape[0]), r = size_t(a.lora_rank);
        for (size_t i = 0; i < size_t(ad.slice.rows); ++i)
            for (size_t j = 0; j < in; ++j) {
                double sum = 0;  // (B A)[i, j], in double: one rounding into the weight
                for (size_t k = 0; k < r; ++k) sum += double(B[i * r + k]) * double(A[k * in + j]);
                out[w.offset + (size_t(ad.slice.row) + i) * in + j] += float(double(a.lora_scale) * sum);
            }
    }
    return out;
}

}  // namespace mirrored
