// Force-included (g++ -include) when the CUDA backend's .cu files are compiled as C++ for the
// emulated GPU (tests/cuda_emu/README.md): what nvcc gives device code - thread and block
// indices, __shared__, __syncthreads, warp shuffles, atomics, bit casts - for kernels run on CPU
// fibers, one per GPU thread. Kernel launches are rewritten by tests/cuda_emu/rewrite.pl from
// `k<<<grid, block, shmem, stream>>>(args)` into `(emu::Launch(grid, block, shmem, stream) %
// [](auto... a) { k(a...); })(args)`.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <tuple>
#include <type_traits>

// Device code is plain C++ here. __shared__ arrays are function statics: the blocks of a launch
// run one after another (under one lock), so a static is exactly one block's shared memory.
// rewrite.pl follows each __shared__ declaration with a call of emu::shared_memory, which fills
// the array with NaN bytes the first time a thread of a block reaches it, as a GPU's shared
// memory holds garbage: a read of shared memory no thread of the block wrote shows.
#undef __global__
#undef __device__
#undef __host__
#undef __shared__
#undef __forceinline__
#undef __launch_bounds__
#define __global__
#define __device__
#define __host__
#define __shared__ static
#define __forceinline__ inline
#define __launch_bounds__(...)

namespace emu {

// The running GPU thread's coordinates and lane (its linear id in the block mod 32); threadIdx
// is read often: inline, set at each switch.
extern uint3 g_thread_idx;
extern int g_lane;
inline uint3 thread_idx() { return g_thread_idx; }
uint3 block_idx();
dim3 block_dim();
dim3 grid_dim();

void syncthreads();
// Fails the running launch (cudaErrorLaunchFailure) with `why`: a library's rule broken by a
// kernel (the emulated cub::BlockReduce's).
void kernel_fail(const char* why);
// How many __syncthreads the running block has completed: a library's check that a barrier came
// between two uses of its shared storage.
uint64_t barrier_generation();
// A __shared__ array of the running kernel (its address and size): NaN bytes at the block's
// first call, nothing at later ones.
void shared_memory(void* array, size_t bytes);
// Every lane of the calling warp named in `mask` hands in `bytes` of `value` and receives those
// of lane `src_lane` (its own where src_lane is outside the warp): the exchange under all shuffles.
void warp_exchange(unsigned mask, const void* value, void* out, size_t bytes, int src_lane);

template <class T>
T shfl_xor(unsigned mask, T v, int lane_mask) {
    T out;
    warp_exchange(mask, &v, &out, sizeof v, g_lane ^ lane_mask);
    return out;
}
template <class T>
T shfl_down(unsigned mask, T v, unsigned delta) {
    T out;
    const int src = g_lane + int(delta);
    warp_exchange(mask, &v, &out, sizeof v, src < 32 ? src : -1);
    return out;
}

// The fibers of a launch run one at a time, so a read-modify-write is atomic.
template <class T>
T atomic_add(T* p, T v) {
    const T old = *p;
    *p = old + v;
    return old;
}

// Checked as a launch's arguments: a pointer must be null or point into memory this GPU may load
// (its own allocations, a peer's with access enabled, pinned host memory); else the launch fails.
bool kernel_pointer_ok(const void* p, int arg);

struct LaunchConfig {
    dim3 grid, block;
    size_t shared_bytes = 0;
    cudaStream_t stream = nullptr;
};

// Runs body(thread) for every thread of every block, each on its own fiber; false (and the
// launch's error recorded for cudaGetLastError) when the configuration or an argument is wrong.
bool begin_launch(const LaunchConfig& c);
void run_launch(const LaunchConfig& c, void (*thread_body)(void*), void* arg);

// Work issued to stream s: run now, or recorded into the graph s is capturing.
void submit(cudaStream_t s, std::function<void()> work);

template <class K, class... A>
void launch(const LaunchConfig& c, K kernel, A... args) {
    if (!begin_launch(c)) return;
    int index = 0;
    bool ok = true;
    auto check = [&](const auto& a) {
        using T = std::decay_t<decltype(a)>;
        if constexpr (std::is_pointer_v<T>) ok = ok && kernel_pointer_ok(static_cast<const void*>(a), index);
        ++index;
    };
    (check(args), ...);
    if (!ok) return;
    // The arguments are copied at launch, as a captured kernel node's parameters are.
    submit(c.stream, [c, bound = std::tuple<K, A...>(kernel, args...)]() mutable {
        run_launch(
            c,
            [](void* p) {
                auto& b = *static_cast<std::tuple<K, A...>*>(p);
                std::apply([](K k, A... a) { k(a...); }, b);
            },
            &bound);
    });
}

struct Launch {
    LaunchConfig config;
    Launch(dim3 grid, dim3 block, size_t shared_bytes = 0, cudaStream_t stream = nullptr)
        : config{grid, block, shared_bytes, stream} {}
    template <class K>
    struct Bound {
        LaunchConfig config;
        K kernel;
        template <class... A>
        void operator()(A... args) const {
            launch(config, kernel, args...);
        }
    };
    template <class K>
    Bound<K> operator%(K kernel) const {
        return {config, kernel};
    }
};

}  // namespace emu

#define threadIdx (::emu::thread_idx())
#define blockIdx (::emu::block_idx())
#define blockDim (::emu::block_dim())
#define gridDim (::emu::grid_dim())
#define __syncthreads() ::emu::syncthreads()
#define __shfl_xor_sync(mask, v, lane_mask) ::emu::shfl_xor((mask), (v), (lane_mask))
#define __shfl_down_sync(mask, v, delta) ::emu::shfl_down((mask), (v), (delta))
#define atomicAdd(p, v) ::emu::atomic_add((p), (v))

inline unsigned __float_as_uint(float x) {
    unsigned u;
    std::memcpy(&u, &x, sizeof u);
    return u;
}
inline float __uint_as_float(unsigned u) {
    float x;
    std::memcpy(&x, &u, sizeof x);
    return x;
}

// Device code's min and max of any two arithmetic types (CUDA's overloads).
template <class A, class B>
inline std::common_type_t<A, B> min(A a, B b) {
    return a < b ? a : b;
}
template <class A, class B>
inline std::common_type_t<A, B> max(A a, B b) {
    return a < b ? b : a;
}
