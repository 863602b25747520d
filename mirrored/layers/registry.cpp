// The layer types, and what every type shares: the config readers' helpers, the layout builder,
// summaries. Adding a layer type: its own file with a LayerKind, and one line in layer_kinds().
#include <fnmatch.h>

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "base/error.h"
#include "kernels/ops/gemm.h"
#include "mirrored/layers/activations.h"
#include "mirrored/layers/layer.h"

namespace mirrored {

extern const LayerKind kDenseKind, kDropoutKind, kFlattenKind, kConv2dKind, kMaxPool2dKind, kAvgPool2dKind,
    kGlobalAvgPoolKind, kBatchNormKind, kLayerNormKind, kRmsNormKind, kResidualKind, kEmbeddingKind,
    kPositionEmbeddingKind, kAttentionKind, kTransformerBlockKind, kLlamaBlockKind, kSwigluKind, kLmHeadKind;

const Registry<LayerKind>& layer_kinds() {
    // one entry per type, in the order --help and error messages list them
    static const Registry<LayerKind> kinds(
        "layer type",
        {&kDenseKind, &kDropoutKind, &kFlattenKind, &kConv2dKind, &kMaxPool2dKind, &kAvgPool2dKind, &kGlobalAvgPoolKind,
         &kBatchNormKind, &kLayerNormKind, &kRmsNormKind, &kResidualKind, &kEmbeddingKind, &kPositionEmbeddingKind,
         &kAttentionKind, &kTransformerBlockKind, &kLlamaBlockKind, &kSwigluKind, &kLmHeadKind});
    return kinds;
}

std::vector<LayerSpec> read_layer_list(SpecReader& r, const std::string& path) {
    const size_t n = r.list_size(path);
    if (n == 0) r.fail(path, "expected a list of layers, e.g. [{type: flatten}, {type: dense, units: 10}]");
    std::vector<LayerSpec> out;
    for (size_t i = 0; i < n; ++i) {
        const std::string p = path + "." + std::to_string(i);
        r.expect_map(p);
        LayerSpec s;
        s.type = r.choice(p + ".type", "", layer_kinds().names());
        const LayerKind& kind = layer_kinds().get(s.type);
        if (kind.container) s.layers = read_layer_list(r, p + ".layers");
        s.options = kind.read(r, p);
        out.push_back(std::move(s));
    }
    return out;
}

LayerSpec make_layer_spec(const std::string& type, const Fields& keys, std::vector<LayerSpec> layers) {
    const LayerKind& kind = layer_kinds().get(type);
    FieldsReader r(type, keys);
    LayerSpec s;
    s.type = type;
    s.layers = std::move(layers);
    s.options = kind.read(r, type);
    r.finish();
    return s;
}

std::string LayerSpec::field(const std::string& key) const {
    for (const auto& [k, v] : fields())
        if (k == key) return v;
    return "";
}

std::string layer_spec_summary(const LayerSpec& s) {
    std::string out = s.type;
    for (const auto& [k, v] : s.fields()) out += " " + k + "=" + v;
    if (!s.layers.empty()) {
        out += " [";
        for (size_t i = 0; i < s.layers.size(); ++i) out += (i ? " | " : "") + layer_spec_summary(s.layers[i]);
        out += "]";
    }
    return out;
}

Activation read_activation(SpecReader& r, const std::string& path) {
    const std::string a = r.choice(path, "none", {"none", "relu", "gelu", "gelu_tanh"});
    return a == "relu"        ? Activation::relu
           : a == "gelu"      ? Activation::gelu
           : a == "gelu_tanh" ? Activation::gelu_tanh
                              : Activation::none;
}

InitKind read_init(SpecReader& r, const std::string& path, Activation act) {
    const std::string def = act == Activation::none ? "glorot_uniform" : "he_uniform";
    const std::string k =
        r.choice(path, def, {"he_uniform", "he_normal", "glorot_uniform", "glorot_normal", "gpt2_normal"});
    if (k == "he_normal") return InitKind::he_normal;
    if (k == "gpt2_normal") return InitKind::gpt2_normal;  // normal(0, 0.02): GPT-2's and Llama's
    if (k == "glorot_uniform") return InitKind::glorot_uniform;
    if (k == "glorot_normal") return InitKind::glorot_normal;
    return InitKind::he_uniform;
}

void read_padding(SpecReader& r, const std::string& path, WindowKeys& s) {
    const std::string v = r.text(path, "valid");
    s.same = false;
    s.padding = 0;
    if (!v.empty() && v.size() <= 3 && v.find_first_not_of("0123456789") == std::string::npos) {
        s.padding = std::stoi(v);
        if (s.padding > 64) r.fail(path, "expected same, valid or a number of zeros from 0 to 64, got " + v);
        return;
    }
    if (v == "same") s.same = true;
    else if (v != "valid") r.fail(path, "expected same, valid or a number of zeros from 0 to 64, got '" + v + "'");
    if (s.same && s.kernel % 2 == 0)
        r.fail(path, "same needs an odd kernel_size (it pads (kernel - 1) / 2 on every side); give a number instead");
}

std::string Shape::str() const {
    if (!image && w > 1) return "[" + std::to_string(w) + ", " + std::to_string(c) + "]";
    if (!image) return "[" + std::to_string(c) + "]";
    return "[" + std::to_string(h) + ", " + std::to_string(w) + ", " + std::to_string(c) + "]";
}

void Layer::fail(const std::string& what) const { throw ConfigError(key_, what); }

float* Layer::grad_or_sink(const Pass& p, size_t offset, int slot, int sink, size_t at) const {
    if (float* g = p.grad(offset)) return g;
    return p.acts->f32(slot, sink) + at;
}

void Layer::weight_grad_by_blocks(Pass& p, int rows, int units, int inputs, const void* dz, const void* x, size_t w_off,
                                  int block_rows) const {
    const size_t elem = p.dev->act_bytes(1);
    if (!p.grad(w_off)) return;  // frozen (never split: Builder::split_rows)
    for (int k = (units - 1) / block_rows; k >= 0; --k) {
        const int first = k * block_rows, n = std::min(block_rows, units - first);
        // dw[first : first + n, :] (+)= dz[:, first : first + n]^T x: dz's columns at its full width
        gemm(*p.dev, p.stream, true, false, n, inputs, rows, 1.0f, static_cast<const char*>(dz) + size_t(first) * elem,
             units, x, inputs, p.accumulate ? 1.0f : 0.0f, p.grad(w_off + size_t(first) * size_t(inputs)), inputs,
             p.types(DType::f32));
        if (k > 0 && p.on_unit_done) (*p.on_unit_done)(unit_ + k);
    }
}

size_t GradientPlacement::index(size_t offset) const {
    if (pieces.empty()) return offset;
    auto it =
        std::upper_bound(pieces.begin(), pieces.end(), offset, [](size_t o, const Piece& p) { return o < p.begin; });
    if (it == pieces.begin() || offset >= (it - 1)->end)
        throw std::logic_error("a gradient offset outside every placed bucket: " + std::to_string(offset));
    --it;
    return it->at + (offset - it->begin);
}

float* Pass::grad(size_t offset) const {
    if (offset >= frozen_from) return nullptr;
    return grads + (placement ? placement->index(offset) : offset);
}

void* DecodeState::cache(int slot, size_t bytes_per_position) {
    for (const auto& [s, p] : caches_)
        if (s == slot) return p.get();
    Device* d = &dev_;
    std::shared_ptr<void> p(d->alloc_bytes(bytes_per_position * size_t(capacity_) * size_t(sequences_)),
                            [d](void* q) { d->free_bytes(q); });
    caches_.emplace_back(slot, p);
    return p.get();
}

int Builder::param(const std::string& name, std::vector<int> shape, InitArgs init) {
    const int i = add_tensor(name, std::move(shape), init);
    tensors_[size_t(i)].unit = unit_here();
    bool frozen = adapt_.freeze_all;
    for (const std::string& pattern : adapt_.freeze)
        frozen = frozen || ::fnmatch(pattern.c_str(), name.c_str(), 0) == 0;
    tensors_[size_t(i)].frozen = frozen;
    return i;
}

int Builder::adapter_param(const std::string& name, std::vector<int> shape, InitArgs init) {
    const int i = add_tensor(name, std::move(shape), init);
    tensors_[size_t(i)].unit = unit_here();
    return i;
}

const std::vector<LoraSlice>& Builder::lora_slices(const std::string& weight) const {
    static const std::vector<LoraSlice> none;
    const auto it = adapt_.lora.find(weight);
    return it == adapt_.lora.end() ? none : it->second;
}

int Builder::split_rows(int tensor, size_t row_floats) {
    Tensor& t = tensors_[size_t(tensor)];
    const size_t rows = row_floats ? t.count / row_floats : 0;
    if (piece_floats_ == 0 || t.count <= piece_floats_ || t.tied || t.frozen || t.unit != units() - 1) return int(rows);
    // The fewest rows that hold a bucket, so that a bucket (at least piece_floats) is one block, in
    // multiples of 8: a block's columns of a 16-bit dz start 16 bytes apart, and a tiny bucket does
    // not make a product per row.
    const size_t fit = (piece_floats_ + row_floats - 1) / row_floats, per = (fit + 7) / 8 * 8;
    const size_t pieces = (rows + per - 1) / per;
    if (pieces < 2) return int(rows);
    t.piece_floats = per * row_floats;
    t.pieces = int(pieces);
    for (size_t k = 1; k < pieces; ++k) unit_layers_.push_back(top_layer_);
    frames_.back().current = units() - 1;
    return int(per);
}

int Builder::add_tensor(const std::string& name, std::vector<int> shape, InitArgs init) {
    Tensor t;
    t.name = name;
    t.shape = std::move(shape);
    t.count = 1;
    for (int d : t.shape) t.count *= size_t(d);
    t.init = init;
    t.init.seed = seed_;
    t.init.tensor_id = uint32_t(tensors_.size());
    t.top_layer = top_layer_;
    tensors_.push_back(std::move(t));
    return int(tensors_.size()) - 1;
}

int Builder::state(const std::string& name, std::vector<int> shape, float fill, float momentum) {
    const int i = add_tensor(name, std::move(shape), InitArgs{});
    tensors_[size_t(i)].trainable = false;
    tensors_[size_t(i)].fill = fill;
    tensors_[size_t(i)].momentum = momentum;
    return i;
}

int Builder::new_slot() {
    slots_.emplace_back();
    return int(slots_.size()) - 1;
}

bool Builder::begin_recompute() {
    if (!recompute_ || depth_++ > 0) return false;
    region_ = regions_++;
    return true;
}

void Builder::end_recompute() {
    if (recompute_ && --depth_ == 0) region_ = -1;
}

int Builder::act_buffer(int slot, size_t per_row, size_t fixed) {
    slots_[size_t(slot)].buffers.push_back(Buffer{true, per_row, fixed, region_});
    return int(slots_[size_t(slot)].buffers.size()) - 1;
}

int Builder::f32_buffer(int slot, size_t per_row, size_t fixed) {
    slots_[size_t(slot)].buffers.push_back(Buffer{false, per_row, fixed, region_});
    return int(slots_[size_t(slot)].buffers.size()) - 1;
}

}  // namespace mirrored
