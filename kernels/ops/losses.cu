// The losses' CUDA kernels (losses.h): one warp per row, then a one-block sum in a fixed order.
#include <climits>
#include <string>

#include "base/error.h"
#include "kernels/cuda/kernel_util.cuh"
#include "kernels/ops/losses.h"

namespace mirrored::cuda {

namespace {

// Two floats per row in the scratch sized at start-up.
void check_rows(const Device::NativeLaunch& l, const char* op, int rows) {
    if (scratch_floats_needed(rows) > kScratchFloats)
        throw DeviceError("cuda:" + std::to_string(l.device) + ": " + op + " over " + std::to_string(rows) +
                          " rows exceeds the scratch sized at start-up");
}

// ---- softmax cross-entropy: one warp per row, then a one-block deterministic sum ----------

template <typename T>
__global__ void softmax_xent_kernel(int rows, int classes, const T* logits, const int32_t* labels, float grad_scale,
                                    const float* loss_scale, T* dlogits, float* row_loss, float* row_correct) {
    const int row = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32;
    if (row >= rows) return;  // whole warps leave together: rows are warp-aligned
    const size_t base = size_t(row) * classes;
    float mx = -INFINITY;
    int arg = INT_MAX;
    for (int j = lane; j < classes; j += 32) {
        const float z = ld(logits, base + j);
        if (z > mx) {
            mx = z;
            arg = j;
        }
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
    for (int j = lane; j < classes; j += 32) sum += expf(ld(logits, base + j) - mx);
    sum = warp_sum(sum);
    const int y = labels[row];
    if (lane == 0) {
        row_loss[row] = logf(sum) + mx - ld(logits, base + y);
        row_correct[row] = arg == y ? 1.0f : 0.0f;
    }
    if (dlogits) {
        const float gs = grad_scale * (loss_scale ? *loss_scale : 1.0f);
        const float inv = 1.0f / sum;
        for (int j = lane; j < classes; j += 32)
            st(dlogits, base + j, (expf(ld(logits, base + j) - mx) * inv - (j == y ? 1.0f : 0.0f)) * gs);
    }
}

__global__ void metrics_accumulate_kernel(int rows, const float* row_loss, const float* row_correct, double* metrics) {
    __shared__ BlockPairReduce::TempStorage temp;
    float2 sums = make_float2(0.0f, 0.0f);  // loss, correct
    for (int i = threadIdx.x; i < rows; i += kThreads) {
        sums.x += row_loss[i];
        sums.y += row_correct[i];
    }
    sums = BlockPairReduce(temp).Reduce(sums, PairSum());
    if (threadIdx.x == 0) {  // double accumulators: counts stay exact far beyond 2^24
        metrics[kMetricLossSum] += double(sums.x);
        metrics[kMetricCorrect] += double(sums.y);
        metrics[kMetricCount] += double(rows);
    }
}

int softmax_xent(const Device::NativeLaunch& l, int rows, int classes, const void* logits, const int32_t* labels,
                 float grad_scale, const float* loss_scale, void* dlogits, double* metrics) {
    if (rows <= 0) return 0;
    check_rows(l, "softmax_xent", rows);
    const cudaStream_t s = stream_of(l);
    float* scratch = l.scratch;
    DISPATCH(l.act, softmax_xent_kernel<<<warp_rows_grid(rows), kThreads, 0, s>>>(
                        rows, classes, as<T>(logits), labels, grad_scale, loss_scale, static_cast<T*>(dlogits), scratch,
                        scratch + rows));
    CUDA_LAUNCH_CHECK(l.device);
    metrics_accumulate_kernel<<<1, kThreads, 0, s>>>(rows, scratch, scratch + rows, metrics);
    CUDA_LAUNCH_CHECK(l.device);
    return 2;
}

// ---- losses against float targets: one warp per row, then the same deterministic sum ---------

template <typename T>
__global__ void target_loss_kernel(TargetLoss kind, int rows, int n, const T* logits, const float* targets,
                                   float grad_scale, const float* loss_scale, T* dlogits, float* row_loss,
                                   float* row_correct) {
    const int row = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32;
    if (row >= rows) return;  // whole warps leave together: rows are warp-aligned
    const float gs = grad_scale * (loss_scale ? *loss_scale : 1.0f) / float(n);  // as the CPU computes it
    const size_t base = size_t(row) * n;
    float loss = 0.0f, correct = 0.0f;
    for (int j = lane; j < n; j += 32) {
        const TargetLossTerm e = target_loss_term(kind, ld(logits, base + j), targets[base + j]);
        loss += e.loss;
        correct += e.correct ? 1.0f : 0.0f;
        if (dlogits) st(dlogits, base + j, e.grad * gs);
    }
    loss = warp_sum(loss);
    correct = warp_sum(correct);
    if (lane == 0) {
        row_loss[row] = loss / float(n);
        row_correct[row] = correct / float(n);
    }
}

int target_loss(const Device::NativeLaunch& l, TargetLoss kind, int rows, int n, const void* logits,
                const float* targets, float grad_scale, const float* loss_scale, void* dlogits, double* metrics) {
    if (rows <= 0) return 0;
    check_rows(l, "target_loss", rows);
    const cudaStream_t s = stream_of(l);
    float* scratch = l.scratch;
    DISPATCH(l.act, target_loss_kernel<<<warp_rows_grid(rows), kThreads, 0, s>>>(
                        kind, rows, n, as<T>(logits), targets, grad_scale, loss_scale, static_cast<T*>(dlogits),
                        scratch, scratch + rows));
    CUDA_LAUNCH_CHECK(l.device);
    metrics_accumulate_kernel<<<1, kThreads, 0, s>>>(rows, scratch, scratch + rows, metrics);
    CUDA_LAUNCH_CHECK(l.device);
    return 2;
}

const struct Register {
    Register() { loss_cuda = {softmax_xent, target_loss}; }
} registered;

}  // namespace

}  // namespace mirrored::cuda
