#include "mirrored/export_names.h"

#include <cstdlib>

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

}  // namespace mirrored
