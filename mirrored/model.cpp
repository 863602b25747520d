// Sequential model: layout of the flat buffers and the forward/backward passes over them.
#include "mirrored/model.h"

#include <algorithm>
#include <cstdio>
#include <numeric>

#include "kernels/error.h"

namespace mirrored {

const char* layer_type_name(LayerSpec::Type t) {
    switch (t) {
    case LayerSpec::Type::dense: return "dense";
    case LayerSpec::Type::dropout: return "dropout";
    default: return "flatten";
    }
}

Model::Model(std::vector<int> input_shape, std::vector<LayerSpec> layers, uint64_t seed)
    : input_shape_(std::move(input_shape)), layers_(std::move(layers)) {
    if (input_shape_.empty()) throw ConfigError("model.input_shape", "expected at least one dimension");
    for (int d : input_shape_)
        if (d <= 0) throw ConfigError("model.input_shape", "dimensions must be positive");
    if (layers_.empty()) throw ConfigError("model.layers", "expected at least one layer");
    const int features = std::accumulate(input_shape_.begin(), input_shape_.end(), 1,
                                         [](int a, int b) { return a * b; });
    widths_.push_back(features);
    bool flat = input_shape_.size() == 1;
    size_t offset = 0;
    auto add_tensor = [&](const std::string& name, std::vector<int> shape, int layer, InitArgs init) {
        TensorInfo t;
        t.name = name;
        t.shape = std::move(shape);
        t.count = 1;
        for (int d : t.shape) t.count *= static_cast<size_t>(d);
        t.offset = offset;
        t.layer = layer;
        t.init = init;
        t.init.tensor_id = static_cast<uint32_t>(tensors_.size());
        t.init.seed = seed;
        offset += (t.count + kTensorAlign - 1) / kTensorAlign * kTensorAlign;
        param_count_ += t.count;
        tensors_.push_back(std::move(t));
        return static_cast<int>(tensors_.size() - 1);
    };
    for (size_t l = 0; l < layers_.size(); ++l) {
        const LayerSpec& spec = layers_[l];
        const std::string key = "model.layers." + std::to_string(l);
        const int in = widths_.back();
        int w = -1, b = -1;
        switch (spec.type) {
        case LayerSpec::Type::flatten:
            flat = true;
            widths_.push_back(in);
            break;
        case LayerSpec::Type::dropout:
            if (!(spec.rate >= 0.0f && spec.rate < 1.0f))
                throw ConfigError(key + ".rate", "expected a number in [0, 1)");
            widths_.push_back(in);
            break;
        case LayerSpec::Type::dense: {
            if (!flat)
                throw ConfigError(key, "dense needs a flat input; add {type: flatten} before it");
            if (spec.units <= 0) throw ConfigError(key + ".units", "expected a positive integer");
            InitArgs wi;
            wi.kind = spec.init;
            wi.fan_in = in;
            wi.fan_out = spec.units;
            const std::string prefix = "layers." + std::to_string(l);
            w = add_tensor(prefix + ".weight", {spec.units, in}, static_cast<int>(l), wi);
            if (spec.bias) b = add_tensor(prefix + ".bias", {spec.units}, static_cast<int>(l), InitArgs{});
            widths_.push_back(spec.units);
            break;
        }
        }
        weight_tensor_.push_back(w);
        bias_tensor_.push_back(b);
    }
    if (tensors_.empty()) throw ConfigError("model.layers", "the model has no trainable layer (add a dense layer)");
    flat_size_ = offset;
}

int Model::widest() const { return *std::max_element(widths_.begin(), widths_.end()); }

const TensorInfo* Model::find(const std::string& name) const {
    for (const auto& t : tensors_)
        if (t.name == name) return &t;
    return nullptr;
}

std::string Model::summary() const {
    std::string s;
    char line[160];
    for (size_t l = 0; l < layers_.size(); ++l) {
        const LayerSpec& spec = layers_[l];
        size_t params = 0;
        if (weight_tensor_[l] >= 0) params += tensors_[weight_tensor_[l]].count;
        if (bias_tensor_[l] >= 0) params += tensors_[bias_tensor_[l]].count;
        std::string detail;
        if (spec.type == LayerSpec::Type::dense)
            detail = std::string(" ") + activation_name(spec.activation);
        if (spec.type == LayerSpec::Type::dropout) {
            char r[32];
            std::snprintf(r, sizeof r, " rate %.2f", spec.rate);
            detail = r;
        }
        std::snprintf(line, sizeof line, "  layers.%-3zu %-8s %6d -> %-6d%-14s %10zu params\n", l,
                      layer_type_name(spec.type), widths_[l], widths_[l + 1], detail.c_str(), params);
        s += line;
    }
    std::snprintf(line, sizeof line, "  total %zu parameters (%.2f MiB fp32)\n", param_count_,
                  param_count_ * 4.0 / 1048576.0);
    s += line;
    return s;
}

double Model::train_flops_per_sample() const {
    double flops = 0;
    bool first = true;
    for (size_t l = 0; l < layers_.size(); ++l) {
        if (layers_[l].type != LayerSpec::Type::dense) continue;
        const double macs = double(widths_[l]) * widths_[l + 1];
        flops += 2 * macs * (first ? 2 : 3);  // forward, dW, and dX except for the first layer
        first = false;
    }
    return flops;
}

void Model::init_params(Device& dev, Stream s, float* params) const {
    dev.fill(s, flat_size_, 0.0f, params);
    for (const auto& t : tensors_) dev.init_params(s, t.init, t.count, params + t.offset);
}

uint64_t Model::activation_floats(int max_rows) const {
    const uint64_t rows = uint64_t(std::max(max_rows, 1));
    uint64_t floats = 2 * rows * uint64_t(widest());  // the two gradient buffers
    for (size_t l = 0; l < layers_.size(); ++l) {
        const uint64_t w = uint64_t(widths_[l + 1]);
        if (layers_[l].type == LayerSpec::Type::dense)
            floats += rows * w * (layers_[l].activation != Activation::none ? 2 : 1);
        else if (layers_[l].type == LayerSpec::Type::dropout)
            floats += rows * w;
    }
    return floats;
}

Activations::Activations(Device& dev, const Model& model, int max_rows) : max_rows_(max_rows) {
    const size_t rows = static_cast<size_t>(std::max(max_rows, 1));
    const auto& layers = model.layers();
    out_.resize(layers.size());
    pre_.resize(layers.size());
    in_.resize(layers.size());
    for (size_t l = 0; l < layers.size(); ++l) {
        const size_t width = static_cast<size_t>(model.width(static_cast<int>(l)));
        if (layers[l].type == LayerSpec::Type::dense) {
            out_[l] = DeviceBuffer<float>(dev, rows * width);
            if (layers[l].activation != Activation::none) pre_[l] = DeviceBuffer<float>(dev, rows * width);
        } else if (layers[l].type == LayerSpec::Type::dropout) {
            out_[l] = DeviceBuffer<float>(dev, rows * width);
        }
    }
    for (auto& g : grad_) g = DeviceBuffer<float>(dev, rows * static_cast<size_t>(model.widest()));
}

const float* Model::forward(const PassContext& ctx, const float* params, const float* x,
                            Activations& acts) const {
    if (ctx.rows > acts.max_rows())
        throw Error(kExitFailure, "forward: " + std::to_string(ctx.rows) + " rows exceed the " +
                                      std::to_string(acts.max_rows()) + " activations were sized for");
    Device& dev = *ctx.device;
    const float* cur = x;
    for (size_t l = 0; l < layers_.size(); ++l) {
        const LayerSpec& spec = layers_[l];
        acts.in_[l] = cur;
        const int in = widths_[l], out = widths_[l + 1];
        if (spec.type == LayerSpec::Type::dense) {
            const float* w = params + tensors_[weight_tensor_[l]].offset;
            const float* b = bias_tensor_[l] >= 0 ? params + tensors_[bias_tensor_[l]].offset : nullptr;
            float* y = acts.out_[l].data();
            float* z = spec.activation == Activation::none ? y : acts.pre_[l].data();
            // z[rows, out] = x[rows, in] . W[out, in]^T
            dev.gemm(ctx.stream, false, true, ctx.rows, out, in, 1.0f, cur, in, w, in, 0.0f, z, out);
            if (b || spec.activation != Activation::none)
                dev.bias_act_forward(ctx.stream, spec.activation, ctx.rows, out, b, z, y);
            cur = y;
        } else if (spec.type == LayerSpec::Type::dropout && ctx.training && spec.rate > 0.0f) {
            DropoutArgs d{spec.rate, ctx.seed, static_cast<uint32_t>(l), ctx.step, ctx.row_offset};
            dev.dropout_forward(ctx.stream, d, ctx.rows, out, cur, acts.out_[l].data());
            cur = acts.out_[l].data();
        }
    }
    return cur;
}

void Model::backward(const PassContext& ctx, const float* params, float* grads, float* dlogits,
                     Activations& acts, bool accumulate,
                     const std::function<void(int layer)>& on_layer_done) const {
    Device& dev = *ctx.device;
    float* d = dlogits;  // gradient w.r.t. the current layer's output
    int first_param_layer = static_cast<int>(layers_.size());
    for (size_t l = 0; l < layers_.size(); ++l)
        if (weight_tensor_[l] >= 0 || bias_tensor_[l] >= 0) {
            first_param_layer = static_cast<int>(l);
            break;
        }
    for (int l = static_cast<int>(layers_.size()) - 1; l >= 0; --l) {
        const LayerSpec& spec = layers_[l];
        const int in = widths_[l], out = widths_[l + 1];
        const bool need_input_grad = l > first_param_layer;
        if (spec.type == LayerSpec::Type::dropout) {
            if (need_input_grad && ctx.training && spec.rate > 0.0f) {
                DropoutArgs da{spec.rate, ctx.seed, static_cast<uint32_t>(l), ctx.step, ctx.row_offset};
                dev.dropout_backward(ctx.stream, da, ctx.rows, out, d, d);
            }
            continue;
        }
        if (spec.type != LayerSpec::Type::dense) continue;
        if (spec.activation != Activation::none)
            dev.act_backward(ctx.stream, spec.activation, size_t(ctx.rows) * out, acts.pre_[l].data(), d, d);
        const TensorInfo& wt = tensors_[weight_tensor_[l]];
        // dW[out, in] (+)= dz[rows, out]^T . x[rows, in]
        dev.gemm(ctx.stream, true, false, out, in, ctx.rows, 1.0f, d, out, acts.in_[l], in,
                 accumulate ? 1.0f : 0.0f, grads + wt.offset, in);
        if (bias_tensor_[l] >= 0)
            dev.bias_grad(ctx.stream, ctx.rows, out, d, grads + tensors_[bias_tensor_[l]].offset, accumulate);
        if (on_layer_done) on_layer_done(l);
        if (need_input_grad) {
            float* next = d == acts.grad_[0].data() ? acts.grad_[1].data() : acts.grad_[0].data();
            // dx[rows, in] = dz[rows, out] . W[out, in]
            dev.gemm(ctx.stream, false, false, ctx.rows, in, out, 1.0f, d, out, params + wt.offset, in,
                     0.0f, next, in);
            d = next;
        }
    }
}

}  // namespace mirrored
