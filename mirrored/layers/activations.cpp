#include "mirrored/layers/activations.h"

#include <algorithm>

namespace mirrored {

namespace {
uint64_t buffer_bytes(const Builder::Buffer& b, int rows, size_t act_elem) {
    const uint64_t elems = b.per_row * uint64_t(std::max(rows, 1)) + b.fixed;
    return std::max<uint64_t>(elems, 1) * (b.act ? act_elem : sizeof(float));
}

// The largest block any user of the scratch makes (conv2d's blocks of images).
uint64_t scratch_bytes(const Builder& layout, int max_rows, size_t act_elem, size_t block_bytes) {
    uint64_t most = 0;
    for (size_t per_row : layout.scratch_per_row()) {
        const int rows = Device::column_block_images(per_row * act_elem, block_bytes, max_rows);
        most = std::max(most, uint64_t(per_row) * uint64_t(rows) * act_elem);
    }
    return most;
}
}  // namespace

uint64_t Activations::planned_bytes(const Builder& layout, int max_rows, size_t act_elem, size_t block_bytes) {
    uint64_t total = scratch_bytes(layout, max_rows, act_elem, block_bytes);
    for (const auto& slot : layout.slots())
        for (const auto& b : slot.buffers) total += buffer_bytes(b, max_rows, act_elem);
    return total;
}

size_t Activations::largest_per_row(const Builder& layout) {
    size_t most = 0;
    for (const auto& slot : layout.slots())
        for (const auto& b : slot.buffers) most = std::max(most, b.per_row);
    return most;
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
    const uint64_t scratch = scratch_bytes(layout, max_rows, act_elem, dev.column_block_bytes());
    if (scratch) scratch_ = DeviceBuffer<unsigned char>(dev, size_t(scratch));
    bytes_ += scratch;
}

}  // namespace mirrored
