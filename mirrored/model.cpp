// The model: the layout of the flat buffers, built by the layers, and the passes over them.
#include "mirrored/model.h"

#include <algorithm>
#include <cstdio>
#include <stdexcept>
#include <string>

#include "base/error.h"
#include "kernels/ops/flat.h"

namespace mirrored {

const char* layer_type_name(const LayerSpec& s) { return s.type.c_str(); }

namespace {

Shape input_of(const std::vector<int>& dims) {
    for (int d : dims)
        if (d <= 0) throw ConfigError("model.input_shape", "dimensions must be positive");
    uint64_t n = 1;
    for (int d : dims) n *= uint64_t(d);
    if (n > (uint64_t(1) << 26)) throw ConfigError("model.input_shape", "more than 2^26 values per sample");
    if (dims.size() == 1) return Shape::vector(dims[0]);
    if (dims.size() == 3) return Shape::picture(dims[0], dims[1], dims[2]);
    if (dims.size() == 2) return Shape::picture(dims[0], dims[1], 1);
    throw ConfigError("model.input_shape", "expected [features], [height, width] or [height, width, channels]");
}

// The tensors' offsets: trainable ones first, then the state, then the frozen ones (Adaptation:
// beyond the gradient buffer); each aligned.
std::vector<TensorRef> lay_out(const Builder& b, std::vector<TensorInfo>& out, std::vector<GradientPiece>& pieces,
                               size_t& trainable_end, size_t& grad_end, size_t& end, size_t& params) {
    std::vector<TensorRef> refs(b.tensors().size());
    size_t offset = 0;
    for (int pass = 0; pass < 3; ++pass) {
        for (size_t i = 0; i < b.tensors().size(); ++i) {
            const Builder::Tensor& t = b.tensors()[i];
            if ((t.frozen ? 2 : t.trainable ? 0 : 1) != pass) continue;
            const bool trains = pass == 0;
            uint64_t count = 1;
            for (int d : t.shape) count *= uint64_t(d);
            if (count > (uint64_t(1) << 34)) throw ConfigError("model.layers", t.name + " is implausibly large");
            refs[i] = TensorRef{int(i), offset, size_t(count)};
            TensorInfo info;
            info.name = t.name;
            info.shape = t.shape;
            info.offset = offset;
            info.count = size_t(count);
            info.layer = t.top_layer;
            const size_t per = t.piece_floats ? t.piece_floats : size_t(count);
            const int blocks = trains ? t.pieces : 1;
            info.unit = t.unit;
            info.written_from = std::max(t.unit + blocks - 1, t.tied_unit);
            for (int k = 0; trains && k < blocks; ++k) {  // the last block is written first
                const size_t from = offset + size_t(k) * per, to = std::min(offset + size_t(count), from + per);
                pieces.push_back({from, to, t.unit + k, blocks > 1 ? t.unit + k : info.written_from});
            }
            info.init = t.init;
            info.trainable = trains;
            info.frozen = t.frozen;
            info.fill = t.fill;
            info.momentum = t.momentum;
            out.push_back(std::move(info));
            offset += (size_t(count) + Model::kTensorAlign - 1) / Model::kTensorAlign * Model::kTensorAlign;
            if (trains) params += size_t(count);
        }
        if (pass == 0) trainable_end = offset;
        if (pass == 1) grad_end = offset;
    }
    end = offset;
    return refs;
}

}  // namespace

Model::Model(std::vector<int> input_shape, std::vector<LayerSpec> layers, uint64_t seed, bool recompute_blocks,
             size_t gradient_piece_floats, Adaptation adaptation)
    : input_shape_(std::move(input_shape)),
      specs_(std::move(layers)),
      seed_(seed),
      recompute_(recompute_blocks),
      piece_floats_(gradient_piece_floats) {
    if (input_shape_.empty()) throw ConfigError("model.input_shape", "expected at least one dimension");
    if (specs_.empty()) throw ConfigError("model.layers", "expected at least one layer");
    in_ = input_of(input_shape_);
    layout_ = std::make_unique<Builder>(seed);
    layout_->set_recompute(recompute_blocks);
    layout_->set_piece_floats(gradient_piece_floats);
    layout_->set_adaptation(std::move(adaptation));
    top_ = std::make_unique<Sequential>(specs_);
    out_ = top_->build(*layout_, "layers", "model.layers", in_, true);
    if (out_.image)
        throw ConfigError("model.layers." + std::to_string(specs_.size() - 1),
                          "the model ends with an image " + out_.str() +
                              "; end with a vector of class scores "
                              "(flatten or global_avgpool, then dense)");
    dlogits_slot_ = layout_->new_slot();
    layout_->act_buffer(dlogits_slot_, out_.size());
    const std::vector<TensorRef> refs =
        lay_out(*layout_, tensors_, pieces_, trainable_size_, grad_size_, flat_size_, param_count_);
    if (trainable_size_ == 0)
        throw ConfigError(layout_->adaptation() == Adaptation{} ? "model.layers" : "model.freeze",
                          "the model has nothing left to train (add a dense or conv2d layer, or freeze less)");
    for (const TensorInfo& t : tensors_) frozen_count_ += t.frozen ? t.count : 0;
    top_->place(refs);
}

Model::~Model() = default;

std::unique_ptr<Model> Model::with_gradient_pieces(size_t floats) const {
    return std::make_unique<Model>(input_shape_, specs_, seed_, recompute_, floats, layout_->adaptation());
}

bool Model::reads_token_ids() const { return layer_kinds().get(specs_.front().type).reads_token_ids; }

int Model::token_vocab() const {
    if (!reads_token_ids() || !specs_.front().options) return 0;
    for (const auto& [key, value] : specs_.front().options->fields())
        if (key == "vocab") return std::stoi(value);
    return 0;
}

std::vector<std::pair<size_t, size_t>> Model::matrix_ranges() const {
    std::vector<std::pair<size_t, size_t>> out;
    for (const TensorInfo& t : tensors_) {
        if (!t.trainable || t.shape.size() < 2) continue;
        const size_t end =
            std::min(trainable_size_, (t.offset + t.count + kTensorAlign - 1) / kTensorAlign * kTensorAlign);
        if (!out.empty() && out.back().second == t.offset) out.back().second = end;  // padding included
        else out.push_back({t.offset, end});
    }
    std::sort(out.begin(), out.end());
    return out;
}

size_t Model::stats_floats() const { return layout_->stats_floats(); }
int Model::stats_syncs() const { return layout_->stats_syncs(); }

const TensorInfo* Model::find(const std::string& name) const {
    for (const auto& t : tensors_)
        if (t.name == name) return &t;
    return nullptr;
}

std::string Model::summary() const {
    std::string s;
    char line[200];
    auto params_of = [&](const std::string& prefix) {
        size_t n = 0;
        for (const auto& t : tensors_)
            if (t.trainable && t.name.rfind(prefix + ".", 0) == 0) n += t.count;
        return n;
    };
    std::function<void(const Layer&, int)> one = [&](const Layer& l, int depth) {
        std::snprintf(line, sizeof line, "  %*s%-*s %-14s %13s -> %-13s %-22s %10zu params\n", 2 * depth, "",
                      18 - 2 * depth, l.name().c_str(), l.spec().type.c_str(), l.in().str().c_str(),
                      l.out().str().c_str(), l.detail().c_str(), params_of(l.name()));
        s += line;
    };
    for (const auto& l : top_->layers()) one(*l, 0);
    if (frozen_count_)  // per layer: what trains
        std::snprintf(line, sizeof line,
                      "  total %zu trained parameters (%.2f MiB fp32: %.2f%% of all) and %zu frozen (%.2f MiB)%s\n",
                      param_count_, param_count_ * 4.0 / 1048576.0,
                      100.0 * double(param_count_) / double(param_count_ + frozen_count_), frozen_count_,
                      frozen_count_ * 4.0 / 1048576.0, has_state() ? ", plus running statistics" : "");
    else
        std::snprintf(line, sizeof line, "  total %zu parameters (%.2f MiB fp32)%s\n", param_count_,
                      param_count_ * 4.0 / 1048576.0, has_state() ? ", plus running statistics" : "");
    s += line;
    return s;
}

std::vector<std::string> Model::layer_descriptions() const {
    std::vector<std::string> out;
    for (const auto& l : top_->layers()) {
        std::string d = l->name() + " " + l->spec().type + " " + l->in().str() + " -> " + l->out().str();
        if (!l->detail().empty()) d += " " + l->detail();
        out.push_back(d);
    }
    return out;
}

std::vector<Model::LayerFlops> Model::layer_flops() const {
    std::vector<LayerFlops> out;
    bool first = true;
    for (const auto& l : top_->layers()) {
        const double f = l->forward_flops();
        out.push_back({f, f * (first ? 1 : 2)});  // dW, and dX except for the first layer
        if (f != 0) first = false;
    }
    return out;
}

double Model::train_flops_per_sample() const {
    double flops = 0;
    for (const LayerFlops& f : layer_flops()) flops += f.forward + f.backward;
    return flops;
}

double Model::recomputed_flops_per_sample() const {
    double flops = 0;
    for (const auto& l : top_->layers())
        if (l->recomputes()) flops += l->forward_flops();
    return flops;
}

uint64_t Model::activation_bytes(int max_rows, size_t act_elem, size_t column_block_bytes) const {
    return Activations::planned_bytes(*layout_, max_rows, act_elem, column_block_bytes);
}

int Model::sequence_positions() const { return layout_->most_positions(); }

bool Model::convolves() const { return !layout_->scratch_per_row().empty(); }

ProductWidths Model::product_widths() const {
    const uint64_t positions = uint64_t(sequence_positions() > 1 ? sequence_positions() : 0);
    ProductWidths w{positions, positions};
    for (const TensorInfo& t : tensors_) {
        if (!(t.trainable || t.frozen) || t.shape.size() < 2) continue;
        w.out = std::max(w.out, uint64_t(t.shape[0]));
        w.in = std::max(w.in, uint64_t(t.count) / uint64_t(t.shape[0]));
        if (t.count <= kCpuJitWeightMaxFloats) w.weight = std::max(w.weight, uint64_t(t.count));
        if (t.count <= kCpuJitSmallWeightFloats) w.small_weight = std::max(w.small_weight, uint64_t(t.count));
        if (t.shape.size() == 4) w.convolution = std::max(w.convolution, uint64_t(t.count));
    }
    return w;
}

size_t Model::largest_activation_per_row() const { return Activations::largest_per_row(*layout_); }

Activations Model::make_activations(Device& dev, int max_rows) const { return Activations(dev, *layout_, max_rows); }

void Model::init_params(Device& dev, Stream s, float* params) const {
    fill_floats(dev, s, flat_size_, 0.0f, params);
    for (const auto& t : tensors_) {
        if (t.trainable || t.frozen) init_param_values(dev, s, t.init, t.count, params + t.offset);
        else if (t.fill != 0.0f) fill_floats(dev, s, t.count, t.fill, params + t.offset);
    }
}

void Model::check_batch(int rows, int global_rows) const { top_->check_batch(rows, global_rows); }

const void* Model::forward(Pass& p, const void* x) const {
    if (p.rows > p.acts->max_rows())
        throw Error(kExitFailure, "forward: " + std::to_string(p.rows) + " rows exceed the " +
                                      std::to_string(p.acts->max_rows()) + " activations were sized for");
    return top_->forward(p, x);
}

void Model::backward(Pass& p, void* dlogits, const std::function<void(int)>& on_unit_done) const {
    int last = gradient_units();
    const std::function<void(int)> in_order = [&](int unit) {
        if (unit >= last)  // the buckets' readiness and the staging slots rely on this order
            throw std::logic_error("backward completed gradient unit " + std::to_string(unit) + " after unit " +
                                   std::to_string(last));
        last = unit;
        if (on_unit_done) on_unit_done(unit);
    };
    p.on_unit_done = &in_order;  // checked on every backward, one replica's too
    top_->backward(p, dlogits, nullptr);
    p.on_unit_done = nullptr;
}

}  // namespace mirrored
