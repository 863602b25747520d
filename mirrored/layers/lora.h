// LoRA (Hu et al., 2021): low-rank adapters beside a layer's weight W [units, inputs]. For each of
// the weight's adapted row ranges (Builder::lora_slices: a Hugging Face module such as q_proj, which
// may be rows of a stacked tensor here),
//   y[:, row : row + rows] += scale * (x A^T) B^T,  A [rank, inputs], B [rows, rank], scale = alpha / rank
// A starts as PEFT's (PyTorch Linear's uniform bound 1 / sqrt(inputs)) and B at zero, so the adapted
// layer starts as W. x A^T is kept only during a call: backward computes it again (rank is small).
// With a dropout rate (PEFT's lora_dropout) each adapter reads its own dropped copy of x in
// training: masks a pure function of (seed, layer, adapter, step, global sample), made again in
// backward (kernels/ops/dropout.h), so N replicas train as one and recomputation is exact.
#pragma once

#include <string>
#include <vector>

#include "mirrored/layers/layer.h"

namespace mirrored {

class LoraAdapters {
public:
    // Declares `weight`'s adapters (none where the adaptation names none) and their scratch in the
    // layer's slot, for inputs of `positions` rows per sample. group: which of the layer's weights
    // (0, 1, ...): its adapters' dropout masks differ from those of the layer's other weights.
    void declare(Builder& b, const std::string& weight, int inputs, int units, int slot, int positions, int group = 0);
    void place(const std::vector<TensorRef>& refs);
    bool empty() const { return adapters_.empty(); }
    // y [rows, units] += the adapters' products of x [rows, inputs] (activation type).
    void forward(Pass& p, int rows, const void* x, void* y) const;
    // Their gradients from dy [rows, units] (written, or added under p.accumulate) and, when dx is
    // not null, dx [rows, inputs] += their part of it.
    void backward(Pass& p, int rows, const void* x, const void* dy, void* dx) const;
    double forward_flops(int positions) const;  // per sample

private:
    struct Adapter {
        LoraSlice slice;
        int a = -1, b = -1;
        size_t a_off = 0, b_off = 0;
    };
    std::vector<Adapter> adapters_;
    // x as adapter k reads it: dropped in training (into `dropped`), else x itself
    const void* adapter_input(Pass& p, int rows, size_t k, const void* x) const;
    DropoutArgs mask(const Pass& p, size_t k) const;
    int inputs_ = 0, units_ = 0, rank_ = 0, slot_ = -1, group_ = 0, positions_ = 0, xa_ = -1, dxa_ = -1, dropped_ = -1;
    float scale_ = 0.0f, dropout_ = 0.0f;
};

}  // namespace mirrored
