// A replica's per-layer storage, allocated once for up to max_rows samples: every layer's slot
// (its activation and statistics buffers, and the input its last forward saw), the shared
// scratch (im2col columns), and one region the recomputed blocks' slots share (Builder's
// begin_recompute). A training step never allocates.
#pragma once

#include <vector>

#include "kernels/buffer.h"
#include "kernels/device.h"
#include "mirrored/layers/layer.h"

namespace mirrored {

class Activations {
public:
    Activations() = default;
    Activations(Device& dev, const Builder& layout, int max_rows);
    // What the constructor would allocate, with activations of act_elem bytes each.
    // block_bytes: Device::column_block_bytes of the device they will live on.
    static uint64_t planned_bytes(const Builder& layout, int max_rows, size_t act_elem, size_t block_bytes);
    // Elements per row of the largest activation buffer: the widest layer output (or its
    // pre-activation), the bound of the CPU backend's per-row scratches.
    static size_t largest_per_row(const Builder& layout);

    int max_rows() const { return max_rows_; }
    void* act(int slot, int i) const { return ptrs_[size_t(slot)][size_t(i)]; }
    float* f32(int slot, int i) const { return static_cast<float*>(ptrs_[size_t(slot)][size_t(i)]); }
    const void*& input(int slot) { return inputs_[size_t(slot)]; }
    void* scratch() const { return scratch_.data(); }
    uint64_t bytes() const { return bytes_; }

private:
    int max_rows_ = 0;
    std::vector<std::vector<void*>> ptrs_;  // [slot][buffer]
    std::vector<const void*> inputs_;       // [slot]
    std::vector<DeviceBuffer<unsigned char>> owned_;
    DeviceBuffer<unsigned char> scratch_;
    DeviceBuffer<unsigned char> shared_;  // the recomputed blocks' slots (train.recompute: blocks)
    uint64_t bytes_ = 0;
};

}  // namespace mirrored
