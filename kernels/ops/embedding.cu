// The token embedding's CUDA kernels (embedding.h).
#include "kernels/cuda/kernel_util.cuh"
#include "kernels/ops/embedding.h"

namespace mirrored::cuda {

namespace {

template <typename T>
__global__ void embedding_forward_kernel(int tokens, int vocab, int dim, const float* ids, const T* table, T* y) {
    GRID_LOOP(e, size_t(tokens) * dim) {
        const size_t i = e / size_t(dim), j = e % size_t(dim);
        const int id = int(ids[i]);
        st(y, e, id >= 0 && id < vocab ? ld(table, size_t(id) * dim + j) : 0.0f);
    }
}

// Thread (column j, slice k) adds, in token order, the rows of the tokens whose id % slices == k:
// every gradient element has one writer and a fixed order, so no atomics and the same bits each run.
template <typename T>
__global__ void embedding_backward_kernel(int tokens, int vocab, int dim, const float* ids, const T* dy,
                                          float* dtable) {
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    const int slice = blockIdx.y, slices = gridDim.y;
    if (j >= dim) return;
    for (int i = 0; i < tokens; ++i) {
        const int id = int(ids[i]);
        if (id < 0 || id >= vocab || id % slices != slice) continue;
        dtable[size_t(id) * dim + j] += ld(dy, size_t(i) * dim + j);
    }
}

int forward(const Device::NativeLaunch& l, int tokens, int vocab, int dim, const float* ids, const void* table,
            void* y) {
    if (tokens <= 0 || dim <= 0) return 0;
    const cudaStream_t s = stream_of(l);
    DISPATCH(l.act, embedding_forward_kernel<<<grid_for(size_t(tokens) * dim), kThreads, 0, s>>>(
                        tokens, vocab, dim, ids, as<T>(table), as<T>(y)));
    CUDA_LAUNCH_CHECK(l.device);
    return 1;
}

int backward(const Device::NativeLaunch& l, int tokens, int vocab, int dim, const float* ids, const void* dy,
             float* dtable) {
    if (tokens <= 0 || dim <= 0) return 0;
    const cudaStream_t s = stream_of(l);
    const dim3 grid(unsigned((dim + kThreads - 1) / kThreads), unsigned(std::min(vocab, 32)));
    DISPATCH(l.act, embedding_backward_kernel<<<grid, kThreads, 0, s>>>(tokens, vocab, dim, ids, as<T>(dy), dtable));
    CUDA_LAUNCH_CHECK(l.device);
    return 1;
}

const struct Register {
    Register() { embedding_cuda = {forward, backward}; }
} registered;

}  // namespace

}  // namespace mirrored::cuda
