// The token embedding (torch.nn.Embedding): rows of a [vocab, dim] table looked up by id, and the
// table's gradient summed per id in a fixed order (no atomics: the same bits every run). Ids come
// as floats holding integers (the input pipeline's type); an id outside [0, vocab) reads zeros
// and adds nothing (the data readers refuse such ids before they get here).
// The CPU loops (embedding.cpp, the reference) and the CUDA kernels (embedding.cu) side by side.
#pragma once

#include "kernels/device.h"

namespace mirrored {

// y[i, 0..dim) = table[ids[i], 0..dim); table: the weights' compute copy (activation type)
void embedding_forward(Device& d, Stream s, int tokens, int vocab, int dim, const float* ids, const void* table,
                       void* y);
// dtable[ids[i]] += dy[i] for i in order; always adds
void embedding_backward(Device& d, Stream s, int tokens, int vocab, int dim, const float* ids, const void* dy,
                        float* dtable);

// The CUDA launchers, set by embedding.cu where the CUDA backend is built; each returns the
// kernels it launched.
struct EmbeddingKernels {
    int (*forward)(const Device::NativeLaunch& l, int tokens, int vocab, int dim, const float* ids, const void* table,
                   void* y) = nullptr;
    int (*backward)(const Device::NativeLaunch& l, int tokens, int vocab, int dim, const float* ids, const void* dy,
                    float* dtable) = nullptr;
};
extern EmbeddingKernels embedding_cuda;

}  // namespace mirrored
