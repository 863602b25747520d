// The CUDA kernels behind cuda_kernels.h's launchers, which several op families' launchers
// (kernels/ops/*.cu: activation, elementwise, flat, peer_sums) and the device share. Each kernel is followed by its launcher; launchers own the
// grid and check the launch. kernel_util.cuh has the loads, stores and reductions they share.
#include <algorithm>
#include <climits>
#include <cmath>

#include "base/error.h"
#include "kernels/cuda/kernel_util.cuh"

namespace mirrored::cuda {

size_t scratch_floats_needed(int max_rows) {
    const size_t rows = max_rows > 0 ? static_cast<size_t>(max_rows) : 1;
    return std::max(2 * rows, kScratchFloats);
}

// ---- bias + activation ------------------------------------------------------------------

template <typename T>
__global__ void bias_act_forward_kernel(Activation act, int rows, int cols, const float* bias, T* z, T* out) {
    GRID_LOOP(i, size_t(rows) * cols) {
        const float v = bias ? ld(z, i) + bias[i % cols] : ld(z, i);
        st(z, i, v);
        st(out, i, act_forward(act, ld(z, i)));  // from the stored (rounded) value, as the CPU
    }
}

void bias_act_forward(cudaStream_t s, int dev, DType t, Activation act, int rows, int cols, const float* bias, void* z,
                      void* out) {
    if (rows <= 0 || cols <= 0) return;
    DISPATCH(t, bias_act_forward_kernel<<<grid_for(size_t(rows) * cols), kThreads, 0, s>>>(act, rows, cols, bias,
                                                                                           as<T>(z), as<T>(out)));
    CUDA_LAUNCH_CHECK(dev);
}

template <typename T>
__global__ void act_backward_kernel(Activation act, size_t n, const T* z, const T* dout, T* dz) {
    GRID_LOOP(i, n) st(dz, i, act_backward_value(act, ld(z, i), ld(dout, i)));
}

void act_backward(cudaStream_t s, int dev, DType t, Activation act, size_t n, const void* z, const void* dout,
                  void* dz) {
    if (n == 0) return;
    DISPATCH(t, act_backward_kernel<<<grid_for(n), kThreads, 0, s>>>(act, n, as<T>(z), as<T>(dout), as<T>(dz)));
    CUDA_LAUNCH_CHECK(dev);
}

// ---- bias gradient: column sums -------------------------------------------------------

template <typename T>
struct ColumnOf {
    const T* x;
    int cols;
    __device__ void operator()(int r, int c, float& a, float&) const { a += ld(x, size_t(r) * cols + c); }
};

int bias_grad(cudaStream_t s, int dev, DType t, int rows, int cols, const void* dz, float* db, bool accumulate,
              float* scratch) {
    DISPATCH(t,
             return column_reduce(s, dev, rows, cols, ColumnOf<T>{as<T>(dz), cols}, scratch, db, nullptr, accumulate));
    return 0;
}

// ---- conversion, residual add ----------------------------------------------------

template <typename X, typename Y>
__global__ void convert_kernel(size_t n, const X* x, Y* y) {
    GRID_LOOP(i, n) st(y, i, ld(x, i));
}

void convert(cudaStream_t s, int dev, size_t n, const void* x, DType xt, void* y, DType yt) {
    if (n == 0) return;
    DISPATCH(xt, {
        using X = T;
        DISPATCH(yt, convert_kernel<<<grid_for(n), kThreads, 0, s>>>(n, as<X>(x), as<T>(y)));
    });
    CUDA_LAUNCH_CHECK(dev);
}

template <typename T>
__global__ void add_kernel(size_t n, const T* x, T* y) {
    GRID_LOOP(i, n) st(y, i, ld(y, i) + ld(x, i));
}

void add(cudaStream_t s, int dev, DType t, size_t n, const void* x, void* y) {
    if (n == 0) return;
    DISPATCH(t, add_kernel<<<grid_for(n), kThreads, 0, s>>>(n, as<T>(x), as<T>(y)));
    CUDA_LAUNCH_CHECK(dev);
}

// ---- flat-buffer ops --------------------------------------------------------------------

__global__ void fill_kernel(size_t n, float value, float* x) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
        x[i] = value;
}

void fill(cudaStream_t s, int dev, size_t n, float value, float* x) {
    if (n == 0) return;
    fill_kernel<<<grid_for(n), kThreads, 0, s>>>(n, value, x);
    CUDA_LAUNCH_CHECK(dev);
}

// The values are the kernel's argument, copied at launch: nothing is read from the host later.
__global__ void set_step_values_kernel(StepValues v, StepValues* dst) { *dst = v; }

void set_step_values(cudaStream_t s, int dev, const StepValues& v, StepValues* dst) {
    set_step_values_kernel<<<1, 1, 0, s>>>(v, dst);
    CUDA_LAUNCH_CHECK(dev);
}

__global__ void scale_kernel(size_t n, float alpha, float* x) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
        x[i] *= alpha;
}

void scale(cudaStream_t s, int dev, size_t n, float alpha, float* x) {
    if (n == 0) return;
    scale_kernel<<<grid_for(n), kThreads, 0, s>>>(n, alpha, x);
    CUDA_LAUNCH_CHECK(dev);
}

__global__ void axpy_kernel(size_t n, float alpha, const float* x, float* y) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
        y[i] += alpha * x[i];
}

void axpy(cudaStream_t s, int dev, size_t n, float alpha, const float* x, float* y) {
    if (n == 0) return;
    axpy_kernel<<<grid_for(n), kThreads, 0, s>>>(n, alpha, x, y);
    CUDA_LAUNCH_CHECK(dev);
}

// sum of (x / loss_scale)^2 and the count of non-finite x: a grid fixed by n (at most
// kReduceBlocks blocks, none without elements), then one block over the partial sums. Not
// cub::DeviceReduce: its grid follows the GPU's SM count, so replicas on two GPU models would
// disagree in the last bits of the gradient norm (and clip differently); and this is one pass
// over the gradients for the unscaled norm and the overflow check together.
__global__ void sum_squares_partial_kernel(size_t n, const float* x, const float* loss_scale, float* partial) {
    __shared__ BlockPairReduce::TempStorage temp;
    const float inv = loss_scale ? 1.0f / *loss_scale : 1.0f;
    float2 sums = make_float2(0.0f, 0.0f);  // squares, non-finite count
    GRID_LOOP(i, n) {
        const float v = x[i];
        if (!isfinite(v)) sums.y += 1.0f;
        sums.x += (v * inv) * (v * inv);
    }
    sums = BlockPairReduce(temp).Reduce(sums, PairSum());
    if (threadIdx.x == 0) {
        partial[blockIdx.x] = sums.x;
        partial[kReduceBlocks + blockIdx.x] = sums.y;
    }
}

__global__ void sum_partials_kernel(int blocks, const float* partial, float* out) {
    __shared__ BlockPairReduce::TempStorage temp;
    float2 sums = make_float2(0.0f, 0.0f);
    for (int i = threadIdx.x; i < blocks; i += kThreads) {
        sums.x += partial[i];
        sums.y += partial[kReduceBlocks + i];
    }
    sums = BlockPairReduce(temp).Reduce(sums, PairSum());
    if (threadIdx.x == 0) {
        out[0] = sums.x;
        out[1] = sums.y;
    }
}

void sum_squares(cudaStream_t s, int dev, size_t n, const float* x, const float* loss_scale, float* out,
                 float* scratch) {
    const int blocks = int(std::min<unsigned>(grid_for(n), kReduceBlocks));
    sum_squares_partial_kernel<<<blocks, kThreads, 0, s>>>(n, x, loss_scale, scratch);
    CUDA_LAUNCH_CHECK(dev);
    sum_partials_kernel<<<1, kThreads, 0, s>>>(blocks, scratch, out);
    CUDA_LAUNCH_CHECK(dev);
}

__global__ void init_params_kernel(InitKind kind, uint64_t seed, uint32_t tensor_id, float sc, size_t n, float* out) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
        out[i] = init_value(kind, seed, tensor_id, sc, i);
}

void init_params(cudaStream_t s, int dev, const InitArgs& a, float sc, size_t n, float* out) {
    if (n == 0) return;
    init_params_kernel<<<grid_for(n), kThreads, 0, s>>>(a.kind, a.seed, a.tensor_id, sc, n, out);
    CUDA_LAUNCH_CHECK(dev);
}

// ---- checksum: wrap-around integer sum, so atomics keep it deterministic -------------------

__global__ void checksum_kernel(size_t n, const float* x, unsigned long long* out) {
    unsigned long long s = 0;
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
        s += checksum_term(__float_as_uint(x[i]), i);
    for (int off = 16; off > 0; off >>= 1) s += __shfl_down_sync(0xffffffffu, s, off);
    if (threadIdx.x % 32 == 0) atomicAdd(out, s);
}

void checksum(cudaStream_t s, int dev, size_t n, const float* x, uint64_t* out) {
    CUDA_CHECK(dev, cudaMemsetAsync(out, 0, sizeof(uint64_t), s));
    if (n == 0) return;
    checksum_kernel<<<grid_for(n), kThreads, 0, s>>>(n, x, reinterpret_cast<unsigned long long*>(out));
    CUDA_LAUNCH_CHECK(dev);
}

// ---- the direct all-reduce: each replica sums its slice of every buffer, writes it to all -----

template <typename T>
__global__ void sum_to_all_kernel(PeerBuffers b, size_t offset, size_t n) {
    GRID_LOOP(j, n) {
        const size_t i = offset + j;
        float s = ld(static_cast<const T*>(b.ptr[0]), i);
        for (int k = 1; k < b.count; ++k) s += ld(static_cast<const T*>(b.ptr[k]), i);
        for (int k = 0; k < b.count; ++k) st(static_cast<T*>(b.ptr[k]), i, s);
    }
}

void sum_to_all(cudaStream_t s, int dev, const PeerBuffers& b, size_t offset, size_t n, DType t) {
    if (n == 0) return;
    DISPATCH(t, sum_to_all_kernel<T><<<grid_for(n), kThreads, 0, s>>>(b, offset, n));
    CUDA_LAUNCH_CHECK(dev);
}

// sum_into: the own value first, then the others in buffer order (the CPU's order).
__global__ void sum_into_kernel(PeerBuffers b, int into, size_t offset, size_t n) {
    float* own = static_cast<float*>(b.ptr[into]);
    GRID_LOOP(j, n) {
        const size_t i = offset + j;
        float s = own[i];
        for (int k = 0; k < b.count; ++k)
            if (k != into) s += static_cast<const float*>(b.ptr[k])[i];
        own[i] = s;
    }
}

void sum_into(cudaStream_t s, int dev, const PeerBuffers& b, int into, size_t offset, size_t n) {
    if (n == 0) return;
    sum_into_kernel<<<grid_for(n), kThreads, 0, s>>>(b, into, offset, n);
    CUDA_LAUNCH_CHECK(dev);
}

// ---- the all-reduce's reduce step: dst += src, src possibly on a peer GPU -----------------

__global__ void add_inplace_vec4_kernel(size_t n4, const float4* src, float4* dst) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n4; i += size_t(gridDim.x) * blockDim.x) {
        const float4 a = src[i];
        float4 b = dst[i];
        b.x += a.x;
        b.y += a.y;
        b.z += a.z;
        b.w += a.w;
        dst[i] = b;
    }
}

__global__ void add_inplace_kernel(size_t n, const float* src, float* dst) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
        dst[i] += src[i];
}

void add_inplace(cudaStream_t s, int dev, size_t n, const float* src, float* dst) {
    if (n == 0) return;
    const bool aligned = (reinterpret_cast<uintptr_t>(src) % 16 == 0) && (reinterpret_cast<uintptr_t>(dst) % 16 == 0);
    size_t done = 0;
    if (aligned && n >= 4) {
        const size_t n4 = n / 4;
        add_inplace_vec4_kernel<<<grid_for(n4), kThreads, 0, s>>>(n4, reinterpret_cast<const float4*>(src),
                                                                  reinterpret_cast<float4*>(dst));
        CUDA_LAUNCH_CHECK(dev);
        done = n4 * 4;
    }
    if (done < n) {
        add_inplace_kernel<<<grid_for(n - done), kThreads, 0, s>>>(n - done, src + done, dst + done);
        CUDA_LAUNCH_CHECK(dev);
    }
}

}  // namespace mirrored::cuda
