// What the CUDA backend's kernel files share (kernels/cuda/cuda_kernels.cu and each op family's
// kernels/ops/*.cu): storage-type loads and stores, the type dispatch, the grid of an elementwise
// launch, warp and block sums, and the fixed-order column reductions. Reductions use fixed grids
// and fixed-order trees, never floating-point atomics, so results repeat bit for bit. Activations
// are templates over their storage type (float, bf16, half): loads widen to float, stores round to
// nearest even, which is what the CPU reference's emulation does (kernels/op_math.h).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cub/block/block_reduce.cuh>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/column_plan.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/op_math.h"

namespace mirrored::cuda {

constexpr int kThreads = 256;

inline unsigned grid_for(size_t n) {
    const size_t blocks = (n + kThreads - 1) / kThreads;
    return static_cast<unsigned>(blocks < 65536 ? (blocks ? blocks : 1) : 65536);
}

// Blocks of a launch with one warp per row (the row-wise kernels: norms, softmaxes, losses).
inline unsigned warp_rows_grid(int64_t rows) {
    constexpr int kRowsPerBlock = kThreads / 32;
    return unsigned((rows + kRowsPerBlock - 1) / kRowsPerBlock);
}

#define GRID_LOOP(i, n) \
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < (n); i += size_t(gridDim.x) * blockDim.x)

// Loads widen to float; stores round to nearest even.
__device__ __forceinline__ float ld(const float* p, size_t i) { return p[i]; }
__device__ __forceinline__ float ld(const __nv_bfloat16* p, size_t i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ float ld(const __half* p, size_t i) { return __half2float(p[i]); }
__device__ __forceinline__ void st(float* p, size_t i, float v) { p[i] = v; }
__device__ __forceinline__ void st(__nv_bfloat16* p, size_t i, float v) { p[i] = __float2bfloat16_rn(v); }
__device__ __forceinline__ void st(__half* p, size_t i, float v) { p[i] = __float2half_rn(v); }

// Runs the body with T the storage type of `t`.
#define DISPATCH(t, ...)             \
    switch (t) {                     \
        case DType::f32: {           \
            using T = float;         \
            __VA_ARGS__;             \
        } break;                     \
        case DType::bf16: {          \
            using T = __nv_bfloat16; \
            __VA_ARGS__;             \
        } break;                     \
        default: {                   \
            using T = __half;        \
            __VA_ARGS__;             \
        } break;                     \
    }

template <typename T>
const T* as(const void* p) {
    return static_cast<const T*>(p);
}
template <typename T>
T* as(void* p) {
    return static_cast<T*>(p);
}

// Two sums over a kThreads block at once, in thread 0: CUB's block reduction, whose order is fixed
// by the block size, so the sums repeat bit for bit on every GPU.
struct PairSum {
    __device__ float2 operator()(const float2& a, const float2& b) const { return make_float2(a.x + b.x, a.y + b.y); }
};
using BlockPairReduce = cub::BlockReduce<float2, kThreads>;

// A fixed butterfly: every lane ends with the same sum, which the softmax and layernorm rows
// need in every lane (cub::WarpReduce leaves it in lane 0 only).
__device__ __forceinline__ float warp_sum(float v) {
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

// ---- column reductions: out[col] = sum over rows of f(row, col), two sums at once, in a fixed
// order: blocks of 32 columns x 16 row lanes, over all rows or, split by column_plan, over fixed
// row chunks whose partial sums a second kernel adds in chunk order.
struct ColumnOut {
    float* partial;  // [cols][chunks][2], or null: one pass, straight into out0 / out1
    float* out0;
    float* out1;
    bool accumulate;
};

__device__ __forceinline__ void column_store(float* out, int col, float v, bool accumulate) {
    if (out) out[col] = accumulate ? out[col] + v : v;
}

template <typename F>
__global__ void column_partials_kernel(int rows, int cols, int chunk_rows, F f, ColumnOut o) {
    __shared__ float pa[kColumnRowLanes][kColumnTile + 1], pb[kColumnRowLanes][kColumnTile + 1];
    const int col = blockIdx.x * kColumnTile + threadIdx.x;
    const long long r0 = static_cast<long long>(blockIdx.y) * chunk_rows;
    const long long r1 = min(static_cast<long long>(rows), r0 + chunk_rows);
    float a = 0.0f, b = 0.0f;
    if (col < cols)
        for (long long r = r0 + threadIdx.y; r < r1; r += kColumnRowLanes) f(static_cast<int>(r), col, a, b);
    pa[threadIdx.y][threadIdx.x] = a;
    pb[threadIdx.y][threadIdx.x] = b;
    __syncthreads();
    if (threadIdx.y == 0 && col < cols) {
        float ta = 0.0f, tb = 0.0f;
        for (int r = 0; r < kColumnRowLanes; ++r) {
            ta += pa[r][threadIdx.x];
            tb += pb[r][threadIdx.x];
        }
        if (o.partial) {
            const size_t e = (size_t(col) * gridDim.y + blockIdx.y) * 2;
            o.partial[e] = ta;
            o.partial[e + 1] = tb;
        } else {
            column_store(o.out0, col, ta, o.accumulate);
            column_store(o.out1, col, tb, o.accumulate);
        }
    }
}

// One warp per column: lanes take every 32nd chunk in order, then a fixed butterfly.
// A template (over ColumnOut) so that every file including this header may instantiate it.
template <typename Out>
__global__ void column_finish_kernel(int cols, int chunks, Out o) {
    const int col = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
    if (col >= cols) return;  // whole warps leave together
    const float* p = o.partial + size_t(col) * chunks * 2;
    float a = 0.0f, b = 0.0f;
    for (int k = lane; k < chunks; k += 32) {
        a += p[2 * k];
        b += p[2 * k + 1];
    }
    a = warp_sum(a);
    b = warp_sum(b);
    if (lane == 0) {
        column_store(o.out0, col, a, o.accumulate);
        column_store(o.out1, col, b, o.accumulate);
    }
}

// Returns the kernels launched (1 or 2). scratch: kScratchFloats floats.
template <typename F>
int column_reduce(cudaStream_t s, int dev, int rows, int cols, F f, float* scratch, float* out0, float* out1,
                  bool accumulate) {
    if (cols <= 0) return 0;
    const ColumnPlan plan = column_plan(rows, cols, kScratchFloats);
    ColumnOut o{plan.chunks > 1 ? scratch : nullptr, out0, out1, accumulate};
    const dim3 grid((cols + kColumnTile - 1) / kColumnTile, plan.chunks), block(kColumnTile, kColumnRowLanes);
    column_partials_kernel<<<grid, block, 0, s>>>(std::max(rows, 0), cols, plan.chunk_rows, f, o);
    CUDA_LAUNCH_CHECK(dev);
    if (plan.chunks == 1) return 1;
    constexpr int kColumnsPerBlock = kThreads / 32;
    const unsigned finish_blocks = unsigned((cols + kColumnsPerBlock - 1) / kColumnsPerBlock);
    column_finish_kernel<ColumnOut><<<finish_blocks, kThreads, 0, s>>>(cols, plan.chunks, o);
    CUDA_LAUNCH_CHECK(dev);
    return 2;
}

}  // namespace mirrored::cuda
