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

// Fused causal self-attention: for each of `samples` sequences of t positions and each head,
// out = softmax(scale q k^T, causal) v without a [t, t] matrix in memory - an online softmax over
// the keys, accumulated in f32 whatever the storage type. qkv [samples, t, 3c]: head h's q in
// columns h*d.., k in c + h*d.., v in 2c + h*d.. (d = c / heads, at most kMaxFusedHeadWidth); out
// [samples, t, c], head h in columns h*d..; lse [samples, heads, t]: each row's log-sum-exp of
// its scaled scores, for backward.
constexpr int kMaxFusedHeadWidth = 128;
// c / heads, or an Error when the heads do not divide c or are wider than the kernels take.
int fused_head_width(int c, int heads);
void attention_forward(Device& d, Stream s, int samples, int t, int c, int heads, float scale, const void* qkv,
                       void* out, float* lse);
// Its backward, the probabilities recomputed from q, k and lse: dqkv [samples, t, 3c] written (not
// added to) from dout; delta [samples, heads, t] is workspace (rowsum(dout * out)).
void attention_backward(Device& d, Stream s, int samples, int t, int c, int heads, float scale, const void* qkv,
                        const void* out, const void* dout, const float* lse, float* delta, void* dqkv);

// The CUDA launchers, set by attention.cu where the CUDA backend is built; each returns the
// kernels it launched. The fused ones take the head width d that fused_head_width checked.
struct AttentionKernels {
    int (*softmax)(const Device::NativeLaunch& l, int batches, int t, float scale, const void* scores,
                   void* probs) = nullptr;
    int (*softmax_backward)(const Device::NativeLaunch& l, int batches, int t, float scale, const void* probs,
                            const void* dprobs, void* dscores) = nullptr;
    int (*forward)(const Device::NativeLaunch& l, int samples, int t, int c, int heads, int d, float scale,
                   const void* qkv, void* out, float* lse) = nullptr;
    int (*backward)(const Device::NativeLaunch& l, int samples, int t, int c, int heads, int d, float scale,
                    const void* qkv, const void* out, const void* dout, const float* lse, float* delta,
                    void* dqkv) = nullptr;
};
extern AttentionKernels attention_cuda;

}  // namespace mirrored
