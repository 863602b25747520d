#include "mirrored/adaptation.h"

#include <fnmatch.h>

#include <algorithm>
#include <set>

#include "base/error.h"
#include "mirrored/hf_models.h"

namespace mirrored {

Adaptation make_adaptation(const ModelConfig& m, const std::vector<int>& input_shape, uint64_t seed) {
    Adaptation a;
    a.freeze = m.freeze;
    if (m.lora.rank == 0) return a;
    a.freeze_all = true;
    a.lora_rank = m.lora.rank;
    a.lora_scale = float(m.lora.alpha / m.lora.rank);
    a.lora_alpha = m.lora.alpha;
    a.lora_dropout = m.lora.dropout;
    const Model base(input_shape, m.layers, seed);
    std::set<std::string> modules, matched;
    for (const HfTensor& t : hf_tensors(base, "model.lora")) {
        const std::string suffix = ".weight";
        if (t.name.size() <= suffix.size() || t.name.compare(t.name.size() - suffix.size(), suffix.size(), suffix))
            continue;
        const std::string module = t.name.substr(0, t.name.size() - suffix.size());
        const std::string shortname = module.substr(module.rfind('.') + 1);
        if (t.shape.size() != 2 || shortname == "embed_tokens" || shortname == "wte" || shortname == "wpe" ||
            shortname == "lm_head")
            continue;  // projections only
        modules.insert(shortname);
        if (std::find(m.lora.targets.begin(), m.lora.targets.end(), shortname) == m.lora.targets.end()) continue;
        matched.insert(shortname);
        const std::string ours = t.ours.substr(0, t.ours.size() - suffix.size());
        LoraSlice s;
        s.row = t.row;
        s.rows = t.transposed ? t.shape[1] : t.shape[0];
        s.name = ours.substr(0, ours.rfind('.') + 1) + shortname;
        a.lora[t.ours].push_back(s);
    }
    for (const std::string& target : m.lora.targets)
        if (!matched.count(target)) {
            std::string known;
            for (const std::string& k : modules) known += (known.empty() ? "" : ", ") + k;
            throw ConfigError("model.lora.targets",
                              "'" + target + "' names no module of the model (its modules: " + known + ")");
        }
    return a;
}

std::unique_ptr<Model> build_model(const Config& c, std::vector<int> input_shape, bool recompute_blocks,
                                   size_t gradient_piece_floats) {
    if (input_shape.empty()) input_shape = c.model.input_shape;
    auto model = std::make_unique<Model>(input_shape, c.model.layers, c.run.seed, recompute_blocks,
                                         gradient_piece_floats, make_adaptation(c.model, input_shape, c.run.seed));
    for (const std::string& pattern : c.model.freeze) {  // a pattern that freezes nothing is a mistake
        bool matched = false;
        for (const TensorInfo& t : model->tensors())
            matched = matched || ::fnmatch(pattern.c_str(), t.name.c_str(), 0) == 0;
        if (!matched)
            throw ConfigError("model.freeze", "'" + pattern + "' matches no tensor (the names are those of export: " +
                                                  model->tensors().front().name + ", ..., " +
                                                  model->tensors().back().name + ")");
    }
    return model;
}

}  // namespace mirrored
