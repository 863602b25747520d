#include "mirrored/layers/sequential.h"

#include <algorithm>

#include "mirrored/layers/activations.h"

namespace mirrored {

Sequential::Sequential(const std::vector<LayerSpec>& specs) {
    for (const LayerSpec& s : specs) layers_.push_back(layer_kinds().get(s.type).create(s));
}

Shape Sequential::build(Builder& b, const std::string& name, const std::string& key, const Shape& in, bool top) {
    top_ = top;
    Shape cur = in;
    size_t widest = in.size();
    for (size_t i = 0; i < layers_.size(); ++i) {
        if (top) b.set_top_layer(int(i));
        layers_[i]->build(b, name + "." + std::to_string(i), key + "." + std::to_string(i), cur);
        cur = layers_[i]->out();
        widest = std::max(widest, cur.size());
    }
    first_param_ = int(layers_.size());
    for (size_t i = 0; i < layers_.size(); ++i)
        if (layers_[i]->has_params()) {
            first_param_ = int(i);
            break;
        }
    slot_ = b.new_slot();
    b.act_buffer(slot_, widest);  // the gradient ping-pong
    b.act_buffer(slot_, widest);
    return cur;
}

void Sequential::place(const std::vector<TensorRef>& refs) {
    for (auto& l : layers_) l->place(refs);
}

bool Sequential::has_params() const { return first_param_ < int(layers_.size()); }

void Sequential::check_batch(int rows, int global_rows) const {
    for (auto& l : layers_) l->check_batch(rows, global_rows);
}

const void* Sequential::forward(Pass& p, const void* x) const {
    LayerProbe* probe = top_ ? p.probe : nullptr;
    for (size_t i = 0; i < layers_.size(); ++i) {
        x = layers_[i]->forward(p, x);
        if (probe) probe->mark(*p.dev, p.stream, int(i));
    }
    return x;
}

void Sequential::backward(Pass& p, void* dy, void* dx) const {
    const int lowest = dx ? 0 : first_param_;
    void* cur = dy;
    int which = 0;
    for (int i = int(layers_.size()) - 1; i >= lowest; --i) {
        void* target = i == 0 ? dx : i == lowest ? nullptr : p.acts->act(slot_, which);
        layers_[size_t(i)]->run_backward(p, cur, target);
        if (top_ && p.probe) p.probe->mark(*p.dev, p.stream, int(layers_.size()) + i);
        cur = target;
        which ^= 1;
    }
}

}  // namespace mirrored
