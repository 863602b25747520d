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

// Where each recomputed block's buffer lies in the region every such block shares (each block's
// buffers from its start, 256-byte aligned), and the region's size: the largest block's.
// offsets[slot][buffer] is meaningful for those buffers only.
struct SharedRegion {
    std::vector<std::vector<uint64_t>> offsets;
    uint64_t bytes = 0;
};
SharedRegion shared_region(const Builder& layout, int max_rows, size_t act_elem) {
    constexpr uint64_t kAlign = 256;
    SharedRegion r;
    std::vector<uint64_t> used;  // per block
    for (const auto& slot : layout.slots()) {
        r.offsets.emplace_back();
        for (const auto& b : slot.buffers) {
            r.offsets.back().push_back(0);
            if (b.region < 0) continue;
            if (used.size() <= size_t(b.region)) used.resize(size_t(b.region) + 1, 0);
            uint64_t& at = used[size_t(b.region)];
            r.offsets.back().back() = at;
            at += (buffer_bytes(b, max_rows, act_elem) + kAlign - 1) / kAlign * kAlign;
            r.bytes = std::max(r.bytes, at);
        }
    }
    return r;
}

}  // namespace

uint64_t Activations::planned_bytes(const Builder& layout, int max_rows, size_t act_elem, size_t block_bytes) {
    uint64_t total = scratch_bytes(layout, max_rows, act_elem, block_bytes);
    total += shared_region(layout, max_rows, act_elem).bytes;
    for (const auto& slot : layout.slots())
        for (const auto& b : slot.buffers)
            if (b.region < 0) total += buffer_bytes(b, max_rows, act_elem);
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
    const SharedRegion shared = shared_region(layout, max_rows, act_elem);
    if (shared.bytes) {
        shared_ = DeviceBuffer<unsigned char>(dev, size_t(shared.bytes));
        bytes_ += shared.bytes;
    }
    for (size_t s = 0; s < layout.slots().size(); ++s) {
        const Builder::Slot& slot = layout.slots()[s];
        ptrs_.emplace_back();
        for (size_t i = 0; i < slot.buffers.size(); ++i) {
            if (slot.buffers[i].region >= 0) {
                ptrs_.back().push_back(shared_.data() + shared.offsets[s][i]);
                continue;
            }
            const uint64_t bytes = buffer_bytes(slot.buffers[i], max_rows, act_elem);
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
