// Causal self-attention's own ops (the attention layer; its products are GEMMs): the causal
// softmax over [t, t] score matrices and its backward, and the fused attention that keeps no
// [t, t] matrix (fused: true). The CPU loops (attention.cpp, the reference) and the CUDA kernels
// (attention.cu) side by side.
#pragma once

#include "kernels/device.h"

namespace mirrored {

// Causal attention's softmax over `batches` [t, t] score matrices: row i of each keeps columns
// 0..i, probs = softmax(scale * scores) there and 0 above the diagonal. probs may be scores.
void causal_softmax(Device& d, Stream s, int batches, int t, float scale, const void* scores, void* probs);
// Its backward: dscores = scale * probs * (dprobs - sum over the row of probs * dprobs), 0 above
// the diagonal. dscores may be dprobs.
void causal_softmax_backward(Device& d, Stream s, int batches, int t, float scale, const void* probs,
                             const void* dprobs, void* dscores);

// The heads of a causal self-attention: `heads` query heads and kv_heads key/value heads, each d
// wide (grouped-query attention: query head h reads key/value head h / (heads / kv_heads);
// kv_heads == heads is multi-head attention, 1 multi-query). A row of qkv holds the queries
// (heads d values), then the keys (kv_heads d), then the values (kv_heads d) - GPT-2's c_attn
// when kv_heads == heads; a row of the output holds the heads side by side (heads d).
struct AttentionHeads {
    int heads = 1, kv_heads = 1, d = 1;
    MIRRORED_HD int group() const { return heads / kv_heads; }
    MIRRORED_HD size_t qkv_width() const { return size_t(heads + 2 * kv_heads) * size_t(d); }
    MIRRORED_HD size_t out_width() const { return size_t(heads) * size_t(d); }
    MIRRORED_HD size_t q_at(int h) const { return size_t(h) * size_t(d); }
    MIRRORED_HD size_t k_at(int h) const { return size_t(heads + h / group()) * size_t(d); }
    MIRRORED_HD size_t v_at(int h) const { return size_t(heads + kv_heads + h / group()) * size_t(d); }
};

// Fused causal self-attention: for each of `samples` sequences of t positions and each head,
// out = softmax(scale q k^T, causal) v without a [t, t] matrix in memory - an online softmax over
// the keys, accumulated in f32 whatever the storage type. qkv [samples, t, qkv_width], out
// [samples, t, out_width]; lse [samples, heads, t]: each row's log-sum-exp of its scaled scores,
// for backward. Heads at most kMaxFusedHeadWidth wide.
constexpr int kMaxFusedHeadWidth = 128;
// An Error (on the caller's thread) when the heads do not fit the kernels: kv_heads not dividing
// heads, or wider than kMaxFusedHeadWidth.
void check_fused_heads(const AttentionHeads& a);
void attention_forward(Device& d, Stream s, int samples, int t, const AttentionHeads& a, float scale, const void* qkv,
                       void* out, float* lse);
// One new position's attention (generation with a key/value cache): qkv [t, qkv_width] holds the
// rows of positions 0..t-1, the new one last; its query attends over all t; out [out_width].
void attention_decode(Device& d, Stream s, int t, const AttentionHeads& a, float scale, const void* qkv, void* out);
// Its backward, the probabilities recomputed from q, k and lse: dqkv [samples, t, qkv_width]
// written (not added to) from dout; delta [samples, heads, t] is workspace (rowsum(dout * out)).
// A key/value head's gradients sum over the query heads of its group.
void attention_backward(Device& d, Stream s, int samples, int t, const AttentionHeads& a, float scale, const void* qkv,
                        const void* out, const void* dout, const float* lse, float* delta, void* dqkv);

// The CUDA launchers, set by attention.cu where the CUDA backend is built; each returns the
// kernels it launched.
struct AttentionKernels {
    int (*softmax)(const Device::NativeLaunch& l, int batches, int t, float scale, const void* scores,
                   void* probs) = nullptr;
    int (*softmax_backward)(const Device::NativeLaunch& l, int batches, int t, float scale, const void* probs,
                            const void* dprobs, void* dscores) = nullptr;
    int (*forward)(const Device::NativeLaunch& l, int samples, int t, const AttentionHeads& a, float scale,
                   const void* qkv, void* out, float* lse) = nullptr;
    int (*decode)(const Device::NativeLaunch& l, int t, const AttentionHeads& a, float scale, const void* qkv,
                  void* out) = nullptr;
    int (*backward)(const Device::NativeLaunch& l, int samples, int t, const AttentionHeads& a, float scale,
                    const void* qkv, const void* out, const void* dout, const float* lse, float* delta,
                    void* dqkv) = nullptr;
};
extern AttentionKernels attention_cuda;

}  // namespace mirrored
