// Layer specs for tests, as a config would give them (each read by its type's own reader).
#pragma once

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "mirrored/layers/layer.h"
#include "mirrored/model.h"

namespace mirrored::test {

// A training pass of `rows` samples over f32 parameters (their own compute copy) on d's compute stream.
inline Pass training_pass(Device& d, int rows, float* params, float* grads, Activations& acts, uint64_t seed) {
    Pass p;
    p.dev = &d;
    p.stream = d.compute_stream();
    p.rows = p.global_rows = rows;
    p.seed = seed;
    p.params = params;
    p.weights = params;
    p.grads = grads;
    p.acts = &acts;
    p.vt = d.value_dtype();
    return p;
}

inline LayerSpec dense(int units, Activation act, bool bias = true) {
    return make_layer_spec(
        "dense",
        {{"units", std::to_string(units)}, {"activation", activation_name(act)}, {"bias", bias ? "true" : "false"}});
}
inline LayerSpec dropout(float rate) { return make_layer_spec("dropout", {{"rate", std::to_string(rate)}}); }
inline LayerSpec flatten() { return make_layer_spec("flatten"); }
inline LayerSpec conv_pad(int filters, int kernel, int stride, int padding, Activation act, bool bias = true) {
    return make_layer_spec("conv2d", {{"filters", std::to_string(filters)},
                                      {"kernel_size", std::to_string(kernel)},
                                      {"stride", std::to_string(stride)},
                                      {"padding", std::to_string(padding)},
                                      {"activation", activation_name(act)},
                                      {"bias", bias ? "true" : "false"}});
}
// same: (kernel - 1) / 2 zeros on every side; otherwise none
inline LayerSpec conv(int filters, int kernel, int stride, bool same, Activation act, bool bias = true) {
    return make_layer_spec("conv2d", {{"filters", std::to_string(filters)},
                                      {"kernel_size", std::to_string(kernel)},
                                      {"stride", std::to_string(stride)},
                                      {"padding", same ? "same" : "valid"},
                                      {"activation", activation_name(act)},
                                      {"bias", bias ? "true" : "false"}});
}
inline LayerSpec maxpool_pad(int kernel, int stride, int padding, const std::string& type = "maxpool2d") {
    return make_layer_spec(type, {{"kernel_size", std::to_string(kernel)},
                                  {"stride", std::to_string(stride)},
                                  {"padding", std::to_string(padding)}});
}
inline LayerSpec maxpool(int kernel) { return maxpool_pad(kernel, kernel, 0); }
inline LayerSpec avgpool(int kernel, int stride, int padding) {
    return maxpool_pad(kernel, stride, padding, "avgpool2d");
}
inline LayerSpec global_avgpool() { return make_layer_spec("global_avgpool"); }
inline LayerSpec batchnorm(bool sync, Activation act) {
    return make_layer_spec("batchnorm", {{"sync", sync ? "true" : "false"}, {"activation", activation_name(act)}});
}
inline LayerSpec layernorm() { return make_layer_spec("layernorm"); }
inline LayerSpec rmsnorm() { return make_layer_spec("rmsnorm"); }
inline LayerSpec residual(std::vector<LayerSpec> layers, const std::string& shortcut, Activation act) {
    return make_layer_spec(
        "residual", {{"shortcut", shortcut.empty() ? "identity" : shortcut}, {"activation", activation_name(act)}},
        std::move(layers));
}

// Whether backward reported every gradient unit once - each unit that writes a gradient piece (a
// trainable tensor, a split one's block of rows) or a tied tensor - and no other (Model::backward
// throws where the order is not last first). Frozen layers (LoRA's base, model.freeze) keep their
// units and report them, with no piece for the reduce to wait on.
inline bool reported_every_unit(const Model& m, const std::vector<int>& reported) {
    std::set<int> pieces, all;
    for (const GradientPiece& p : m.gradient_pieces()) pieces.insert({p.unit, p.written_from});
    for (int u = 0; u < m.gradient_units(); ++u) all.insert(u);
    bool frozen = false;
    for (const TensorInfo& t : m.tensors()) frozen |= t.frozen;
    return reported.size() == all.size() && std::set<int>(reported.begin(), reported.end()) == all &&
           (frozen ? std::includes(all.begin(), all.end(), pieces.begin(), pieces.end()) : pieces == all);
}

}  // namespace mirrored::test
