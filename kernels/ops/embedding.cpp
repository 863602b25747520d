#include "kernels/ops/embedding.h"

#include <algorithm>

#include "kernels/cpu/loop_clones.h"

namespace mirrored {

EmbeddingKernels embedding_cuda;

void embedding_forward(Device& d, Stream s, int tokens, int vocab, int dim, const float* ids, const void* table,
                       void* y) {
    if (d.runs_cuda_kernels())
        return launch_cuda(d, s, embedding_cuda.forward, "embedding_forward", tokens, vocab, dim, ids, table, y);
    run_on_host(d, s, "embedding_forward", [=](const Device&) {
        for (int i = 0; i < tokens; ++i) {
            const int id = int(ids[i]);
            float* out = as_floats(y) + size_t(i) * dim;
            if (id < 0 || id >= vocab) std::fill(out, out + dim, 0.0f);
            else std::copy_n(as_floats(table) + size_t(id) * dim, dim, out);
        }
    });
}

void embedding_backward(Device& d, Stream s, int tokens, int vocab, int dim, const float* ids, const void* dy,
                        float* dtable) {
    if (d.runs_cuda_kernels())
        return launch_cuda(d, s, embedding_cuda.backward, "embedding_backward", tokens, vocab, dim, ids, dy, dtable);
    run_on_host(d, s, "embedding_backward", [=](const Device&) {
        for (int i = 0; i < tokens; ++i) {
            const int id = int(ids[i]);
            if (id < 0 || id >= vocab) continue;
            const float* g = as_floats(dy) + size_t(i) * dim;
            float* t = dtable + size_t(id) * dim;
            for (int j = 0; j < dim; ++j) t[j] += g[j];
        }
    });
}

}  // namespace mirrored
