#include "mirrored/layers/lora.h"

#include "kernels/ops/dropout.h"
#include "mirrored/layers/activations.h"
#include "kernels/ops/elementwise.h"
#include "kernels/ops/gemm.h"

namespace mirrored {

void LoraAdapters::declare(Builder& b, const std::string& weight, int inputs, int units, int slot, int positions,
                           int group) {
    const Adaptation& a = b.adaptation();
    inputs_ = inputs;
    units_ = units;
    rank_ = a.lora_rank;
    scale_ = a.lora_scale;
    dropout_ = float(a.lora_dropout);
    slot_ = slot;
    group_ = group;
    positions_ = positions;
    for (const LoraSlice& s : b.lora_slices(weight)) {
        if (s.row < 0 || s.rows <= 0 || s.row + s.rows > units)
            throw std::logic_error("LoRA: rows [" + std::to_string(s.row) + ", +" + std::to_string(s.rows) + ") of " +
                                   weight + " are outside its " + std::to_string(units));
        InitArgs init;  // PEFT's kaiming_uniform_(a = sqrt(5)): U(-1 / sqrt(inputs), 1 / sqrt(inputs))
        init.kind = InitKind::he_uniform;
        init.fan_in = 6 * inputs;
        Adapter ad;
        ad.slice = s;
        ad.a = b.adapter_param(s.name + ".lora_A.weight", {rank_, inputs}, init);
        ad.b = b.adapter_param(s.name + ".lora_B.weight", {s.rows, rank_}, InitArgs{});
        adapters_.push_back(ad);
    }
    if (empty()) return;
    xa_ = b.act_buffer(slot, size_t(positions) * size_t(rank_));
    dxa_ = b.act_buffer(slot, size_t(positions) * size_t(rank_));
    if (dropout_ > 0) dropped_ = b.act_buffer(slot, size_t(positions) * size_t(inputs));
}

const void* LoraAdapters::adapter_input(Pass& p, int rows, size_t k, const void* x) const {
    if (!p.training || dropout_ <= 0 || rows == 0) return x;  // (a replica's empty micro-batch)
    void* dropped = p.acts->act(slot_, dropped_);
    dropout_forward(*p.dev, p.stream, mask(p, k), p.rows, positions_ * inputs_, x, dropped);
    return dropped;
}

// A mask per adapter (PEFT: one nn.Dropout per module), apart from its layer's own dropout's.
DropoutArgs LoraAdapters::mask(const Pass& p, size_t k) const {
    return DropoutArgs{
        dropout_, p.seed,       0x80000000u | (uint32_t(slot_) << 8) | (uint32_t(group_) << 4) | uint32_t(k),
        p.step,   p.row_offset, p.values};
}

void LoraAdapters::place(const std::vector<TensorRef>& refs) {
    for (Adapter& ad : adapters_) {
        ad.a_off = refs[size_t(ad.a)].offset;
        ad.b_off = refs[size_t(ad.b)].offset;
    }
}

void LoraAdapters::forward(Pass& p, int rows, const void* x, void* y) const {
    if (empty()) return;
    Device& d = *p.dev;
    void* xa = p.acts->act(slot_, xa_);
    for (size_t k = 0; k < adapters_.size(); ++k) {
        const Adapter& ad = adapters_[k];
        // xa[rows, rank] = x A^T, then y[:, row..] += scale xa B^T
        gemm(d, p.stream, false, true, rows, rank_, inputs_, 1.0f, adapter_input(p, rows, k, x), inputs_,
             p.weight(ad.a_off), inputs_, 0.0f, xa, rank_, p.types(p.vt));
        gemm(d, p.stream, false, true, rows, ad.slice.rows, rank_, scale_, xa, rank_, p.weight(ad.b_off), rank_, 1.0f,
             static_cast<char*>(y) + d.act_bytes(size_t(ad.slice.row)), units_, p.types(p.vt));
    }
}

void LoraAdapters::backward(Pass& p, int rows, const void* x, const void* dy, void* dx) const {
    Device& d = *p.dev;
    void* xa = p.acts->act(slot_, xa_);
    void* dxa = p.acts->act(slot_, dxa_);
    const float beta = p.accumulate ? 1.0f : 0.0f;
    for (size_t k = 0; k < adapters_.size(); ++k) {
        const Adapter& ad = adapters_[k];
        const void* dys = static_cast<const char*>(dy) + d.act_bytes(size_t(ad.slice.row));  // dy[:, row..]
        const void* xk = adapter_input(p, rows, k, x);                                       // its mask made again
        // dB[rows_s, rank] (+)= scale dys^T xa, xa computed again
        gemm(d, p.stream, false, true, rows, rank_, inputs_, 1.0f, xk, inputs_, p.weight(ad.a_off), inputs_, 0.0f, xa,
             rank_, p.types(p.vt));
        gemm(d, p.stream, true, false, ad.slice.rows, rank_, rows, scale_, dys, units_, xa, rank_, beta,
             p.grad(ad.b_off), rank_, p.types(DType::f32));
        // dxa[rows, rank] = scale dys B, dA[rank, inputs] (+)= dxa^T x, dx += dxa A
        gemm(d, p.stream, false, false, rows, rank_, ad.slice.rows, scale_, dys, units_, p.weight(ad.b_off), rank_,
             0.0f, dxa, rank_, p.types(p.vt));
        gemm(d, p.stream, true, false, rank_, inputs_, rows, 1.0f, dxa, rank_, xk, inputs_, beta, p.grad(ad.a_off),
             inputs_, p.types(DType::f32));
        if (!dx) continue;
        if (xk == x) {
            gemm(d, p.stream, false, false, rows, inputs_, rank_, 1.0f, dxa, rank_, p.weight(ad.a_off), inputs_, 1.0f,
                 dx, inputs_, p.types(p.vt));
            continue;
        }
        // through the mask: the dropped copy's buffer (read above) now holds dxa A, masked in place
        void* part = p.acts->act(slot_, dropped_);
        gemm(d, p.stream, false, false, rows, inputs_, rank_, 1.0f, dxa, rank_, p.weight(ad.a_off), inputs_, 0.0f, part,
             inputs_, p.types(p.vt));
        dropout_backward(d, p.stream, mask(p, k), p.rows, positions_ * inputs_, part, part);
        add_values(d, p.stream, size_t(rows) * size_t(inputs_), part, dx);
    }
}

double LoraAdapters::forward_flops(int positions) const {
    double f = 0;
    for (const Adapter& ad : adapters_) f += 2.0 * positions * rank_ * (double(inputs_) + ad.slice.rows);
    return f;
}

}  // namespace mirrored
