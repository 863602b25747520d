// Layer specs for tests, as a config would give them.
#pragma once

#include <string>
#include <vector>

#include "mirrored/layers/layer.h"

namespace mirrored::test {

inline LayerSpec dense(int units, Activation act, bool bias = true) {
    LayerSpec s;
    s.type = "dense";
    s.units = units;
    s.activation = act;
    s.bias = bias;
    s.init = act == Activation::none ? InitKind::glorot_uniform : InitKind::he_uniform;
    return s;
}
inline LayerSpec dropout(float rate) {
    LayerSpec s;
    s.type = "dropout";
    s.rate = rate;
    return s;
}
inline LayerSpec flatten() {
    LayerSpec s;
    s.type = "flatten";
    return s;
}
inline LayerSpec conv_pad(int filters, int kernel, int stride, int padding, Activation act, bool bias = true) {
    LayerSpec s;
    s.type = "conv2d";
    s.filters = filters;
    s.kernel = kernel;
    s.stride = stride;
    s.padding = padding;
    s.activation = act;
    s.bias = bias;
    s.init = act == Activation::none ? InitKind::glorot_uniform : InitKind::he_uniform;
    return s;
}
// same: (kernel - 1) / 2 zeros on every side; otherwise none
inline LayerSpec conv(int filters, int kernel, int stride, bool same, Activation act, bool bias = true) {
    LayerSpec s = conv_pad(filters, kernel, stride, 0, act, bias);
    s.same = same;
    return s;
}
inline LayerSpec maxpool_pad(int kernel, int stride, int padding) {
    LayerSpec s;
    s.type = "maxpool2d";
    s.kernel = kernel;
    s.stride = stride;
    s.padding = padding;
    return s;
}
inline LayerSpec maxpool(int kernel) { return maxpool_pad(kernel, kernel, 0); }
inline LayerSpec avgpool(int kernel, int stride, int padding) {
    LayerSpec s = maxpool_pad(kernel, stride, padding);
    s.type = "avgpool2d";
    return s;
}
inline LayerSpec global_avgpool() {
    LayerSpec s;
    s.type = "global_avgpool";
    return s;
}
inline LayerSpec batchnorm(bool sync, Activation act) {
    LayerSpec s;
    s.type = "batchnorm";
    s.sync = sync;
    s.activation = act;
    return s;
}
inline LayerSpec layernorm() {
    LayerSpec s;
    s.type = "layernorm";
    return s;
}
inline LayerSpec residual(std::vector<LayerSpec> layers, const std::string& shortcut, Activation act) {
    LayerSpec s;
    s.type = "residual";
    s.layers = std::move(layers);
    s.shortcut = shortcut;
    s.activation = act;
    return s;
}

}  // namespace mirrored::test
