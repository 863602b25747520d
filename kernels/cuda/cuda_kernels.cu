// The CUDA backend's own kernels (everything but GEMM, which is cuBLAS). Each kernel is followed
// by its launcher; launchers own the grid and check the launch. Reductions use fixed grids and
// fixed-order trees, never floating-point atomics, so results repeat bit for bit.
#include <climits>
#include <cmath>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/error.h"
#include "kernels/op_math.h"

namespace mirrored::cuda {

namespace {

constexpr int kThreads = 256;

unsigned grid_for(size_t n) {
    const size_t blocks = (n + kThreads - 1) / kThreads;
    return static_cast<unsigned>(blocks < 65536 ? (blocks ? blocks : 1) : 65536);
}

// Fixed-order tree sum of one value per thread over a 256-thread block; result in thread 0.
__device__ float block_sum_256(float v, float* shared) {
    shared[threadIdx.x] = v;
    __syncthreads();
    for (int s = kThreads / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) shared[threadIdx.x] += shared[threadIdx.x + s];
        __syncthreads();
    }
    return shared[0];
}

}  // namespace

size_t scratch_floats_needed(int max_rows) {
    const size_t rows = max_rows > 0 ? static_cast<size_t>(max_rows) : 1;
    return 2 * rows > static_cast<size_t>(kReduceBlocks) ? 2 * rows : kReduceBlocks;
}

// ---- bias + activation ------------------------------------------------------------------

__global__ void bias_act_forward_kernel(Activation act, int rows, int cols, const float* bias,
                                        float* z, float* out) {
    const size_t n = static_cast<size_t>(rows) * cols;
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
         i += size_t(gridDim.x) * blockDim.x) {
        const float v = bias ? z[i] + bias[i % cols] : z[i];
        z[i] = v;
        out[i] = act_forward(act, v);
    }
}

void bias_act_forward(cudaStream_t s, int dev, Activation act, int rows, int cols, const float* bias,
                      float* z, float* out) {
    if (rows <= 0 || cols <= 0) return;
    bias_act_forward_kernel<<<grid_for(size_t(rows) * cols), kThreads, 0, s>>>(act, rows, cols, bias,
                                                                                z, out);
    CUDA_LAUNCH_CHECK(dev);
}

__global__ void act_backward_kernel(Activation act, size_t n, const float* z, const float* dout,
                                    float* dz) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
         i += size_t(gridDim.x) * blockDim.x)
        dz[i] = dout[i] * act_derivative(act, z[i]);
}

void act_backward(cudaStream_t s, int dev, Activation act, size_t n, const float* z,
                  const float* dout, float* dz) {
    if (n == 0) return;
    act_backward_kernel<<<grid_for(n), kThreads, 0, s>>>(act, n, z, dout, dz);
    CUDA_LAUNCH_CHECK(dev);
}

// ---- bias gradient: column sums, 32 columns x 16 row-strides per block --------------------

constexpr int kBgCols = 32, kBgRows = 16;

__global__ void bias_grad_kernel(int rows, int cols, const float* dz, float* db, bool accumulate) {
    __shared__ float partial[kBgRows][kBgCols + 1];
    const int col = blockIdx.x * kBgCols + threadIdx.x;
    float s = 0.0f;
    if (col < cols)
        for (int r = threadIdx.y; r < rows; r += kBgRows) s += dz[size_t(r) * cols + col];
    partial[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && col < cols) {
        float total = 0.0f;
        for (int r = 0; r < kBgRows; ++r) total += partial[r][threadIdx.x];
        db[col] = accumulate ? db[col] + total : total;
    }
}

void bias_grad(cudaStream_t s, int dev, int rows, int cols, const float* dz, float* db,
               bool accumulate) {
    if (cols <= 0) return;
    const dim3 block(kBgCols, kBgRows);
    bias_grad_kernel<<<(cols + kBgCols - 1) / kBgCols, block, 0, s>>>(rows, cols, dz, db, accumulate);
    CUDA_LAUNCH_CHECK(dev);
}

// ---- softmax cross-entropy: one warp per row, then a one-block deterministic sum ----------

__global__ void softmax_xent_kernel(int rows, int classes, const float* logits,
                                    const int32_t* labels, float grad_scale, float* dlogits,
                                    float* row_loss, float* row_correct) {
    const int row = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32;
    if (row >= rows) return;  // whole warps leave together: rows are warp-aligned
    const float* z = logits + size_t(row) * classes;
    float mx = -INFINITY;
    int arg = INT_MAX;
    for (int j = lane; j < classes; j += 32)
        if (z[j] > mx) {
            mx = z[j];
            arg = j;
        }
    for (int off = 16; off > 0; off >>= 1) {  // max; first index on ties, like the CPU
        const float omx = __shfl_xor_sync(0xffffffffu, mx, off);
        const int oarg = __shfl_xor_sync(0xffffffffu, arg, off);
        if (omx > mx || (omx == mx && oarg < arg)) {
            mx = omx;
            arg = oarg;
        }
    }
    float sum = 0.0f;
    for (int j = lane; j < classes; j += 32) sum += expf(z[j] - mx);
    for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
    const int y = labels[row];
    if (lane == 0) {
        row_loss[row] = logf(sum) + mx - z[y];
        row_correct[row] = arg == y ? 1.0f : 0.0f;
    }
    if (dlogits) {
        float* d = dlogits + size_t(row) * classes;
        const float inv = 1.0f / sum;
        for (int j = lane; j < classes; j += 32)
            d[j] = (expf(z[j] - mx) * inv - (j == y ? 1.0f : 0.0f)) * grad_scale;
    }
}

__global__ void metrics_accumulate_kernel(int rows, const float* row_loss, const float* row_correct,
                                          double* metrics) {
    __shared__ float shared[kThreads];
    float loss = 0.0f, correct = 0.0f;
    for (int i = threadIdx.x; i < rows; i += kThreads) {
        loss += row_loss[i];
        correct += row_correct[i];
    }
    loss = block_sum_256(loss, shared);
    __syncthreads();
    correct = block_sum_256(correct, shared);
    if (threadIdx.x == 0) {  // double accumulators: counts stay exact far beyond 2^24
        metrics[kMetricLossSum] += double(loss);
        metrics[kMetricCorrect] += double(correct);
        metrics[kMetricCount] += double(rows);
    }
}

void softmax_xent(cudaStream_t s, int dev, int rows, int classes, const float* logits,
                  const int32_t* labels, float grad_scale, float* dlogits, double* metrics,
                  float* scratch) {
    if (rows <= 0) return;
    constexpr int kRowsPerBlock = kThreads / 32;
    softmax_xent_kernel<<<(rows + kRowsPerBlock - 1) / kRowsPerBlock, kThreads, 0, s>>>(
        rows, classes, logits, labels, grad_scale, dlogits, scratch, scratch + rows);
    CUDA_LAUNCH_CHECK(dev);
    metrics_accumulate_kernel<<<1, kThreads, 0, s>>>(rows, scratch, scratch + rows, metrics);
    CUDA_LAUNCH_CHECK(dev);
}

// ---- dropout --------------------------------------------------------------------------

__global__ void dropout_kernel(DropoutArgs a, int rows, int cols, const float* x, float* y) {
    const size_t n = static_cast<size_t>(rows) * cols;
    const float keep_scale = 1.0f / (1.0f - a.rate);
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
         i += size_t(gridDim.x) * blockDim.x) {
        const int row = static_cast<int>(i / cols), col = static_cast<int>(i % cols);
        y[i] = dropout_keep(a.seed, a.layer_id, a.step, a.row_offset + row, cols, col, a.rate)
                   ? x[i] * keep_scale
                   : 0.0f;
    }
}

void dropout(cudaStream_t s, int dev, const DropoutArgs& a, int rows, int cols, const float* x,
             float* y) {
    if (rows <= 0 || cols <= 0) return;
    dropout_kernel<<<grid_for(size_t(rows) * cols), kThreads, 0, s>>>(a, rows, cols, x, y);
    CUDA_LAUNCH_CHECK(dev);
}

// ---- flat-buffer ops --------------------------------------------------------------------

__global__ void fill_kernel(size_t n, float value, float* x) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
         i += size_t(gridDim.x) * blockDim.x)
        x[i] = value;
}

void fill(cudaStream_t s, int dev, size_t n, float value, float* x) {
    if (n == 0) return;
    fill_kernel<<<grid_for(n), kThreads, 0, s>>>(n, value, x);
    CUDA_LAUNCH_CHECK(dev);
}

__global__ void scale_kernel(size_t n, float alpha, float* x) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
         i += size_t(gridDim.x) * blockDim.x)
        x[i] *= alpha;
}

void scale(cudaStream_t s, int dev, size_t n, float alpha, float* x) {
    if (n == 0) return;
    scale_kernel<<<grid_for(n), kThreads, 0, s>>>(n, alpha, x);
    CUDA_LAUNCH_CHECK(dev);
}

__global__ void axpy_kernel(size_t n, float alpha, const float* x, float* y) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
         i += size_t(gridDim.x) * blockDim.x)
        y[i] += alpha * x[i];
}

void axpy(cudaStream_t s, int dev, size_t n, float alpha, const float* x, float* y) {
    if (n == 0) return;
    axpy_kernel<<<grid_for(n), kThreads, 0, s>>>(n, alpha, x, y);
    CUDA_LAUNCH_CHECK(dev);
}

__global__ void sum_squares_partial_kernel(size_t n, const float* x, float* partial) {
    __shared__ float shared[kThreads];
    float s = 0.0f;
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
         i += size_t(gridDim.x) * blockDim.x)
        s += x[i] * x[i];
    s = block_sum_256(s, shared);
    if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

__global__ void sum_partials_kernel(int count, const float* partial, float* out) {
    __shared__ float shared[kThreads];
    float s = 0.0f;
    for (int i = threadIdx.x; i < count; i += kThreads) s += partial[i];
    s = block_sum_256(s, shared);
    if (threadIdx.x == 0) *out = s;
}

void sum_squares(cudaStream_t s, int dev, size_t n, const float* x, float* out, float* scratch) {
    sum_squares_partial_kernel<<<kReduceBlocks, kThreads, 0, s>>>(n, x, scratch);
    CUDA_LAUNCH_CHECK(dev);
    sum_partials_kernel<<<1, kThreads, 0, s>>>(kReduceBlocks, scratch, out);
    CUDA_LAUNCH_CHECK(dev);
}

__global__ void init_params_kernel(InitKind kind, uint64_t seed, uint32_t tensor_id, float sc,
                                   size_t n, float* out) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
         i += size_t(gridDim.x) * blockDim.x)
        out[i] = init_value(kind, seed, tensor_id, sc, i);
}

void init_params(cudaStream_t s, int dev, const InitArgs& a, float sc, size_t n, float* out) {
    if (n == 0) return;
    init_params_kernel<<<grid_for(n), kThreads, 0, s>>>(a.kind, a.seed, a.tensor_id, sc, n, out);
    CUDA_LAUNCH_CHECK(dev);
}

// ---- optimizers: one fused pass over the flat buffers --------------------------------------

__global__ void sgd_kernel(size_t n, float* p, const float* g, float* m, SgdArgs a) {
    const float clip = clip_factor(a.clip_norm, a.grad_sq_norm);
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
         i += size_t(gridDim.x) * blockDim.x) {
        float d = g[i] * clip + a.weight_decay * p[i];
        if (a.momentum != 0.0f) {
            const float mi = a.momentum * m[i] + d;
            m[i] = mi;
            d = a.nesterov ? d + a.momentum * mi : mi;
        }
        p[i] -= a.lr * d;
    }
}

void sgd_update(cudaStream_t s, int dev, size_t n, float* p, const float* g, float* m,
                const SgdArgs& a) {
    if (n == 0) return;
    sgd_kernel<<<grid_for(n), kThreads, 0, s>>>(n, p, g, m, a);
    CUDA_LAUNCH_CHECK(dev);
}

__global__ void adamw_kernel(size_t n, float* p, const float* g, float* m, float* v, AdamWArgs a,
                             float bc1, float bc2_sqrt) {
    const float clip = clip_factor(a.clip_norm, a.grad_sq_norm);
    const float step_size = a.lr / bc1;
    const float decay = 1.0f - a.lr * a.weight_decay;
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
         i += size_t(gridDim.x) * blockDim.x) {
        const float gi = g[i] * clip;
        const float mi = a.beta1 * m[i] + (1.0f - a.beta1) * gi;
        const float vi = a.beta2 * v[i] + (1.0f - a.beta2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        p[i] = p[i] * decay - step_size * mi / (sqrtf(vi) / bc2_sqrt + a.eps);
    }
}

void adamw_update(cudaStream_t s, int dev, size_t n, float* p, const float* g, float* m, float* v,
                  const AdamWArgs& a, float bc1, float bc2_sqrt) {
    if (n == 0) return;
    adamw_kernel<<<grid_for(n), kThreads, 0, s>>>(n, p, g, m, v, a, bc1, bc2_sqrt);
    CUDA_LAUNCH_CHECK(dev);
}

// ---- checksum: wrap-around integer sum, so atomics keep it deterministic -------------------

__global__ void checksum_kernel(size_t n, const float* x, unsigned long long* out) {
    unsigned long long s = 0;
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
         i += size_t(gridDim.x) * blockDim.x)
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

// ---- the all-reduce's reduce step: dst += src, src possibly on a peer GPU -----------------

__global__ void add_inplace_vec4_kernel(size_t n4, const float4* src, float4* dst) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n4;
         i += size_t(gridDim.x) * blockDim.x) {
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
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
         i += size_t(gridDim.x) * blockDim.x)
        dst[i] += src[i];
}

void add_inplace(cudaStream_t s, int dev, size_t n, const float* src, float* dst) {
    if (n == 0) return;
    const bool aligned = (reinterpret_cast<uintptr_t>(src) % 16 == 0) &&
                         (reinterpret_cast<uintptr_t>(dst) % 16 == 0);
    size_t done = 0;
    if (aligned && n >= 4) {
        const size_t n4 = n / 4;
        add_inplace_vec4_kernel<<<grid_for(n4), kThreads, 0, s>>>(
            n4, reinterpret_cast<const float4*>(src), reinterpret_cast<float4*>(dst));
        CUDA_LAUNCH_CHECK(dev);
        done = n4 * 4;
    }
    if (done < n) {
        add_inplace_kernel<<<grid_for(n - done), kThreads, 0, s>>>(n - done, src + done, dst + done);
        CUDA_LAUNCH_CHECK(dev);
    }
}

}  // namespace mirrored::cuda
