// The emulated GPU's runtime: the CUDA runtime, cuBLAS and cuBLASLt calls the CUDA backend makes,
// implemented on the CPU with the libraries' documented semantics and argument rules, so that the
// backend's own source (kernels/cuda/*.cu, compiled as C++) runs in the test suite without a GPU.
//
// Streams are eager by default: work runs when it is issued, on the issuing thread - a stream that
// finishes everything at once is a legal CUDA stream, and with it every event is complete once
// recorded. With MIRRORED_CUDA_EMU_ASYNC (queue.cpp) they are asynchronous: work waits in a queue
// for the stream's earlier work and the events the stream waited on, and an executor thread runs
// it later, out of issue order where the dependencies allow; queries answer cudaErrorNotReady
// until it has run, waits wait for it, cudaFree and work on the legacy default stream wait for
// everything, a copy with pageable host memory is done when it returns. A fault found when a
// kernel runs (or injected, MIRRORED_CUDA_EMU_FAULT) is sticky for its GPU, as on a GPU: every
// later call on it returns the error. What is checked, because a real GPU would fail or misbehave
// there:
// - memory: device allocations are host memory filled with NaN bytes; copies, memsets, cuBLAS
//   operands and every pointer argument of a kernel launch must lie in memory the current GPU
//   may use (its own, a peer's after cudaDeviceEnablePeerAccess, pinned host memory); a copy's
//   direction must match its kind; a free must be of an allocation's start;
// - devices: a launch, copy or GEMM goes to a stream of the current device; an event is recorded
//   on a stream of its own device; a cuBLAS handle is used on its own device;
// - libraries: cuBLAS's leading-dimension rules, its supported type combinations (A and B of one
//   type; C f32 or that type) and beta == 0 not reading C; cuBLASLt's layouts against the
//   operation, its epilogues (DEFAULT, RELU, BIAS, RELU_BIAS, BGRADB) as documented.
// - stream capture: work issued to a capturing stream, or to a stream that joined the capture by
//   waiting on an event recorded in it, becomes a node of the graph (kernel arguments and GEMM
//   scalars copied then) with the stream's dependencies, and a replay runs the nodes in issue
//   order on eager streams, in any order the graph's edges allow on asynchronous ones (an edge the
//   capture missed shows there). As the CUDA Programming
//   Guide prohibits: synchronising or querying a capturing stream or a captured event, waiting in
//   a capture on an event recorded outside it (without cudaEventWaitExternal), merging two
//   captures, a copy from or to pageable host memory, and ending a capture some stream that
//   joined it has not joined back.
// NCCL is emulated in nccl.cpp on top of submit_collective and device_memory_of.
// Not emulated: timing, and work running concurrently (asynchronous streams run one item at a
// time, reordered: a race between streams shows as a wrong order, not as interleaved writes).
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "tests/cuda_emu/emu_state.h"
#include "tests/cuda_emu/kernel_emu.h"

namespace emu {
struct Node {
    int device;
    std::function<void()> work;
};
struct Capture {  // a stream capture in progress, or ended
    cudaStream_t origin = nullptr;
    bool ended = false;
    std::vector<Node> nodes;
    std::vector<std::vector<int>> deps;  // per node: the nodes it waits for
    std::vector<cudaStream_t> joined;    // streams that joined, the origin excluded
};
}  // namespace emu

struct CUstream_st {
    int device = 0;
    emu::Capture* capture = nullptr;  // the capture this stream's work goes into
    std::vector<int> frontier;        // the capture's nodes the stream's next work depends on
    std::vector<uint64_t> queued;     // asynchronous streams: the queue's items its next work follows
};
struct CUevent_st {
    int device = 0;
    bool timing = true;
    bool recorded = false;
    double ms = 0;
    emu::Capture* capture = nullptr;  // last recorded in this capture
    std::vector<int> frontier;
    std::vector<uint64_t> queued;          // asynchronous streams: the items the last record stands for
    std::shared_ptr<double> completed_ms;  // asynchronous streams: when it completed (a timing event)
};
struct CUgraph_st {
    emu::Capture* capture;
};
struct CUgraphExec_st {
    std::vector<emu::Node> nodes;
    std::vector<std::vector<int>> deps;  // per node: the nodes it waits for
};
struct cublasContext {
    int device = 0;
    cudaStream_t stream = nullptr;
};
struct cublasLtContext {
    int device = 0;
};

namespace emu {

namespace {

constexpr int kMaxGpus = 8;
constexpr size_t kMemoryPerGpu = size_t(16) << 30;

struct Alloc {
    size_t bytes = 0;
    int device = -1;  // -1: pinned host memory
};

std::mutex g_mutex;
std::map<uintptr_t, Alloc> g_allocs;  // by start address
size_t g_used[kMaxGpus] = {};
bool g_peer_enabled[kMaxGpus][kMaxGpus] = {};
thread_local int t_device = 0;
thread_local cudaError_t t_last_error = cudaSuccess;

int gpu_count() {
    static const int n = [] {
        const char* v = std::getenv("MIRRORED_CUDA_EMU_GPUS");
        const int k = v ? std::atoi(v) : 2;
        return std::clamp(k, 0, kMaxGpus);
    }();
    return n;
}
// MIRRORED_CUDA_EMU_PEER_CORRUPT=1: copies between GPUs with peer access enabled flip a bit, as a
// board whose IOMMU or PCIe ACS breaks peer traffic would (the start-up self-test must catch it).
bool peer_corrupts() {
    const char* v = std::getenv("MIRRORED_CUDA_EMU_PEER_CORRUPT");
    return v && std::string(v) == "1";
}
bool peer_possible() {
    const char* v = std::getenv("MIRRORED_CUDA_EMU_NO_PEER");
    return !(v && std::string(v) == "1");
}

cudaError_t result(cudaError_t e) {
    if (e != cudaSuccess) t_last_error = e;
    return e;
}

cudaError_t fail(cudaError_t e, const std::string& why) {
    std::fprintf(stderr, "emulated GPU %d: %s\n", t_device, why.c_str());
    return result(e);
}

bool asynchronous() { return queue_order() != QueueOrder::eager; }

std::atomic<int> g_fault[kMaxGpus] = {};  // cudaError_t per GPU: sticky
std::atomic<uint64_t> g_kernels_run[kMaxGpus] = {};

// What a call that waits or queries returns once its work is done: the GPU's fault, if any.
cudaError_t after_wait(int device = t_device) { return result(fault_of(device)); }

// The allocation holding [p, p + bytes), or null. Caller holds g_mutex.
const Alloc* find(const void* p, size_t bytes) {
    const auto v = reinterpret_cast<uintptr_t>(p);
    auto it = g_allocs.upper_bound(v);
    if (it == g_allocs.begin()) return nullptr;
    --it;
    if (v - it->first + bytes > it->second.bytes) return nullptr;
    return &it->second;
}

// Why [p, p + bytes) lies in no allocation: it starts in one and runs past its end, or starts in
// none. Caller holds g_mutex.
std::string outside_allocations(const void* p, size_t bytes, const char* what) {
    char buf[160];
    std::snprintf(buf, sizeof buf,
                  find(p, 1) ? "%s %p (%zu bytes) reaches past the end of its allocation"
                             : "%s %p (%zu bytes) is not inside any allocation of the emulated GPUs",
                  what, p, bytes);
    return buf;
}

// Whether the current device may read or write [p, p + bytes) (device memory, or pinned host).
std::string usable(const void* p, size_t bytes, bool device_only, const char* what) {
    std::lock_guard<std::mutex> lock(g_mutex);
    const Alloc* a = find(p, bytes);
    char buf[160];
    if (!a) return outside_allocations(p, bytes, what);
    if (a->device < 0) {
        if (!device_only) return {};
        std::snprintf(buf, sizeof buf, "%s %p is pinned host memory where device memory is needed", what, p);
        return buf;
    }
    if (a->device != t_device && !g_peer_enabled[t_device][a->device]) {
        std::snprintf(buf, sizeof buf, "%s %p is memory of GPU %d, used from GPU %d without peer access", what, p,
                      a->device, t_device);
        return buf;
    }
    return {};
}

bool is_device_memory(const void* p) {
    std::lock_guard<std::mutex> lock(g_mutex);
    const Alloc* a = find(p, 1);
    return a && a->device >= 0;
}

int stream_device(cudaStream_t s) { return s ? s->device : t_device; }

// Work must go to a stream of the current device (the legacy default stream is the current one's).
cudaError_t stream_on_current(cudaStream_t s, const char* call) {
    if (stream_device(s) != t_device)
        return fail(cudaErrorInvalidResourceHandle,
                    std::string(call) + " on a stream of GPU " + std::to_string(stream_device(s)));
    return result(fault_of(t_device));  // a failed GPU takes no more work
}

double now_ms() {
    using namespace std::chrono;
    return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}

}  // namespace

void record_launch_error(cudaError_t e, const std::string& why) {
    fail(e, "kernel launch: " + why);
    if (on_queue_executor()) set_fault(t_device, e);  // found when the queue ran the kernel: sticky
}

void set_fault(int device, cudaError_t e) {
    int healthy = cudaSuccess;
    g_fault[device].compare_exchange_strong(healthy, int(e));
}
cudaError_t fault_of(int device) { return cudaError_t(g_fault[device].load()); }
void clear_faults() {
    for (auto& f : g_fault) f = cudaSuccess;
}

bool kernel_faults() {
    static const auto injected = [] {  // MIRRORED_CUDA_EMU_FAULT=G:K
        std::pair<int, unsigned long long> at{-1, 0};
        if (const char* v = std::getenv("MIRRORED_CUDA_EMU_FAULT"))
            if (std::sscanf(v, "%d:%llu", &at.first, &at.second) != 2 || at.first < 0 || at.first >= kMaxGpus) {
                std::fprintf(stderr, "emulated GPU: MIRRORED_CUDA_EMU_FAULT=%s is not GPU:KERNEL\n", v);
                std::exit(2);
            }
        return at;
    }();
    const int d = t_device;
    if (fault_of(d) != cudaSuccess) return true;
    const uint64_t k = ++g_kernels_run[d];
    if (d != injected.first || k != injected.second) return false;
    std::fprintf(stderr, "emulated GPU %d: kernel %llu meets an illegal address (MIRRORED_CUDA_EMU_FAULT)\n", d,
                 static_cast<unsigned long long>(k));
    set_fault(d, cudaErrorIllegalAddress);
    return true;
}

void set_current_device(int device) { t_device = device; }

bool check_launch_stream(cudaStream_t s) { return stream_on_current(s, "a kernel launch") == cudaSuccess; }

std::mutex g_capture_mutex;

void submit(cudaStream_t s, std::function<void()> work) {
    {
        std::lock_guard<std::mutex> lock(g_capture_mutex);
        if (s && s->capture) {
            Capture& c = *s->capture;
            c.nodes.push_back({s->device, std::move(work)});
            c.deps.push_back(s->frontier);
            s->frontier = {int(c.nodes.size()) - 1};
            return;
        }
        if (s && asynchronous()) {
            s->queued = {queue_issue(s->device, std::move(work), s->queued)};
            return;
        }
    }
    if (asynchronous()) queue_wait_all();  // the legacy default stream follows all earlier work
    work();
}

namespace {
bool capturing(cudaStream_t s) {
    std::lock_guard<std::mutex> lock(g_capture_mutex);
    return s && s->capture;
}
}  // namespace

std::string submit_collective(const std::vector<cudaStream_t>& streams, std::function<void()> work) {
    {
        std::lock_guard<std::mutex> lock(g_capture_mutex);
        Capture* c = streams.empty() || !streams[0] ? nullptr : streams[0]->capture;
        for (cudaStream_t s : streams)
            if ((s ? s->capture : nullptr) != c)
                return "the ranks' streams of one collective are not all captured by the same graph";
        if (c) {  // one node after every rank's work so far; every rank's next work after it
            std::vector<int> deps;
            for (cudaStream_t s : streams)
                for (int n : s->frontier)
                    if (std::find(deps.begin(), deps.end(), n) == deps.end()) deps.push_back(n);
            c->nodes.push_back({streams[0]->device, std::move(work)});
            c->deps.push_back(deps);
            for (cudaStream_t s : streams) s->frontier = {int(c->nodes.size()) - 1};
            return {};
        }
        if (asynchronous()) {  // likewise one queued item after every rank's work
            std::vector<uint64_t> deps;
            for (cudaStream_t s : streams) queue_join(deps, s->queued);
            const uint64_t id = queue_issue(stream_device(streams[0]), std::move(work), deps);
            for (cudaStream_t s : streams) s->queued = {id};
            return {};
        }
    }
    work();
    return {};
}

std::string device_memory_of(const void* p, size_t bytes, int device, const char* what) {
    std::lock_guard<std::mutex> lock(g_mutex);
    const Alloc* a = find(p, std::max<size_t>(bytes, 1));
    if (a && a->device == device) return {};
    if (!a) return outside_allocations(p, bytes, what);
    char buf[200];
    std::snprintf(buf, sizeof buf, "%s %p is %s, not memory of the communicator's GPU %d", what, p,
                  a->device < 0 ? "pinned host memory" : ("memory of GPU " + std::to_string(a->device)).c_str(),
                  device);
    return buf;
}

int stream_gpu(cudaStream_t s) { return stream_device(s); }
int gpus() { return gpu_count(); }

bool kernel_pointer_ok(const void* p, int arg) {
    if (!p) return true;
    const std::string why = usable(p, 1, false, ("argument " + std::to_string(arg)).c_str());
    if (why.empty()) return true;
    record_launch_error(cudaErrorIllegalAddress, why);
    return false;
}

}  // namespace emu

using emu::fail;
using emu::result;
using emu::stream_on_current;

// ---- devices ------------------------------------------------------------------------------

cudaError_t cudaGetDeviceCount(int* count) {
    *count = emu::gpu_count();
    return result(*count > 0 ? cudaSuccess : cudaErrorNoDevice);
}
cudaError_t cudaSetDevice(int device) {
    if (device < 0 || device >= emu::gpu_count()) return result(cudaErrorInvalidDevice);
    emu::t_device = device;
    return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
    if (device < 0 || device >= emu::gpu_count()) return result(cudaErrorInvalidDevice);
    *prop = cudaDeviceProp{};
    std::snprintf(prop->name, sizeof prop->name, "emulated GPU (CPU fibers)");
    prop->totalGlobalMem = emu::kMemoryPerGpu;
    prop->major = 9;
    prop->minor = 0;
    prop->multiProcessorCount = 132;
    prop->warpSize = 32;
    prop->maxThreadsPerBlock = 1024;
    prop->unifiedAddressing = 1;
    return cudaSuccess;
}
cudaError_t cudaDriverGetVersion(int* v) {
    *v = CUDART_VERSION;
    return cudaSuccess;
}
cudaError_t cudaRuntimeGetVersion(int* v) {
    *v = CUDART_VERSION;
    return cudaSuccess;
}
cudaError_t cudaDeviceGetPCIBusId(char* bus, int len, int device) {
    if (device < 0 || device >= emu::gpu_count()) return result(cudaErrorInvalidDevice);
    std::snprintf(bus, size_t(len), "0000:%02x:00.0", 0x10 + device);
    return cudaSuccess;
}
cudaError_t cudaDeviceCanAccessPeer(int* can, int device, int peer) {
    if (device < 0 || device >= emu::gpu_count() || peer < 0 || peer >= emu::gpu_count())
        return result(cudaErrorInvalidDevice);
    *can = device != peer && emu::peer_possible();
    return cudaSuccess;
}
cudaError_t cudaDeviceEnablePeerAccess(int peer, unsigned int) {
    if (peer < 0 || peer >= emu::gpu_count() || peer == emu::t_device || !emu::peer_possible())
        return result(cudaErrorInvalidDevice);
    std::lock_guard<std::mutex> lock(emu::g_mutex);
    if (emu::g_peer_enabled[emu::t_device][peer]) return result(cudaErrorPeerAccessAlreadyEnabled);
    emu::g_peer_enabled[emu::t_device][peer] = true;
    return cudaSuccess;
}
cudaError_t cudaDeviceDisablePeerAccess(int peer) {
    if (peer < 0 || peer >= emu::gpu_count()) return result(cudaErrorInvalidDevice);
    std::lock_guard<std::mutex> lock(emu::g_mutex);
    if (!emu::g_peer_enabled[emu::t_device][peer]) return result(cudaErrorPeerAccessNotEnabled);
    emu::g_peer_enabled[emu::t_device][peer] = false;
    return cudaSuccess;
}
cudaError_t cudaDeviceGetP2PAttribute(int* value, cudaDeviceP2PAttr, int, int) {
    *value = 0;
    return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize() {
    if (emu::asynchronous()) emu::queue_wait_all();  // every GPU's work, not just the current one's: legal, simpler
    return emu::after_wait();
}

cudaError_t cudaGetLastError() {
    const cudaError_t e = emu::t_last_error;
    emu::t_last_error = cudaSuccess;
    if (e == cudaSuccess) return emu::fault_of(emu::t_device);  // sticky: not cleared
    return e;
}
const char* cudaGetErrorString(cudaError_t e) {
    switch (e) {
        case cudaSuccess:
            return "no error";
        case cudaErrorInvalidValue:
            return "invalid argument";
        case cudaErrorMemoryAllocation:
            return "out of memory";
        case cudaErrorInvalidConfiguration:
            return "invalid configuration argument";
        case cudaErrorInvalidDevice:
            return "invalid device ordinal";
        case cudaErrorInvalidResourceHandle:
            return "invalid resource handle";
        case cudaErrorIllegalAddress:
            return "an illegal memory access was encountered";
        case cudaErrorLaunchFailure:
            return "unspecified launch failure";
        case cudaErrorNotReady:
            return "device not ready";
        case cudaErrorPeerAccessAlreadyEnabled:
            return "peer access is already enabled";
        case cudaErrorStreamCaptureUnsupported:
            return "operation not permitted when stream is capturing";
        case cudaErrorNoDevice:
            return "no CUDA-capable device is detected";
        case cudaErrorIllegalState:
            return "the operation cannot be performed in the present state";
        case cudaErrorStreamCaptureUnjoined:
            return "capture was not joined";
        case cudaErrorStreamCaptureIsolation:
            return "dependency created on uncaptured work in another stream";
        case cudaErrorCapturedEvent:
            return "operation not permitted on an event last recorded in a capturing stream";
        default:
            return "emulated GPU error";
    }
}

// ---- memory -------------------------------------------------------------------------------

namespace {

cudaError_t allocate(void** p, size_t bytes, int device) {
    if (device >= 0 && emu::g_used[device] + bytes > emu::kMemoryPerGpu) return result(cudaErrorMemoryAllocation);
    void* m = nullptr;  // cudaMalloc's 256-byte alignment, and not a byte more (AddressSanitizer sees overruns)
    if (::posix_memalign(&m, 256, std::max<size_t>(bytes, 1)) != 0) return result(cudaErrorMemoryAllocation);
    std::memset(m, 0xff, bytes);  // NaN in f32, bf16 and f16: a read of unwritten memory shows
    std::lock_guard<std::mutex> lock(emu::g_mutex);
    emu::g_allocs[reinterpret_cast<uintptr_t>(m)] = {bytes, device};
    if (device >= 0) emu::g_used[device] += bytes;
    *p = m;
    return cudaSuccess;
}

cudaError_t release(void* p, bool pinned) {
    if (!p) return cudaSuccess;
    if (emu::asynchronous()) emu::queue_wait_all();  // cudaFree synchronises: no queued work may use p
    std::lock_guard<std::mutex> lock(emu::g_mutex);
    auto it = emu::g_allocs.find(reinterpret_cast<uintptr_t>(p));
    if (it == emu::g_allocs.end() || (it->second.device < 0) != pinned)
        return fail(cudaErrorInvalidValue, pinned ? "cudaFreeHost of a pointer cudaHostAlloc did not return"
                                                  : "cudaFree of a pointer cudaMalloc did not return");
    if (it->second.device >= 0) emu::g_used[it->second.device] -= it->second.bytes;
    emu::g_allocs.erase(it);
    std::free(p);
    return cudaSuccess;
}

cudaError_t checked(const std::string& why) { return why.empty() ? cudaSuccess : fail(cudaErrorInvalidValue, why); }

}  // namespace

cudaError_t cudaMalloc(void** p, size_t bytes) { return allocate(p, bytes, emu::t_device); }
cudaError_t cudaFree(void* p) { return release(p, false); }
cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned int) { return allocate(p, bytes, -1); }
cudaError_t cudaFreeHost(void* p) { return release(p, true); }
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total) {
    std::lock_guard<std::mutex> lock(emu::g_mutex);
    *total = emu::kMemoryPerGpu;
    *free_bytes = emu::kMemoryPerGpu - emu::g_used[emu::t_device];
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t s) {
    if (const cudaError_t e = stream_on_current(s, "cudaMemcpyAsync")) return e;
    const bool dst_device = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
    const bool src_device = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
    if (kind != cudaMemcpyHostToDevice && kind != cudaMemcpyDeviceToHost && kind != cudaMemcpyDeviceToDevice)
        return fail(cudaErrorInvalidValue, "cudaMemcpyAsync with a kind the backend should not use");
    if (dst_device) {
        if (const cudaError_t e = checked(emu::usable(dst, bytes, true, "cudaMemcpyAsync destination"))) return e;
    } else if (emu::is_device_memory(dst)) {
        return fail(cudaErrorInvalidValue, "cudaMemcpyAsync device-to-host into device memory");
    }
    if (src_device) {
        if (const cudaError_t e = checked(emu::usable(src, bytes, true, "cudaMemcpyAsync source"))) return e;
    } else if (emu::is_device_memory(src)) {
        return fail(cudaErrorInvalidValue, "cudaMemcpyAsync host-to-device from device memory");
    }
    bool pageable = false;
    if (kind != cudaMemcpyDeviceToDevice) {
        std::lock_guard<std::mutex> lock(emu::g_mutex);
        pageable = !emu::find(kind == cudaMemcpyHostToDevice ? src : dst, bytes);
    }
    if (pageable && emu::capturing(s))
        return fail(cudaErrorStreamCaptureUnsupported, "a copy from or to pageable host memory in a capture");
    emu::submit(s, [=] { std::memmove(dst, src, bytes); });
    // With pageable host memory the call returns once the host side is read (staged) or written:
    // the copy is done when it returns.
    if (pageable && emu::asynchronous()) return cudaStreamSynchronize(s);
    return cudaSuccess;
}
cudaError_t cudaMemcpyPeerAsync(void* dst, int dst_device, const void* src, int src_device, size_t bytes,
                                cudaStream_t s) {
    if (const cudaError_t e = stream_on_current(s, "cudaMemcpyPeerAsync")) return e;
    {
        std::lock_guard<std::mutex> lock(emu::g_mutex);
        const emu::Alloc* d = emu::find(dst, bytes);
        const emu::Alloc* r = emu::find(src, bytes);
        if (!d || d->device != dst_device || !r || r->device != src_device)
            return fail(cudaErrorInvalidValue, "cudaMemcpyPeerAsync: a range outside the named GPUs' allocations");
    }
    bool corrupt = false;
    if (emu::peer_corrupts() && dst_device != src_device && bytes > 0) {
        std::lock_guard<std::mutex> lock(emu::g_mutex);
        corrupt = emu::g_peer_enabled[dst_device][src_device] || emu::g_peer_enabled[src_device][dst_device];
    }
    emu::submit(s, [=] {
        std::memmove(dst, src, bytes);
        if (corrupt) static_cast<unsigned char*>(dst)[bytes / 2] ^= 0x40;
    });
    return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t s) {
    if (const cudaError_t e = stream_on_current(s, "cudaMemsetAsync")) return e;
    if (const cudaError_t e = checked(emu::usable(p, bytes, true, "cudaMemsetAsync destination"))) return e;
    emu::submit(s, [=] { std::memset(p, value, bytes); });
    return cudaSuccess;
}

// ---- streams, events, host functions --------------------------------------------------------

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int) {
    *s = new CUstream_st;
    (*s)->device = emu::t_device;
    return cudaSuccess;
}
// Priorities order nothing here (every stream's work runs on its own fiber); the range is a GPU's.
cudaError_t cudaDeviceGetStreamPriorityRange(int* least, int* greatest) {
    *least = 0;
    *greatest = -5;
    return cudaSuccess;
}
cudaError_t cudaStreamCreateWithPriority(cudaStream_t* s, unsigned int flags, int priority) {
    if (priority > 0 || priority < -5) return cudaErrorInvalidValue;
    return cudaStreamCreateWithFlags(s, flags);
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
    delete s;
    return cudaSuccess;
}
namespace {
std::vector<uint64_t> queued_on(cudaStream_t s) {
    std::lock_guard<std::mutex> lock(emu::g_capture_mutex);
    return s ? s->queued : std::vector<uint64_t>{};
}
}  // namespace
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    if (emu::capturing(s))
        return fail(cudaErrorStreamCaptureUnsupported, "cudaStreamSynchronize of a capturing stream");
    if (emu::asynchronous()) {
        if (s) emu::queue_wait(queued_on(s));
        else emu::queue_wait_all();
    }
    return emu::after_wait(emu::stream_device(s));
}
cudaError_t cudaStreamQuery(cudaStream_t s) {
    if (emu::capturing(s)) return fail(cudaErrorStreamCaptureUnsupported, "cudaStreamQuery of a capturing stream");
    if (const cudaError_t e = emu::after_wait(emu::stream_device(s))) return e;
    if (emu::asynchronous() && s && !emu::queue_done(queued_on(s))) return result(cudaErrorNotReady);
    return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int) {
    if (!e || !s) return result(cudaErrorInvalidResourceHandle);
    std::lock_guard<std::mutex> lock(emu::g_capture_mutex);
    emu::Capture* c = e->capture && !e->capture->ended ? e->capture : nullptr;
    if (!c) {
        if (s->capture)
            return fail(cudaErrorStreamCaptureIsolation,
                        "a capturing stream waits on an event recorded outside the capture");
        // Eager streams: the work it stands for is done. Asynchronous: s's next work follows it.
        if (emu::asynchronous()) emu::queue_join(s->queued, e->queued);
        return cudaSuccess;
    }
    if (s->capture && s->capture != c)
        return fail(cudaErrorStreamCaptureIsolation, "a stream of one capture waits on an event of another");
    if (!s->capture) {  // s joins the capture
        s->capture = c;
        s->frontier.clear();
        if (s != c->origin) c->joined.push_back(s);
    }
    for (int n : e->frontier)
        if (std::find(s->frontier.begin(), s->frontier.end(), n) == s->frontier.end()) s->frontier.push_back(n);
    return cudaSuccess;
}
cudaError_t cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn, void* arg) {
    if (const cudaError_t e = stream_on_current(s, "cudaLaunchHostFunc")) return e;
    emu::submit(s, [=] { fn(arg); });
    return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned int flags) {
    *e = new CUevent_st;
    (*e)->device = emu::t_device;
    (*e)->timing = !(flags & cudaEventDisableTiming);
    return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
    delete e;
    return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
    if (!e) return result(cudaErrorInvalidResourceHandle);
    if (e->device != emu::stream_device(s))
        return fail(cudaErrorInvalidResourceHandle, "an event of GPU " + std::to_string(e->device) +
                                                        " recorded on a stream of GPU " +
                                                        std::to_string(emu::stream_device(s)));
    std::lock_guard<std::mutex> lock(emu::g_capture_mutex);
    if (s && s->capture) {
        e->capture = s->capture;
        e->frontier = s->frontier;
        return cudaSuccess;
    }
    e->capture = nullptr;
    e->frontier.clear();
    e->recorded = true;
    if (!emu::asynchronous()) {
        e->ms = emu::now_ms();
        return cudaSuccess;
    }
    if (!s) {  // the legacy default stream: after everything issued so far
        emu::queue_wait_all();
        e->queued.clear();
        e->completed_ms = std::make_shared<double>(emu::now_ms());
        return cudaSuccess;
    }
    if (e->timing) {  // an item of its own that notes when the stream reached it
        auto completed = std::make_shared<double>(0.0);
        s->queued = {emu::queue_issue(
            s->device, [completed] { *completed = emu::now_ms(); }, s->queued)};
        e->completed_ms = completed;
    }
    e->queued = s->queued;
    return cudaSuccess;
}
namespace {
cudaError_t event_done(cudaEvent_t e, const char* call) {
    if (!e) return result(cudaErrorInvalidResourceHandle);
    std::lock_guard<std::mutex> lock(emu::g_capture_mutex);
    if (e->capture && !e->capture->ended)
        return fail(cudaErrorCapturedEvent, std::string(call) + " of a captured event");
    return cudaSuccess;
}
std::vector<uint64_t> queued_for(cudaEvent_t e) {
    std::lock_guard<std::mutex> lock(emu::g_capture_mutex);
    return e->queued;
}
}  // namespace
cudaError_t cudaEventQuery(cudaEvent_t e) {
    if (const cudaError_t err = event_done(e, "cudaEventQuery")) return err;
    if (const cudaError_t err = emu::after_wait(e->device)) return err;
    if (emu::asynchronous() && !emu::queue_done(queued_for(e))) return result(cudaErrorNotReady);
    return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
    if (const cudaError_t err = event_done(e, "cudaEventSynchronize")) return err;
    if (emu::asynchronous()) emu::queue_wait(queued_for(e));
    return emu::after_wait(e->device);
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b) {
    if (!a || !b || !a->timing || !b->timing) return result(cudaErrorInvalidResourceHandle);
    if (!a->recorded || !b->recorded) return result(cudaErrorInvalidResourceHandle);
    if (!emu::asynchronous()) {
        *ms = float(b->ms - a->ms);
        return cudaSuccess;
    }
    if (!emu::queue_done(queued_for(a)) || !emu::queue_done(queued_for(b))) return result(cudaErrorNotReady);
    std::lock_guard<std::mutex> lock(emu::g_capture_mutex);
    if (!a->completed_ms || !b->completed_ms) return result(cudaErrorInvalidResourceHandle);
    *ms = float(*b->completed_ms - *a->completed_ms);
    return cudaSuccess;
}

cudaError_t cudaStreamGetCaptureInfo(cudaStream_t s, cudaStreamCaptureStatus* status, unsigned long long* id,
                                     cudaGraph_t*, const cudaGraphNode_t**, const cudaGraphEdgeData**, size_t*) {
    std::lock_guard<std::mutex> lock(emu::g_capture_mutex);
    const bool active = s && s->capture;
    *status = active ? cudaStreamCaptureStatusActive : cudaStreamCaptureStatusNone;
    if (id) *id = active ? reinterpret_cast<uintptr_t>(s->capture) : 0;
    return cudaSuccess;
}
cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode) {
    std::lock_guard<std::mutex> lock(emu::g_capture_mutex);
    if (!s) return fail(cudaErrorStreamCaptureUnsupported, "capture of the legacy default stream");
    if (s->capture) return fail(cudaErrorIllegalState, "cudaStreamBeginCapture of a stream already capturing");
    s->capture = new emu::Capture{};
    s->capture->origin = s;
    s->frontier.clear();
    return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t* graph) {
    std::lock_guard<std::mutex> lock(emu::g_capture_mutex);
    emu::Capture* c = s ? s->capture : nullptr;
    if (!c || c->origin != s)
        return fail(cudaErrorIllegalState, "cudaStreamEndCapture of a stream that began no capture");
    // Every joined stream's work must be an ancestor of the origin's last work.
    std::set<int> ancestors;
    std::vector<int> todo = s->frontier;
    while (!todo.empty()) {
        const int n = todo.back();
        todo.pop_back();
        if (!ancestors.insert(n).second) continue;
        for (int d : c->deps[size_t(n)]) todo.push_back(d);
    }
    bool unjoined = false;
    for (cudaStream_t j : c->joined) {
        for (int n : j->frontier) unjoined = unjoined || !ancestors.count(n);
        j->capture = nullptr;
        j->frontier.clear();
    }
    s->capture = nullptr;
    s->frontier.clear();
    c->ended = true;
    if (unjoined) return fail(cudaErrorStreamCaptureUnjoined, "a stream that joined the capture did not join back");
    *graph = new CUgraph_st{c};
    return cudaSuccess;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long) {
    *exec = new CUgraphExec_st{graph->capture->nodes, graph->capture->deps};
    return cudaSuccess;
}
cudaError_t cudaGraphDestroy(cudaGraph_t g) {
    delete g;
    return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t g) {
    delete g;
    return cudaSuccess;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t g, cudaStream_t s) {
    if (const cudaError_t e = stream_on_current(s, "cudaGraphLaunch")) return e;
    if (emu::asynchronous() && s && !emu::capturing(s)) {
        // Every node an item of the queue with the graph's own edges (those without any after the
        // launch stream's earlier work): a replay runs in any order the edges allow, so an edge the
        // capture missed shows.
        std::lock_guard<std::mutex> lock(emu::g_capture_mutex);
        std::vector<uint64_t> ids(g->nodes.size());
        for (size_t i = 0; i < g->nodes.size(); ++i) {
            std::vector<uint64_t> deps;
            for (int d : g->deps[i]) deps.push_back(ids[size_t(d)]);
            if (deps.empty()) deps = s->queued;
            ids[i] = emu::queue_issue(g->nodes[i].device, g->nodes[i].work, deps);
        }
        if (!ids.empty()) s->queued = ids;
        emu::queue_join(s->queued, {});
        return cudaSuccess;
    }
    emu::submit(s, [g] {
        const int saved = emu::t_device;
        for (const emu::Node& n : g->nodes) {
            emu::t_device = n.device;
            n.work();
        }
        emu::t_device = saved;
    });
    return cudaSuccess;
}

// ---- cuBLAS and cuBLASLt: reference products with the libraries' argument rules --------------

namespace {

size_t type_bytes(cudaDataType t) { return t == CUDA_R_32F ? 4 : 2; }
bool known_type(cudaDataType t) { return t == CUDA_R_32F || t == CUDA_R_16BF || t == CUDA_R_16F; }

}  // namespace

namespace emu {
float load(const void* p, cudaDataType t, size_t i) {
    switch (t) {
        case CUDA_R_16BF:
            return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
        case CUDA_R_16F:
            return __half2float(static_cast<const __half*>(p)[i]);
        default:
            return static_cast<const float*>(p)[i];
    }
}
void store(void* p, cudaDataType t, size_t i, float v) {
    switch (t) {
        case CUDA_R_16BF:
            static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
            break;
        case CUDA_R_16F:
            static_cast<__half*>(p)[i] = __float2half_rn(v);
            break;
        default:
            static_cast<float*>(p)[i] = v;
    }
}
float rounded(float v, cudaDataType t) {
    switch (t) {
        case CUDA_R_16BF:
            return __bfloat162float(__float2bfloat16_rn(v));
        case CUDA_R_16F:
            return __half2float(__float2half_rn(v));
        default:
            return v;
    }
}
}  // namespace emu

namespace {

using emu::load;
using emu::store;

float to_tf32(float x) {  // round to 10 mantissa bits, to nearest (the tensor cores' input)
    uint32_t u;
    std::memcpy(&u, &x, 4);
    if ((u & 0x7f800000u) != 0x7f800000u) u = (u + 0x1000u) & ~0x1fffu;
    std::memcpy(&x, &u, 4);
    return x;
}

// A column-major matrix as cuBLAS sees it: element (r, c) of op(M).
struct Operand {
    const void* p;
    cudaDataType t;
    int64_t ld;
    bool trans;
    bool tf32;
    float at(int64_t r, int64_t c) const {
        const float v = trans ? load(p, t, size_t(r * ld + c)) : load(p, t, size_t(c * ld + r));
        return tf32 ? to_tf32(v) : v;
    }
};

// Bytes spanned by a column-major rows x cols matrix with leading dimension ld.
size_t span(int64_t rows, int64_t cols, int64_t ld, cudaDataType t) {
    if (rows <= 0 || cols <= 0) return 0;
    return size_t((cols - 1) * ld + rows) * type_bytes(t);
}

std::string operand_ok(const void* p, int64_t rows, int64_t cols, int64_t ld, cudaDataType t, const char* what) {
    return emu::usable(p, std::max<size_t>(span(rows, cols, ld, t), 1), true, what);
}

cublasStatus_t blas_fail(cublasStatus_t st, const std::string& why) {
    std::fprintf(stderr, "emulated GPU %d: %s\n", emu::t_device, why.c_str());
    return st;
}

// D = alpha op(A) op(B) + beta C (C not read when beta == 0), accumulated in float over l in
// order. Rows of op(A) and columns of op(B) are unpacked to contiguous floats first: the
// emulated suite spends most of its time here.
void product(int64_t m, int64_t n, int64_t k, float alpha, const Operand& a, const Operand& b, float beta,
             const void* c, cudaDataType ct, int64_t ldc, void* d, cudaDataType dt, int64_t ldd, const float* bias,
             bool relu) {
    std::vector<float> rows(size_t(m * k)), cols(size_t(n * k));
    for (int64_t i = 0; i < m; ++i)
        for (int64_t l = 0; l < k; ++l) rows[size_t(i * k + l)] = a.at(i, l);
    for (int64_t j = 0; j < n; ++j)
        for (int64_t l = 0; l < k; ++l) cols[size_t(j * k + l)] = b.at(l, j);
    for (int64_t j = 0; j < n; ++j)
        for (int64_t i = 0; i < m; ++i) {
            const float* x = rows.data() + i * k;
            const float* y = cols.data() + j * k;
            float acc = 0;
            for (int64_t l = 0; l < k; ++l) acc += x[l] * y[l];
            float v = alpha * acc;
            if (beta != 0.0f) v += beta * load(c, ct, size_t(j * ldc + i));
            if (bias) v += bias[i];
            if (relu) v = std::max(v, 0.0f);
            store(d, dt, size_t(j * ldd + i), v);
        }
}

}  // namespace

cublasStatus_t cublasCreate(cublasHandle_t* h) {
    *h = new cublasContext{emu::t_device, nullptr};
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy(cublasHandle_t h) {
    delete h;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s) {
    if (emu::stream_device(s) != h->device)
        return blas_fail(CUBLAS_STATUS_INVALID_VALUE, "cublasSetStream: a stream of another GPU");
    h->stream = s;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetWorkspace(cublasHandle_t h, void* ws, size_t bytes) {
    const int saved = emu::t_device;
    emu::t_device = h->device;
    const std::string why = emu::usable(ws, std::max<size_t>(bytes, 1), true, "cublasSetWorkspace workspace");
    emu::t_device = saved;
    return why.empty() ? CUBLAS_STATUS_SUCCESS : blas_fail(CUBLAS_STATUS_INVALID_VALUE, why);
}
cublasStatus_t cublasGetProperty(libraryPropertyType type, int* value) {
    *value = type == MAJOR_VERSION ? CUBLAS_VER_MAJOR : type == MINOR_VERSION ? CUBLAS_VER_MINOR : CUBLAS_VER_PATCH;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                            const void* alpha, const void* A, cudaDataType at, int lda, const void* B, cudaDataType bt,
                            int ldb, const void* beta, void* C, cudaDataType ct, int ldc, cublasComputeType_t compute,
                            cublasGemmAlgo_t) {
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (h->device != emu::t_device)
        return blas_fail(CUBLAS_STATUS_EXECUTION_FAILED, "cublasGemmEx: a handle of GPU " + std::to_string(h->device) +
                                                             " used with GPU " + std::to_string(emu::t_device) +
                                                             " current");
    const bool a_t = ta == CUBLAS_OP_T, b_t = tb == CUBLAS_OP_T;
    if ((ta != CUBLAS_OP_N && !a_t) || (tb != CUBLAS_OP_N && !b_t) || m < 0 || n < 0 || k < 0 ||
        lda < std::max(1, a_t ? k : m) || ldb < std::max(1, b_t ? n : k) || ldc < std::max(1, m))
        return blas_fail(CUBLAS_STATUS_INVALID_VALUE, "cublasGemmEx: a dimension or leading dimension out of range");
    if (!known_type(at) || at != bt || !(ct == at || ct == CUDA_R_32F))
        return blas_fail(CUBLAS_STATUS_NOT_SUPPORTED, "cublasGemmEx: an unsupported combination of types");
    if (compute != CUBLAS_COMPUTE_32F &&
        !(compute == CUBLAS_COMPUTE_32F_FAST_TF32 && at == CUDA_R_32F && ct == CUDA_R_32F))
        return blas_fail(CUBLAS_STATUS_NOT_SUPPORTED, "cublasGemmEx: an unsupported compute type for these types");
    if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
    std::string why = operand_ok(A, a_t ? k : m, a_t ? m : k, lda, at, "cublasGemmEx A");
    if (why.empty()) why = operand_ok(B, b_t ? n : k, b_t ? k : n, ldb, bt, "cublasGemmEx B");
    if (why.empty()) why = operand_ok(C, m, n, ldc, ct, "cublasGemmEx C");
    if (!why.empty()) return blas_fail(CUBLAS_STATUS_EXECUTION_FAILED, why);
    const bool tf32 = compute == CUBLAS_COMPUTE_32F_FAST_TF32;
    const Operand oa{A, at, lda, a_t, tf32}, ob{B, bt, ldb, b_t, tf32};
    const float alpha_v = *static_cast<const float*>(alpha), beta_v = *static_cast<const float*>(beta);
    emu::submit(h->stream, [=] { product(m, n, k, alpha_v, oa, ob, beta_v, C, ct, ldc, C, ct, ldc, nullptr, false); });
    return CUBLAS_STATUS_SUCCESS;
}

// Each matrix as cublasGemmEx takes it, matrix i's operands stride elements after matrix i-1's.
cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                                          int k, const void* alpha, const void* A, cudaDataType at, int lda,
                                          long long stride_a, const void* B, cudaDataType bt, int ldb,
                                          long long stride_b, const void* beta, void* C, cudaDataType ct, int ldc,
                                          long long stride_c, int batches, cublasComputeType_t compute,
                                          cublasGemmAlgo_t algo) {
    if (batches < 0 || stride_a < 0 || stride_b < 0 || stride_c < 0)
        return blas_fail(CUBLAS_STATUS_INVALID_VALUE, "cublasGemmStridedBatchedEx: a negative count or stride");
    if (!known_type(at) || !known_type(bt) || !known_type(ct))
        return blas_fail(CUBLAS_STATUS_NOT_SUPPORTED, "cublasGemmStridedBatchedEx: an unsupported type");
    for (int i = 0; i < batches; ++i) {
        const cublasStatus_t st =
            cublasGemmEx(h, ta, tb, m, n, k, alpha, static_cast<const char*>(A) + i * stride_a * type_bytes(at), at,
                         lda, static_cast<const char*>(B) + i * stride_b * type_bytes(bt), bt, ldb, beta,
                         static_cast<char*>(C) + i * stride_c * type_bytes(ct), ct, ldc, compute, algo);
        if (st != CUBLAS_STATUS_SUCCESS) return st;
    }
    return CUBLAS_STATUS_SUCCESS;
}

namespace {

struct LtDesc {
    cublasComputeType_t compute;
    int32_t trans_a = CUBLAS_OP_N, trans_b = CUBLAS_OP_N;
    uint32_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    const void* bias = nullptr;
    int32_t bias_type = -1;  // unset: D's type
};
struct LtLayout {
    cudaDataType type;
    int64_t rows, cols, ld;
};

LtDesc* desc(cublasLtMatmulDesc_t d) { return reinterpret_cast<LtDesc*>(d); }
LtLayout* layout(cublasLtMatrixLayout_t l) { return reinterpret_cast<LtLayout*>(l); }

// The matmul's shapes and types against each other and the epilogue; empty when cuBLASLt would
// accept them.
std::string lt_problem(const LtDesc& d, const LtLayout& a, const LtLayout& b, const LtLayout& c, const LtLayout& o) {
    const int64_t m = o.rows, n = o.cols;
    const int64_t am = d.trans_a == CUBLAS_OP_T ? a.cols : a.rows, ak = d.trans_a == CUBLAS_OP_T ? a.rows : a.cols;
    const int64_t bk = d.trans_b == CUBLAS_OP_T ? b.cols : b.rows, bn = d.trans_b == CUBLAS_OP_T ? b.rows : b.cols;
    if (am != m || bn != n || ak != bk) return "op(A), op(B) and D do not make a product";
    if (c.rows != m || c.cols != n || c.type != o.type) return "C and D differ in shape or type";
    for (const LtLayout* l : {&a, &b, &c, &o})
        if (l->ld < std::max<int64_t>(1, l->rows)) return "a leading dimension smaller than the rows";
    if (!known_type(a.type) || a.type != b.type || !(o.type == a.type || o.type == CUDA_R_32F))
        return "an unsupported combination of types";
    if (d.compute == CUBLAS_COMPUTE_32F_FAST_TF32 && (a.type != CUDA_R_32F || o.type != CUDA_R_32F))
        return "TF32 compute with 16-bit operands";
    switch (d.epilogue) {
        case CUBLASLT_EPILOGUE_DEFAULT:
        case CUBLASLT_EPILOGUE_RELU:
            break;
        case CUBLASLT_EPILOGUE_BIAS:
        case CUBLASLT_EPILOGUE_RELU_BIAS:
        case CUBLASLT_EPILOGUE_BGRADB:
            if (d.bias_type != -1 && d.bias_type != CUDA_R_32F && d.bias_type != int32_t(o.type))
                return "a bias type other than f32 or D's";
            break;
        default:
            return "an epilogue the emulator does not implement";
    }
    return {};
}

}  // namespace

cublasStatus_t cublasLtCreate(cublasLtHandle_t* h) {
    *h = new cublasLtContext{emu::t_device};
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) {
    delete h;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* d, cublasComputeType_t compute, cudaDataType scale) {
    if (scale != CUDA_R_32F || (compute != CUBLAS_COMPUTE_32F && compute != CUBLAS_COMPUTE_32F_FAST_TF32))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    auto* x = new LtDesc{};
    x->compute = compute;
    *d = reinterpret_cast<cublasLtMatmulDesc_t>(x);
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) {
    delete desc(d);
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr,
                                              const void* buf, size_t bytes) {
    LtDesc& x = *desc(d);
    auto take = [&](auto& field) {
        if (bytes != sizeof field) return CUBLAS_STATUS_INVALID_VALUE;
        std::memcpy(&field, buf, bytes);
        return CUBLAS_STATUS_SUCCESS;
    };
    switch (attr) {
        case CUBLASLT_MATMUL_DESC_TRANSA:
            return take(x.trans_a);
        case CUBLASLT_MATMUL_DESC_TRANSB:
            return take(x.trans_b);
        case CUBLASLT_MATMUL_DESC_EPILOGUE:
            return take(x.epilogue);
        case CUBLASLT_MATMUL_DESC_BIAS_POINTER:
            return take(x.bias);
        case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE:
            return take(x.bias_type);
        default:
            return blas_fail(CUBLAS_STATUS_NOT_SUPPORTED, "cublasLtMatmulDescSetAttribute: an attribute not emulated");
    }
}
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* l, cudaDataType type, uint64_t rows, uint64_t cols,
                                          int64_t ld) {
    *l = reinterpret_cast<cublasLtMatrixLayout_t>(new LtLayout{type, int64_t(rows), int64_t(cols), ld});
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) {
    delete layout(l);
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* p) {
    *p = reinterpret_cast<cublasLtMatmulPreference_t>(new int(0));
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) {
    delete reinterpret_cast<int*>(p);
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t, cublasLtMatmulPreferenceAttributes_t,
                                                    const void*, size_t) {
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t, cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t a,
                                              cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c,
                                              cublasLtMatrixLayout_t o, cublasLtMatmulPreference_t, int requested,
                                              cublasLtMatmulHeuristicResult_t* results, int* found) {
    *found = 0;
    if (requested < 1) return CUBLAS_STATUS_INVALID_VALUE;
    const std::string why = lt_problem(*desc(d), *layout(a), *layout(b), *layout(c), *layout(o));
    if (!why.empty()) return blas_fail(CUBLAS_STATUS_NOT_SUPPORTED, "cublasLtMatmulAlgoGetHeuristic: " + why);
    results[0] = cublasLtMatmulHeuristicResult_t{};
    results[0].state = CUBLAS_STATUS_SUCCESS;
    *found = 1;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t dd, const void* alpha, const void* A,
                              cublasLtMatrixLayout_t al, const void* B, cublasLtMatrixLayout_t bl, const void* beta,
                              const void* C, cublasLtMatrixLayout_t cl, void* D, cublasLtMatrixLayout_t ol,
                              const cublasLtMatmulAlgo_t*, void*, size_t, cudaStream_t s) {
    if (h->device != emu::t_device || emu::stream_device(s) != emu::t_device)
        return blas_fail(CUBLAS_STATUS_EXECUTION_FAILED, "cublasLtMatmul: a handle or stream of another GPU");
    const LtDesc& d = *desc(dd);
    const LtLayout &a = *layout(al), &b = *layout(bl), &c = *layout(cl), &o = *layout(ol);
    if (const std::string why = lt_problem(d, a, b, c, o); !why.empty())
        return blas_fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmul: " + why);
    const int64_t m = o.rows, n = o.cols, k = d.trans_a == CUBLAS_OP_T ? a.rows : a.cols;
    const float be = *static_cast<const float*>(beta);
    std::string why = operand_ok(A, a.rows, a.cols, a.ld, a.type, "cublasLtMatmul A");
    if (why.empty()) why = operand_ok(B, b.rows, b.cols, b.ld, b.type, "cublasLtMatmul B");
    if (why.empty() && be != 0.0f) why = operand_ok(C, c.rows, c.cols, c.ld, c.type, "cublasLtMatmul C");
    if (why.empty()) why = operand_ok(D, o.rows, o.cols, o.ld, o.type, "cublasLtMatmul D");
    const bool uses_bias = d.epilogue == CUBLASLT_EPILOGUE_BIAS || d.epilogue == CUBLASLT_EPILOGUE_RELU_BIAS ||
                           d.epilogue == CUBLASLT_EPILOGUE_BGRADB;
    const cudaDataType bias_type = d.bias_type == -1 ? o.type : cudaDataType(d.bias_type);
    const int64_t bias_len = d.epilogue == CUBLASLT_EPILOGUE_BGRADB ? n : m;
    if (why.empty() && uses_bias) {
        if (bias_type != CUDA_R_32F) why = "cublasLtMatmul: the emulator takes f32 bias vectors only";
        else why = emu::usable(d.bias, size_t(bias_len) * 4, true, "cublasLtMatmul bias");
    }
    if (!why.empty()) return blas_fail(CUBLAS_STATUS_EXECUTION_FAILED, why);
    const bool tf32 = d.compute == CUBLAS_COMPUTE_32F_FAST_TF32;
    const Operand oa{A, a.type, a.ld, d.trans_a == CUBLAS_OP_T, tf32},
        ob{B, b.type, b.ld, d.trans_b == CUBLAS_OP_T, tf32};
    const bool add_bias = d.epilogue == CUBLASLT_EPILOGUE_BIAS || d.epilogue == CUBLASLT_EPILOGUE_RELU_BIAS;
    const bool relu = d.epilogue == CUBLASLT_EPILOGUE_RELU || d.epilogue == CUBLASLT_EPILOGUE_RELU_BIAS;
    const float alpha_v = *static_cast<const float*>(alpha);
    const cudaDataType ct = c.type, ot = o.type;
    const int64_t ldc = c.ld, ldd = o.ld;
    const float* bias = static_cast<const float*>(d.bias);
    const bool bgrad = d.epilogue == CUBLASLT_EPILOGUE_BGRADB;
    const Operand raw_b{B, b.type, b.ld, d.trans_b == CUBLAS_OP_T, false};
    emu::submit(s, [=] {
        product(m, n, k, alpha_v, oa, ob, be, C, ct, ldc, D, ot, ldd, add_bias ? bias : nullptr, relu);
        if (bgrad) {  // the bias gradient: op(B) summed over k
            auto* db = const_cast<float*>(bias);
            for (int64_t j = 0; j < n; ++j) {
                float sum = 0;
                for (int64_t l = 0; l < k; ++l) sum += raw_b.at(l, j);
                db[j] = sum;
            }
        }
    });
    return CUBLAS_STATUS_SUCCESS;
}
