#include "mirrored/layers/activations.h"

#include <algorithm>

namespace mirrored {

namespace {
uint64_t buffer_bytes(const Builder::Buffer& b, int rows, size_t act_elem) {
    const uint64_t elems = b.per_row * uint64_t(std::max(rows, 1)) + b.fixed;
    return std::max<uint64_t>(elems, 1) * (b.act ? act_elem : sizeof(float));
}
}  // namespace

uint64_t Activations::planned_bytes(const Builder& layout, int max_rows, size_t act_elem) {
    uint64_t total = uint64_t(layout.scratch_per_row()) * uint64_t(std::max(max_rows, 1)) * act_elem;
    for (const auto& slot : layout.slots())
        for (const auto& b : slot.buffers) total += buffer_bytes(b, max_rows, act_elem);
    return total;
}

Activations::Activations(Device& dev, const Builder& layout, int max_rows) : max_rows_(max_rows) {
    const size_t act_elem = dev.act_bytes(1);
    for (const auto& slot : layout.slots()) {
        ptrs_.emplace_back();
        for (const auto& b : slot.buffers) {
            const uint64_t bytes = buffer_bytes(b, max_rows, act_elem);
            owned_.emplace_back(dev, size_t(bytes));
            ptrs_.back().push_back(owned_.back().data());
            bytes_ += bytes;
        }
    }
    inputs_.assign(ptrs_.size(), nullptr);
    const uint64_t scratch = uint64_t(layout.scratch_per_row()) * uint64_t(std::max(max_rows, 1)) * act_elem;
    if (scratch) scratch_ = DeviceBuffer<unsigned char>(dev, size_t(scratch));
    bytes_ += scratch;
}

}  // namespace mirrored
