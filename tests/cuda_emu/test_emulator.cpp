// The emulated GPU's own rules (doctest suite "emulator", in the emulated build only): what it
// promises to catch, each shown caught, and correct code shown to pass.
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <doctest/doctest.h>

#include <cmath>
#include <numeric>
#include <vector>

#include "tests/cuda_emu/emu_state.h"
#include "tests/cuda_emu/kernel_emu.h"
// after kernel_emu.h, as the emulated build's -I puts it under the backend's kernels
#include "tests/cuda_emu/include/cub/block/block_reduce.cuh"

namespace {

// Launches kernel k as `k<<<grid, block, 0, s>>>(args)` does once rewrite.pl has rewritten it.
#define EMU_LAUNCH(k, grid, block, s) (::emu::Launch((grid), (block), 0, (s)) % [](auto... a) { k(a...); })

__global__ void block_sum(const float* x, float* out) {
    __shared__ float sh[256];
    sh[threadIdx.x] = x[blockIdx.x * 256 + threadIdx.x];
    __syncthreads();
    for (int s = 128; s > 0; s >>= 1) {
        if (int(threadIdx.x) < s) sh[threadIdx.x] += sh[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) out[blockIdx.x] = sh[0];
}

// Thread i reads what thread i + 1 writes in the same phase: a race.
__global__ void neighbour_race(float* out) {
    __shared__ float sh[64];
    sh[threadIdx.x] = float(threadIdx.x);
    out[threadIdx.x] = threadIdx.x + 1 < 64 ? sh[threadIdx.x + 1] : 0.0f;
}

__global__ void divergent_barrier(float* out) {
    if (threadIdx.x < 32) return;  // half the block leaves, the rest waits for it
    __syncthreads();
    out[threadIdx.x] = 1.0f;
}

__global__ void warp_butterfly(float* out) {
    float v = float(threadIdx.x % 32);
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    out[threadIdx.x] = v;
}

// A 2-D block: warps are 32 consecutive linear thread ids (x fastest), not rows of x.
__global__ void warp_butterfly_2d(float* out) {
    const int linear = int(threadIdx.y * blockDim.x + threadIdx.x);
    float v = float(linear % 32);
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    out[linear] = v;
}

__global__ void half_warp_shuffle(float* out) {
    if (threadIdx.x % 32 >= 16) return;
    out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
}

// Each thread adds to shared memory no thread of its block wrote: garbage on a GPU.
__global__ void shared_read_before_write(float* out) {
    __shared__ float sh[64];
    ::emu::shared_memory(sh, sizeof sh);  // what rewrite.pl adds after a .cu file's declaration
    sh[threadIdx.x] += 1.0f;
    out[threadIdx.x] = sh[threadIdx.x];
}

__global__ void copy_one(const float* x, float* y) { y[threadIdx.x] = x[threadIdx.x]; }

__global__ void twice(float* x) { x[threadIdx.x] *= 2.0f; }

// Blocks read what the block before them wrote: an order the GPU does not promise.
__global__ void prefix_over_blocks(float* x) {
    if (blockIdx.x > 0 && threadIdx.x == 0) x[blockIdx.x] += x[blockIdx.x - 1];
}

using BlockReduce64 = cub::BlockReduce<float, 64>;

// out[0] = the block's sum; out[1 + t] = what thread t got back (valid in thread 0 only).
__global__ void cub_block_sum(const float* x, float* out) {
    __shared__ BlockReduce64::TempStorage temp;
    ::emu::shared_memory(&temp, sizeof temp);  // what rewrite.pl adds after a .cu file's declaration
    const float v = BlockReduce64(temp).Sum(x[threadIdx.x]);
    out[1 + threadIdx.x] = v;
    if (threadIdx.x == 0) out[0] = v;
}

// Two reductions through one TempStorage, with `barriers` __syncthreads before them (the parity
// decides which thread resumes first) and with or without one between them: CUB forbids none.
__global__ void cub_reuse(const float* x, float* out, int barriers, bool barrier_between) {
    __shared__ BlockReduce64::TempStorage temp;
    ::emu::shared_memory(&temp, sizeof temp);
    for (int i = 0; i < barriers; ++i) __syncthreads();
    const float a = BlockReduce64(temp).Sum(x[threadIdx.x]);
    if (barrier_between) __syncthreads();
    const float b = BlockReduce64(temp).Sum(2.0f * x[threadIdx.x]);
    if (threadIdx.x == 0) {
        out[0] = a;
        out[1] = b;
    }
}

struct Gpu {
    cudaStream_t s = nullptr;
    explicit Gpu(int device = 0) {
        REQUIRE(cudaSetDevice(device) == cudaSuccess);
        REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
    }
    ~Gpu() { cudaStreamDestroy(s); }
    float* alloc(size_t n) {
        void* p = nullptr;
        REQUIRE(cudaMalloc(&p, n * sizeof(float)) == cudaSuccess);
        return static_cast<float*>(p);
    }
    // n floats first, first + 1, ... in this GPU's memory
    float* iota(size_t n, float first) {
        std::vector<float> h(n);
        std::iota(h.begin(), h.end(), first);
        float* d = alloc(n);
        REQUIRE(cudaMemcpyAsync(d, h.data(), n * sizeof(float), cudaMemcpyHostToDevice, s) == cudaSuccess);
        return d;
    }
};

std::vector<float> read(const float* d, size_t n, cudaStream_t s) {
    std::vector<float> h(n);
    REQUIRE(cudaMemcpyAsync(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost, s) == cudaSuccess);
    return h;
}

}  // namespace

TEST_CASE("emulated GPU: barriers and shuffles give correct code its result" * doctest::test_suite("emulator")) {
    Gpu g;
    float* dx = g.iota(512, 0.0f);
    float* dout = g.alloc(64);
    EMU_LAUNCH(block_sum, 2, 256, g.s)(dx, dout);
    REQUIRE(cudaGetLastError() == cudaSuccess);
    const std::vector<float> sums = read(dout, 2, g.s);
    CHECK(sums[0] == 255.0f * 256 / 2);
    CHECK(sums[1] == (256.0f + 511.0f) * 256 / 2);
    EMU_LAUNCH(warp_butterfly, 1, 64, g.s)(dout);
    REQUIRE(cudaGetLastError() == cudaSuccess);
    for (float v : read(dout, 64, g.s)) CHECK(v == 31.0f * 32 / 2);
    EMU_LAUNCH(warp_butterfly_2d, 1, dim3(16, 4), g.s)(dout);
    REQUIRE(cudaGetLastError() == cudaSuccess);
    for (float v : read(dout, 64, g.s)) CHECK(v == 31.0f * 32 / 2);
    cudaFree(dx);
    cudaFree(dout);
}

TEST_CASE("emulated GPU: races, divergent barriers and shuffles, and block order fail" *
          doctest::test_suite("emulator")) {
    Gpu g;
    float* d = g.alloc(64);
    EMU_LAUNCH(neighbour_race, 1, 64, g.s)(d);
    REQUIRE(cudaGetLastError() == cudaSuccess);
    const std::vector<float> raced = read(d, 64, g.s);
    int correct = 0;
    for (int i = 0; i + 1 < 64; ++i) correct += raced[size_t(i)] == float(i + 1);
    CHECK(correct < 63);  // threads run in an order where the neighbour has not written yet
    EMU_LAUNCH(divergent_barrier, 1, 64, g.s)(d);
    CHECK(cudaGetLastError() == cudaErrorLaunchFailure);
    EMU_LAUNCH(half_warp_shuffle, 1, 32, g.s)(d);
    CHECK(cudaGetLastError() == cudaErrorLaunchFailure);
    std::vector<float> ones(64, 1.0f);
    REQUIRE(cudaMemcpyAsync(d, ones.data(), 64 * sizeof(float), cudaMemcpyHostToDevice, g.s) == cudaSuccess);
    EMU_LAUNCH(prefix_over_blocks, 64, 32, g.s)(d);
    REQUIRE(cudaGetLastError() == cudaSuccess);
    CHECK(read(d, 64, g.s)[63] < 64.0f);  // blocks in index order would have summed all 64
    EMU_LAUNCH(shared_read_before_write, 1, 64, g.s)(d);
    REQUIRE(cudaGetLastError() == cudaSuccess);
    for (float v : read(d, 64, g.s)) CHECK(std::isnan(v));  // not 1 (a zeroed static), not a last block's value
    EMU_LAUNCH(copy_one, 1, 2048, g.s)(d, d);
    CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
    cudaFree(d);
}

TEST_CASE("emulated GPU: cub::BlockReduce's contract - its block shape, thread 0's result, a barrier before reuse" *
          doctest::test_suite("emulator")) {
    Gpu g;
    float* dx = g.iota(64, 1.0f);
    float* d = g.alloc(65);
    EMU_LAUNCH(cub_block_sum, 1, 64, g.s)(dx, d);
    REQUIRE(cudaGetLastError() == cudaSuccess);
    const std::vector<float> out = read(d, 65, g.s);
    CHECK(out[0] == 64.0f * 65 / 2);
    int garbage = 0;
    for (int t = 1; t < 64; ++t) garbage += std::isnan(out[size_t(1 + t)]);
    CHECK(garbage == 63);          // threads but 0 must not use the result
    for (int barriers : {0, 1}) {  // either thread order after the first reduction's barrier
        CAPTURE(barriers);
        EMU_LAUNCH(cub_reuse, 1, 64, g.s)(dx, d, barriers, true);
        REQUIRE(cudaGetLastError() == cudaSuccess);
        CHECK(read(d, 2, g.s) == std::vector<float>{64.0f * 65 / 2, 64.0f * 65});
        EMU_LAUNCH(cub_reuse, 1, 64, g.s)(dx, d, barriers, false);
        CHECK(cudaGetLastError() == cudaErrorLaunchFailure);
    }
    EMU_LAUNCH(cub_block_sum, 1, 128, g.s)(dx, d);
    CHECK(cudaGetLastError() == cudaErrorLaunchFailure);
    EMU_LAUNCH(cub_block_sum, 1, dim3(32, 2), g.s)(dx, d);
    CHECK(cudaGetLastError() == cudaErrorLaunchFailure);
    cudaFree(dx);
    cudaFree(d);
}

TEST_CASE("emulated GPU: memory a GPU may not use, and streams of another GPU" * doctest::test_suite("emulator")) {
    int gpus = 0;
    REQUIRE(cudaGetDeviceCount(&gpus) == cudaSuccess);
    REQUIRE(gpus >= 2);
    Gpu g1(1);
    float* on1 = g1.alloc(32);
    Gpu g0(0);
    float* on0 = g0.alloc(32);
    float host[32] = {};
    cudaDeviceDisablePeerAccess(1);  // other tests of this process may have enabled it
    cudaGetLastError();
    EMU_LAUNCH(copy_one, 1, 32, g0.s)(host, on0);  // pageable host memory
    CHECK(cudaGetLastError() == cudaErrorIllegalAddress);
    EMU_LAUNCH(copy_one, 1, 32, g0.s)(on1, on0);  // GPU 1's memory without peer access
    CHECK(cudaGetLastError() == cudaErrorIllegalAddress);
    EMU_LAUNCH(copy_one, 1, 32, g1.s)(on0, on0);  // a stream of GPU 1 while GPU 0 is current
    CHECK(cudaGetLastError() == cudaErrorInvalidResourceHandle);
    const cudaError_t enabled = cudaDeviceEnablePeerAccess(1, 0);
    CHECK((enabled == cudaSuccess || enabled == cudaErrorPeerAccessAlreadyEnabled));
    cudaGetLastError();
    EMU_LAUNCH(copy_one, 1, 32, g0.s)(on1, on0);
    CHECK(cudaGetLastError() == cudaSuccess);
    CHECK(cudaMemcpyAsync(on0, host, sizeof host, cudaMemcpyDeviceToHost, g0.s) == cudaErrorInvalidValue);
    CHECK(cudaMemcpyAsync(on0 + 16, host, sizeof host, cudaMemcpyHostToDevice, g0.s) == cudaErrorInvalidValue);
    cudaGetLastError();
    cudaFree(on0);
    cudaSetDevice(1);
    cudaFree(on1);
    cudaSetDevice(0);
}

TEST_CASE("emulated GPU: cuBLAS's argument rules and its column-major product" * doctest::test_suite("emulator")) {
    Gpu g;
    cublasHandle_t h = nullptr;
    REQUIRE(cublasCreate(&h) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(cublasSetStream(h, g.s) == CUBLAS_STATUS_SUCCESS);
    // column-major A [2 x 3], B [3 x 2]: C = A B
    const std::vector<float> a{1, 4, 2, 5, 3, 6}, b{7, 9, 11, 8, 10, 12};
    float *da = g.alloc(6), *db = g.alloc(6), *dc = g.alloc(4);
    REQUIRE(cudaMemcpyAsync(da, a.data(), 24, cudaMemcpyHostToDevice, g.s) == cudaSuccess);
    REQUIRE(cudaMemcpyAsync(db, b.data(), 24, cudaMemcpyHostToDevice, g.s) == cudaSuccess);
    const float one = 1, zero = 0;
    REQUIRE(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 3, &one, da, CUDA_R_32F, 2, db, CUDA_R_32F, 3, &zero, dc,
                         CUDA_R_32F, 2, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS);
    CHECK(read(dc, 4, g.s) == std::vector<float>{58, 139, 64, 154});  // beta 0: C's NaN fill never read
    CHECK(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 3, &one, da, CUDA_R_32F, 1, db, CUDA_R_32F, 3, &zero, dc,
                       CUDA_R_32F, 2, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_INVALID_VALUE);
    CHECK(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 3, &one, da, CUDA_R_32F, 2, db, CUDA_R_16BF, 3, &zero, dc,
                       CUDA_R_32F, 2, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_NOT_SUPPORTED);
    CHECK(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 4, &one, da, CUDA_R_32F, 2, db, CUDA_R_32F, 4, &zero, dc,
                       CUDA_R_32F, 2, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_EXECUTION_FAILED);
    cublasDestroy(h);
    cudaFree(da);
    cudaFree(db);
    cudaFree(dc);
}

TEST_CASE("emulated GPU: stream capture records, replays, and refuses what CUDA refuses" *
          doctest::test_suite("emulator")) {
    Gpu g, side;
    float* d = g.alloc(32);
    std::vector<float> ones(32, 1.0f);
    float* pinned = nullptr;
    REQUIRE(cudaHostAlloc(reinterpret_cast<void**>(&pinned), 32 * sizeof(float), cudaHostAllocPortable) == cudaSuccess);
    std::copy(ones.begin(), ones.end(), pinned);
    cudaEvent_t fork, join, outside;
    REQUIRE(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming) == cudaSuccess);
    REQUIRE(cudaEventCreateWithFlags(&join, cudaEventDisableTiming) == cudaSuccess);
    REQUIRE(cudaEventCreateWithFlags(&outside, cudaEventDisableTiming) == cudaSuccess);
    REQUIRE(cudaEventRecord(outside, side.s) == cudaSuccess);

    // captured: a copy from pinned memory on the origin, a kernel on a joined stream, joined back
    REQUIRE(cudaStreamBeginCapture(g.s, cudaStreamCaptureModeRelaxed) == cudaSuccess);
    REQUIRE(cudaMemcpyAsync(d, pinned, 32 * sizeof(float), cudaMemcpyHostToDevice, g.s) == cudaSuccess);
    REQUIRE(cudaEventRecord(fork, g.s) == cudaSuccess);
    REQUIRE(cudaStreamWaitEvent(side.s, fork, 0) == cudaSuccess);
    EMU_LAUNCH(twice, 1, 32, side.s)(d);
    REQUIRE(cudaEventRecord(join, side.s) == cudaSuccess);
    REQUIRE(cudaStreamWaitEvent(g.s, join, 0) == cudaSuccess);
    CHECK(cudaStreamSynchronize(g.s) == cudaErrorStreamCaptureUnsupported);
    CHECK(cudaEventQuery(join) == cudaErrorCapturedEvent);
    CHECK(cudaStreamWaitEvent(g.s, outside, 0) == cudaErrorStreamCaptureIsolation);
    CHECK(cudaMemcpyAsync(d, ones.data(), 4, cudaMemcpyHostToDevice, g.s) == cudaErrorStreamCaptureUnsupported);
    cudaGetLastError();
    cudaGraph_t graph = nullptr;
    REQUIRE(cudaStreamEndCapture(g.s, &graph) == cudaSuccess);
    CHECK(read(d, 32, g.s)[0] != 1.0f);  // nothing ran yet: still the fresh allocation's NaN
    cudaGraphExec_t exec = nullptr;
    REQUIRE(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);
    REQUIRE(cudaGraphLaunch(exec, g.s) == cudaSuccess);
    for (float v : read(d, 32, g.s)) CHECK(v == 2.0f);
    std::fill(pinned, pinned + 32, 3.0f);  // the copy node reads the pinned buffer at each replay
    REQUIRE(cudaGraphLaunch(exec, g.s) == cudaSuccess);
    for (float v : read(d, 32, g.s)) CHECK(v == 6.0f);

    // a joined stream that never joins back
    REQUIRE(cudaStreamBeginCapture(g.s, cudaStreamCaptureModeRelaxed) == cudaSuccess);
    REQUIRE(cudaEventRecord(fork, g.s) == cudaSuccess);
    REQUIRE(cudaStreamWaitEvent(side.s, fork, 0) == cudaSuccess);
    EMU_LAUNCH(warp_butterfly, 1, 32, side.s)(d);
    cudaGraph_t unjoined = nullptr;
    CHECK(cudaStreamEndCapture(g.s, &unjoined) == cudaErrorStreamCaptureUnjoined);
    cudaGetLastError();
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    for (cudaEvent_t e : {fork, join, outside}) cudaEventDestroy(e);
    cudaFreeHost(pinned);
    cudaFree(d);
}

namespace {

// Asynchronous streams in the lazy newest-first order for one test: nothing runs until a host
// thread waits, then the newest ready item first, so everything issued before a wait is reordered
// as far as the dependencies allow.
struct NewestFirst {
    emu::QueueOrder saved = emu::queue_order();
    NewestFirst() { emu::queue_set_order(emu::QueueOrder::newest, true); }
    ~NewestFirst() {
        emu::queue_set_order(saved, false);
        emu::clear_faults();  // a subcase's
    }
};

float* pinned_floats(size_t n, float value) {
    void* p = nullptr;
    REQUIRE(cudaHostAlloc(&p, n * sizeof(float), cudaHostAllocPortable) == cudaSuccess);
    std::fill_n(static_cast<float*>(p), n, value);
    return static_cast<float*>(p);
}

}  // namespace

TEST_CASE("emulated GPU: asynchronous streams run work out of issue order, so a missing wait or read shows" *
          doctest::test_suite("emulator")) {
    NewestFirst order;
    Gpu g, side;
    float *x = g.alloc(32), *y = g.alloc(32);
    float* in = pinned_floats(32, 1.0f);
    float* out = pinned_floats(32, 0.0f);
    cudaEvent_t written;
    REQUIRE(cudaEventCreateWithFlags(&written, cudaEventDisableTiming) == cudaSuccess);

    SUBCASE("a stream reading what another writes, without an event between them, reads it unwritten") {
        REQUIRE(cudaMemcpyAsync(x, in, 32 * sizeof(float), cudaMemcpyHostToDevice, g.s) == cudaSuccess);
        EMU_LAUNCH(copy_one, 1, 32, side.s)(x, y);
        CHECK(cudaStreamQuery(side.s) == cudaErrorNotReady);  // issued, not run
        cudaGetLastError();
        REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
        for (float v : read(y, 32, side.s)) CHECK(std::isnan(v));  // x's fresh NaN, not 1
    }
    SUBCASE("with the event, it reads what was written") {
        REQUIRE(cudaMemcpyAsync(x, in, 32 * sizeof(float), cudaMemcpyHostToDevice, g.s) == cudaSuccess);
        REQUIRE(cudaEventRecord(written, g.s) == cudaSuccess);
        REQUIRE(cudaStreamWaitEvent(side.s, written, 0) == cudaSuccess);
        EMU_LAUNCH(copy_one, 1, 32, side.s)(x, y);
        REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
        for (float v : read(y, 32, side.s)) CHECK(v == 1.0f);
    }
    SUBCASE("the host sees a copy into pinned memory only after waiting for its stream") {
        REQUIRE(cudaMemcpyAsync(x, in, 32 * sizeof(float), cudaMemcpyHostToDevice, g.s) == cudaSuccess);
        REQUIRE(cudaMemcpyAsync(out, x, 32 * sizeof(float), cudaMemcpyDeviceToHost, g.s) == cudaSuccess);
        CHECK(out[0] == 0.0f);
        REQUIRE(cudaEventRecord(written, g.s) == cudaSuccess);
        CHECK(cudaEventQuery(written) == cudaErrorNotReady);
        cudaGetLastError();
        REQUIRE(cudaEventSynchronize(written) == cudaSuccess);
        CHECK(out[0] == 1.0f);
        CHECK(out[31] == 1.0f);
    }
    SUBCASE("a graph's replay follows its edges, not the order of capture") {
        // y = x and x *= 2 on two joined streams with no edge between them: captured in the order
        // twice, copy; replayed newest first, the copy reads x before it is doubled
        REQUIRE(cudaMemcpyAsync(x, in, 32 * sizeof(float), cudaMemcpyHostToDevice, g.s) == cudaSuccess);
        REQUIRE(cudaStreamSynchronize(g.s) == cudaSuccess);
        cudaEvent_t fork, join;
        REQUIRE(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming) == cudaSuccess);
        REQUIRE(cudaEventCreateWithFlags(&join, cudaEventDisableTiming) == cudaSuccess);
        REQUIRE(cudaStreamBeginCapture(g.s, cudaStreamCaptureModeRelaxed) == cudaSuccess);
        REQUIRE(cudaEventRecord(fork, g.s) == cudaSuccess);
        REQUIRE(cudaStreamWaitEvent(side.s, fork, 0) == cudaSuccess);
        EMU_LAUNCH(twice, 1, 32, side.s)(x);
        EMU_LAUNCH(copy_one, 1, 32, g.s)(x, y);
        REQUIRE(cudaEventRecord(join, side.s) == cudaSuccess);
        REQUIRE(cudaStreamWaitEvent(g.s, join, 0) == cudaSuccess);
        cudaGraph_t graph = nullptr;
        REQUIRE(cudaStreamEndCapture(g.s, &graph) == cudaSuccess);
        cudaGraphExec_t exec = nullptr;
        REQUIRE(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);
        REQUIRE(cudaGraphLaunch(exec, g.s) == cudaSuccess);
        CHECK(read(y, 32, g.s)[0] == 1.0f);
        CHECK(read(x, 32, g.s)[0] == 2.0f);
        cudaGraphExecDestroy(exec);
        cudaGraphDestroy(graph);
        cudaEventDestroy(fork);
        cudaEventDestroy(join);
    }
    SUBCASE("a fault found when the kernel runs is reported by the next wait, and stays") {
        EMU_LAUNCH(divergent_barrier, 1, 64, g.s)(x);
        CHECK(cudaGetLastError() == cudaSuccess);  // the launch itself was valid
        CHECK(cudaStreamSynchronize(g.s) == cudaErrorLaunchFailure);
        CHECK(cudaStreamQuery(side.s) == cudaErrorLaunchFailure);
        CHECK(cudaGetLastError() == cudaErrorLaunchFailure);
        CHECK(cudaGetLastError() == cudaErrorLaunchFailure);
    }
    cudaEventDestroy(written);
    cudaFreeHost(in);
    cudaFreeHost(out);
    cudaFree(x);
    cudaFree(y);
}

#if MIRRORED_NCCL
#include <nccl.h>

TEST_CASE(
    "emulated NCCL: grouped all-reduce, reduce and broadcast over two GPUs, captured too; refuses what would hang "
    "or misuse memory" *
    doctest::test_suite("emulator")) {
    int gpus = 0;
    REQUIRE(cudaGetDeviceCount(&gpus) == cudaSuccess);
    REQUIRE(gpus >= 2);
    const int devs[2] = {0, 1};
    ncclComm_t comms[2] = {};
    const int twice_0[2] = {0, 0};
    CHECK(ncclCommInitAll(comms, 2, twice_0) == ncclInvalidUsage);  // NCCL: "Duplicate GPU detected"
    REQUIRE(ncclCommInitAll(comms, 2, devs) == ncclSuccess);
    Gpu g0(0), g1(1);
    cudaSetDevice(0);
    float* x0 = g0.alloc(8);
    cudaSetDevice(1);
    float* x1 = g1.alloc(8);
    const std::vector<float> a{1, 2, 3, 4, 5, 6, 7, 8}, b{10, 20, 30, 40, 50, 60, 70, 80};
    auto load = [&] {
        cudaSetDevice(0);
        REQUIRE(cudaMemcpyAsync(x0, a.data(), 32, cudaMemcpyHostToDevice, g0.s) == cudaSuccess);
        cudaSetDevice(1);
        REQUIRE(cudaMemcpyAsync(x1, b.data(), 32, cudaMemcpyHostToDevice, g1.s) == cudaSuccess);
    };
    auto both = [&](size_t count0, size_t count1) {
        ncclGroupStart();
        ncclAllReduce(x0, x0, count0, ncclFloat, ncclSum, comms[0], g0.s);
        ncclAllReduce(x1, x1, count1, ncclFloat, ncclSum, comms[1], g1.s);
        return ncclGroupEnd();
    };
    load();
    REQUIRE(both(8, 8) == ncclSuccess);
    cudaSetDevice(0);
    const std::vector<float> s0 = read(x0, 8, g0.s);
    cudaSetDevice(1);
    CHECK(read(x1, 8, g1.s) == s0);
    CHECK(s0 == std::vector<float>{11, 22, 33, 44, 55, 66, 77, 88});

    CHECK(both(8, 7) == ncclInvalidUsage);  // the ranks disagree on the count
    ncclGroupStart();                       // one rank of two issued: NCCL would wait for the other forever
    ncclAllReduce(x0, x0, 8, ncclFloat, ncclSum, comms[0], g0.s);
    CHECK(ncclGroupEnd() == ncclInvalidUsage);
    CHECK(ncclAllReduce(x0, x0, 8, ncclFloat, ncclSum, comms[0], g0.s) == ncclInvalidUsage);         // no group
    CHECK(ncclAllReduce(x1, x1, 8, ncclFloat, ncclSum, comms[0], g0.s) == ncclInvalidArgument);      // GPU 1's buffer
    CHECK(ncclAllReduce(x0, x0, 8, ncclFloat, ncclSum, comms[0], g1.s) == ncclInvalidArgument);      // GPU 1's stream
    CHECK(ncclAllReduce(x0, x0, 9, ncclFloat, ncclSum, comms[0], g0.s) == ncclInvalidArgument);      // past the buffer
    CHECK(ncclAllReduce(x0, x0 + 1, 4, ncclFloat, ncclSum, comms[0], g0.s) == ncclInvalidArgument);  // overlapping

    // ncclReduce to a root (only the root's receive buffer written), ncclBroadcast from a root
    load();
    ncclGroupStart();
    ncclReduce(x0, x0, 4, ncclFloat, ncclSum, 1, comms[0], g0.s);
    ncclReduce(x1, x1, 4, ncclFloat, ncclSum, 1, comms[1], g1.s);
    ncclBroadcast(x0 + 4, x0 + 4, 4, ncclFloat, 0, comms[0], g0.s);
    ncclBroadcast(x1 + 4, x1 + 4, 4, ncclFloat, 0, comms[1], g1.s);
    REQUIRE(ncclGroupEnd() == ncclSuccess);
    cudaSetDevice(0);
    CHECK(read(x0, 8, g0.s) == a);  // not rank 0's chunk to receive; it broadcast its second half
    cudaSetDevice(1);
    CHECK(read(x1, 8, g1.s) == std::vector<float>{11, 22, 33, 44, 5, 6, 7, 8});
    ncclGroupStart();  // the ranks name different roots: NCCL would hang
    ncclReduce(x0, x0, 4, ncclFloat, ncclSum, 0, comms[0], g0.s);
    ncclReduce(x1, x1, 4, ncclFloat, ncclSum, 1, comms[1], g1.s);
    CHECK(ncclGroupEnd() == ncclInvalidUsage);
    CHECK(ncclBroadcast(x0, x0, 4, ncclFloat, 2, comms[0], g0.s) == ncclInvalidArgument);  // no rank 2
    ncclGroupStart();  // a reduce on one rank, a broadcast on the other
    ncclReduce(x0, x0, 4, ncclFloat, ncclSum, 0, comms[0], g0.s);
    ncclBroadcast(x1, x1, 4, ncclFloat, 0, comms[1], g1.s);
    CHECK(ncclGroupEnd() == ncclInvalidUsage);

    // captured: GPU 1's stream joins GPU 0's capture; the all-reduce becomes a node of the graph
    cudaEvent_t fork, join;
    cudaSetDevice(0);
    REQUIRE(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming) == cudaSuccess);
    cudaSetDevice(1);
    REQUIRE(cudaEventCreateWithFlags(&join, cudaEventDisableTiming) == cudaSuccess);
    load();
    cudaSetDevice(0);
    REQUIRE(cudaStreamBeginCapture(g0.s, cudaStreamCaptureModeRelaxed) == cudaSuccess);
    CHECK(both(8, 8) == ncclInvalidUsage);  // GPU 1's stream is not in the capture
    REQUIRE(cudaEventRecord(fork, g0.s) == cudaSuccess);
    REQUIRE(cudaStreamWaitEvent(g1.s, fork, 0) == cudaSuccess);
    REQUIRE(both(8, 8) == ncclSuccess);
    cudaSetDevice(1);
    REQUIRE(cudaEventRecord(join, g1.s) == cudaSuccess);
    REQUIRE(cudaStreamWaitEvent(g0.s, join, 0) == cudaSuccess);
    cudaSetDevice(0);
    cudaGraph_t graph = nullptr;
    REQUIRE(cudaStreamEndCapture(g0.s, &graph) == cudaSuccess);
    CHECK(read(x0, 8, g0.s) == a);  // captured, not run
    cudaGraphExec_t exec = nullptr;
    REQUIRE(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);
    REQUIRE(cudaGraphLaunch(exec, g0.s) == cudaSuccess);
    REQUIRE(cudaGraphLaunch(exec, g0.s) == cudaSuccess);  // twice: 2 (a + b)
    const std::vector<float> r0 = read(x0, 8, g0.s);
    CHECK(r0 == std::vector<float>{22, 44, 66, 88, 110, 132, 154, 176});
    cudaSetDevice(1);
    CHECK(read(x1, 8, g1.s) == r0);
    cudaGetLastError();

    for (ncclComm_t c : comms) CHECK(ncclCommFinalize(c) == ncclSuccess);
    CHECK(ncclAllReduce(x0, x0, 8, ncclFloat, ncclSum, comms[0], g0.s) == ncclInvalidUsage);  // finalized
    for (ncclComm_t c : comms) CHECK(ncclCommDestroy(c) == ncclSuccess);
    CHECK(ncclCommDestroy(comms[0]) == ncclInvalidArgument);  // gone
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaEventDestroy(fork);
    cudaEventDestroy(join);
    cudaSetDevice(1);
    cudaFree(x1);
    cudaSetDevice(0);
    cudaFree(x0);
}
#endif
