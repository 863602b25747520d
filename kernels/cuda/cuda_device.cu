// The CUDA backend's Device: one per replica (several may share a GPU). Owns three streams
// (compute, comm, copy) and a fourth for staged peer reduces, a cuBLAS handle bound to the
// compute stream with a fixed workspace, and scratch sized once.
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#if MIRRORED_NCCL
#include <nccl.h>
#endif

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <mutex>
#include <string>
#include <vector>

#include "kernels/backends.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/fused_gemm.h"
#include "kernels/device.h"
#include "base/error.h"
#include "kernels/op_math.h"
#include "kernels/peer_staging.h"

namespace mirrored {

[[noreturn]] void cuda_fail(const char* stmt, const char* what, const char* file, int line, int device) {
    throw DeviceError(std::string("cuda:") + std::to_string(device) + ": " + stmt + " failed: " + what + " (" + file +
                      ":" + std::to_string(line) + ")");
}

namespace {

// The errors after which this GPU's context is unusable (CUDA: "the process must be terminated
// and relaunched") or the GPU itself is lost: its own fault, not a bad call.
bool gpu_fault(cudaError_t e) {
    switch (e) {
        case cudaErrorIllegalAddress:
        case cudaErrorLaunchFailure:
        case cudaErrorLaunchTimeout:
        case cudaErrorHardwareStackError:
        case cudaErrorIllegalInstruction:
        case cudaErrorMisalignedAddress:
        case cudaErrorInvalidAddressSpace:
        case cudaErrorInvalidPc:
        case cudaErrorECCUncorrectable:
        case cudaErrorNvlinkUncorrectable:
        case cudaErrorDevicesUnavailable:
        case cudaErrorContextIsDestroyed:
            return true;
        default:
            return false;
    }
}

}  // namespace

[[noreturn]] void cuda_fail(const char* stmt, cudaError_t err, const char* file, int line, int device) {
    const std::string name = std::string("cuda:") + std::to_string(device);
    const std::string what =
        name + ": " + stmt + " failed: " + cudaGetErrorString(err) + " (" + file + ":" + std::to_string(line) + ")";
    if (gpu_fault(err)) throw DeviceError(what, name);
    throw DeviceError(what);
}

namespace {

constexpr int kMaxGpus = 64;
// peer_enabled[a][b]: device a may load from memory on device b in a kernel.
std::array<std::array<bool, kMaxGpus>, kMaxGpus> g_peer_enabled{};
std::mutex g_peer_mutex;

constexpr size_t kCublasWorkspace = size_t(32) << 20;  // fixed, so capture never allocates
constexpr int kMinComputeMajor = 8;                    // Ampere and newer (bf16, cp.async)

std::string mib(size_t bytes) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.1f MiB", bytes / 1048576.0);
    return buf;
}

class CudaDevice final : public Device {
public:
    explicit CudaDevice(int ordinal) : Device(DeviceType::cuda, ordinal, "cuda:" + std::to_string(ordinal)) {
        const int n = cuda_device_count();
        if (ordinal < 0 || ordinal >= n)
            throw DeviceError("cuda:" + std::to_string(ordinal) + ": no such GPU (" + std::to_string(n) + " visible)");
        use();
        CUDA_CHECK(ordinal, cudaGetDeviceProperties(&props_, ordinal));
        if (props_.major < kMinComputeMajor)
            throw DeviceError("cuda:" + std::to_string(ordinal) + ": " + props_.name + " has compute capability " +
                              std::to_string(props_.major) + "." + std::to_string(props_.minor) +
                              "; this build supports " + std::to_string(kMinComputeMajor) +
                              ".0 and newer (Ampere, Ada, Hopper, Blackwell)");
        // The all-reduce stream runs at the highest priority the GPU offers: a bucket ready while
        // the backward pass still queues kernels goes out first, so communication overlaps
        // compute instead of waiting behind it.
        int least = 0, greatest = 0;
        CUDA_CHECK(ordinal, cudaDeviceGetStreamPriorityRange(&least, &greatest));
        cudaStream_t s[4];
        for (int i = 0; i < 4; ++i)
            CUDA_CHECK(ordinal, cudaStreamCreateWithPriority(&s[i], cudaStreamNonBlocking, i == 1 ? greatest : least));
        compute_.handle = s[0];
        comm_.handle = s[1];
        copy_.handle = s[2];
        staging_stream_ = s[3];
        // The cuBLAS handle and its one workspace belong to the compute stream, bound once here
        // (cublasSetStream resets the workspace to cuBLAS's own pool, so the workspace comes
        // after it). Every product runs there (native_launch): two streams sharing one
        // workspace would race on a GPU, where their GEMMs really overlap.
        CUBLAS_CHECK(ordinal, cublasCreate(&cublas_));
        workspace_ = alloc_bytes(kCublasWorkspace);
        CUBLAS_CHECK(ordinal, cublasSetStream(cublas_, stream(compute_)));
        CUBLAS_CHECK(ordinal, cublasSetWorkspace(cublas_, workspace_, kCublasWorkspace));
        scratch_ = static_cast<float*>(alloc_bytes(cuda::kScratchFloats * sizeof(float)));
        staging_ = std::make_unique<PeerStaging>(*this, Stream{staging_stream_});
    }

    ~CudaDevice() override {
        if (abandoned_) return;  // a failed device: no waiting, no freeing (the process is ending)
        cudaSetDevice(ordinal());
        cudaDeviceSynchronize();
        staging_.reset();
        if (cublas_) cublasDestroy(cublas_);
        fused_.reset();
        if (fused_workspace_) free_bytes(fused_workspace_);
        free_bytes(workspace_);
        free_bytes(scratch_);
        for (cudaStream_t st : {stream(compute_), stream(comm_), stream(copy_), staging_stream_})
            if (st) cudaStreamDestroy(st);
    }

    std::string description() const override {
        return std::string(props_.name) + ", " + mib(props_.totalGlobalMem) + ", sm_" + std::to_string(props_.major) +
               std::to_string(props_.minor);
    }

    void* alloc_bytes(size_t bytes) override {
        use();
        void* p = nullptr;
        const cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
        if (e == cudaErrorMemoryAllocation) {
            cudaGetLastError();  // clear the sticky-free error state
            size_t free_b = 0, total_b = 0;
            cudaMemGetInfo(&free_b, &total_b);
            throw DeviceError(name() + ": out of memory allocating " + mib(bytes) + " (" + mib(free_b) + " free of " +
                              mib(total_b) + ")");
        }
        CUDA_CHECK_AS(ordinal(), "cudaMalloc(&p, bytes)", e);
        note_alloc(p, bytes);
        return p;
    }
    void free_bytes(void* p) noexcept override {
        note_free(p);
        cudaSetDevice(ordinal());
        cudaFree(p);
    }
    uint64_t memory_in_use() const override {
        size_t free_b = 0, total_b = 0;
        if (cudaSetDevice(ordinal()) != cudaSuccess || cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
            cudaGetLastError();
            return allocated_bytes();
        }
        return total_b - free_b;
    }
    void* alloc_host_bytes(size_t bytes) override {
        use();
        void* p = nullptr;
        const cudaError_t e = cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocPortable);
        if (e == cudaErrorMemoryAllocation) {
            cudaGetLastError();
            throw DeviceError(name() + ": out of pinned host memory allocating " + mib(bytes));
        }
        CUDA_CHECK_AS(ordinal(), "cudaHostAlloc(&p, bytes, cudaHostAllocPortable)", e);
        return p;
    }
    void free_host_bytes(void* p) noexcept override { cudaFreeHost(p); }
    void copy_to_device(Stream s, void* dst, const void* src, size_t bytes) override {
        if (!bytes) return;
        use();
        ++work_.copies;
        CUDA_CHECK(ordinal(), cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream(s)));
    }
    void copy_to_host(Stream s, void* dst, const void* src, size_t bytes) override {
        if (!bytes) return;
        use();
        ++work_.copies;
        CUDA_CHECK(ordinal(), cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream(s)));
    }
    void copy_on_device(Stream s, void* dst, const void* src, size_t bytes) override {
        if (!bytes || dst == src) return;
        use();
        ++work_.copies;
        CUDA_CHECK(ordinal(), cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream(s)));
    }

    Event event_create(bool timing) override {
        use();
        cudaEvent_t e;
        CUDA_CHECK(ordinal(), cudaEventCreateWithFlags(&e, timing ? cudaEventDefault : cudaEventDisableTiming));
        return Event{e};
    }
    void event_destroy(Event e) noexcept override {
        if (e.handle) cudaEventDestroy(static_cast<cudaEvent_t>(e.handle));
    }
    void event_record(Event e, Stream s) override {
        use();
        ++work_.event_records;
        CUDA_CHECK(ordinal(), cudaEventRecord(event(e), stream(s)));
    }
    void stream_wait_event(Stream s, Event e) override {
        use();
        ++work_.stream_waits;
        CUDA_CHECK(ordinal(), cudaStreamWaitEvent(stream(s), event(e), 0));
    }
    bool event_query(Event e) override { return CUDA_QUERY(ordinal(), cudaEventQuery(event(e))); }
    void event_synchronize(Event e) override {
        ++work_.host_syncs;
        CUDA_CHECK(ordinal(), cudaEventSynchronize(event(e)));
    }
    void stream_synchronize(Stream s) override {
        ++work_.host_syncs;
        CUDA_CHECK(ordinal(), cudaStreamSynchronize(stream(s)));
    }
    void synchronize() override {
        for (Stream s : {compute_, comm_, copy_, Stream{staging_stream_}}) stream_synchronize(s);
    }
    bool query_idle() override {
        use();
        bool idle = true;
        for (cudaStream_t st : {stream(compute_), stream(comm_), stream(copy_), staging_stream_})
            idle = CUDA_QUERY(ordinal(), cudaStreamQuery(st)) && idle;  // a sticky error surfaces here
        return idle;
    }
    void abandon() noexcept override { abandoned_ = true; }
    float event_elapsed_ms(Event a, Event b) override {
        float ms = 0.0f;
        CUDA_CHECK(ordinal(), cudaEventElapsedTime(&ms, event(a), event(b)));
        return ms;
    }
    void host_callback(Stream s, void (*fn)(void*), void* arg) override {
        use();
        ++work_.callbacks;
        CUDA_CHECK(ordinal(), cudaLaunchHostFunc(stream(s), fn, arg));
    }
    // Relaxed mode: the replica threads issue into their own devices' streams while replica 0's
    // stream captures, and nothing they do outside the capture is refused.
    uint64_t capture_id(Stream s) const override {
        cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
        unsigned long long id = 0;
        CUDA_CHECK(ordinal(), cudaStreamGetCaptureInfo(stream(s), &status, &id));
        return status == cudaStreamCaptureStatusActive ? uint64_t(id) : 0;
    }
    void capture_begin(Stream s) override {
        use();
        CUDA_CHECK(ordinal(), cudaStreamBeginCapture(stream(s), cudaStreamCaptureModeRelaxed));
    }
    Graph capture_end(Stream s) override {
        use();
        cudaGraph_t graph = nullptr;
        CUDA_CHECK(ordinal(), cudaStreamEndCapture(stream(s), &graph));
        cudaGraphExec_t exec = nullptr;
        const cudaError_t err = cudaGraphInstantiate(&exec, graph, 0);
        cudaGraphDestroy(graph);
        CUDA_CHECK_AS(ordinal(), "cudaGraphInstantiate(&exec, graph, 0)", err);
        return Graph{exec};
    }
    void graph_launch(Graph g, Stream s) override {
        use();
        ++work_.graph_launches;
        CUDA_CHECK(ordinal(), cudaGraphLaunch(static_cast<cudaGraphExec_t>(g.handle), stream(s)));
    }
    void graph_destroy(Graph g) noexcept override {
        if (!g.handle || abandoned_) return;
        cudaSetDevice(ordinal());
        cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(g.handle));
    }

    void set_precision(Precision p) override { precision_ = p; }

    // The fused products get their own cuBLASLt handle and workspace (allocated here, before any
    // step); like cuBLAS's, they serve the compute stream alone.
    void set_fused_epilogues(bool on) override {
        Device::set_fused_epilogues(on);
        if (!on || fused_) return;
        use();
        fused_workspace_ = alloc_bytes(kCublasWorkspace);
        fused_ = std::make_unique<FusedGemm>(ordinal(), fused_workspace_, kCublasWorkspace);
    }
    // An op family's launcher (kernels/ops/): its stream, this GPU current, the scratch, and on
    // the compute stream the products' handles (every product runs there: two streams sharing one
    // cuBLAS workspace would race on it).
    NativeLaunch native_launch(Stream s) override {
        use();
        const bool compute = s.handle == compute_.handle;
        return {s.handle,
                ordinal(),
                act_dtype(),
                scratch_,
                compute ? cublas_ : nullptr,
                compute ? fused_.get() : nullptr,
                precision_ == Precision::tf32};
    }

    // The column reductions: one or two kernels, as the shape decides (column_plan.h).

    void reduce_from_peer(Stream s, void* dst, const Device& peer, const void* src, DType t, size_t n) override {
        use();
        const int p = require_cuda(peer);
        check_wire_dtype(*this, t);
        bool can_load = p == ordinal();
        {
            std::lock_guard<std::mutex> lock(g_peer_mutex);
            can_load = can_load || g_peer_enabled[ordinal()][p];
        }
        const PeerTransport transport = peer_transport();
        if (transport == PeerTransport::direct && !can_load)
            throw DeviceError(name() + ": direct peer loads from cuda:" + std::to_string(p) + " need peer access");
        // One kernel loads the peer's memory and adds (always for a local add: staging's own).
        if (&peer == this || (can_load && transport != PeerTransport::staged)) {
            ++work_.launches;
            if (t == DType::bf16) cuda::add(stream(s), ordinal(), DType::bf16, n, src, dst);
            else cuda::add_inplace(stream(s), ordinal(), n, static_cast<const float*>(src), static_cast<float*>(dst));
            return;
        }
        staging_->reduce(s, dst, peer, src, t, n);
    }
    void copy_from_peer(Stream s, void* dst, const Device& peer, const void* src, size_t bytes) override {
        if (!bytes) return;
        use();
        const int p = require_cuda(peer);
        ++work_.copies;
        CUDA_CHECK(ordinal(), cudaMemcpyPeerAsync(dst, ordinal(), src, p, bytes, stream(s)));
    }
    bool can_load_from(const Device& peer) const override {
        if (peer.type() != DeviceType::cuda) return false;
        if (peer.ordinal() == ordinal()) return true;
        std::lock_guard<std::mutex> lock(g_peer_mutex);
        return g_peer_enabled[ordinal()][peer.ordinal()];
    }

private:
    void use() const { CUDA_CHECK(ordinal(), cudaSetDevice(ordinal())); }
    static cudaStream_t stream(Stream s) { return static_cast<cudaStream_t>(s.handle); }
    static cudaEvent_t event(Event e) { return static_cast<cudaEvent_t>(e.handle); }
    int require_cuda(const Device& peer) const {
        if (peer.type() != DeviceType::cuda)
            throw DeviceError(name() + ": cannot exchange data with " + peer.name() +
                              " (replicas must all be of one kind)");
        return peer.ordinal();
    }

    cublasHandle_t cublas_ = nullptr;
    void* workspace_ = nullptr;
    std::unique_ptr<FusedGemm> fused_;  // strategy.fused_epilogues
    void* fused_workspace_ = nullptr;
    float* scratch_ = nullptr;  // compute-stream ops only
    cudaStream_t staging_stream_ = nullptr;
    std::unique_ptr<PeerStaging> staging_;
    cudaDeviceProp props_{};
};

// ---- NVML, loaded at run time so the binary starts on machines without a driver --------------
struct Nvml {
    using Handle = void*;
    int (*init)() = nullptr;
    int (*by_bus_id)(const char*, Handle*) = nullptr;
    int (*p2p_status)(Handle, Handle, int, int*) = nullptr;
    int (*common_ancestor)(Handle, Handle, int*) = nullptr;
    bool ok = false;
    Nvml() {
        void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
        if (!lib) return;
        init = reinterpret_cast<int (*)()>(dlsym(lib, "nvmlInit_v2"));
        by_bus_id = reinterpret_cast<int (*)(const char*, Handle*)>(dlsym(lib, "nvmlDeviceGetHandleByPciBusId_v2"));
        p2p_status = reinterpret_cast<int (*)(Handle, Handle, int, int*)>(dlsym(lib, "nvmlDeviceGetP2PStatus"));
        common_ancestor =
            reinterpret_cast<int (*)(Handle, Handle, int*)>(dlsym(lib, "nvmlDeviceGetTopologyCommonAncestor"));
        ok = init && by_bus_id && p2p_status && common_ancestor && init() == 0;
    }
};

std::string link_name(const Nvml& nvml, int a, int b) {
    if (!nvml.ok) return "unknown";
    char ba[32], bb[32];
    if (cudaDeviceGetPCIBusId(ba, sizeof ba, a) != cudaSuccess ||
        cudaDeviceGetPCIBusId(bb, sizeof bb, b) != cudaSuccess)
        return "unknown";
    Nvml::Handle ha, hb;
    if (nvml.by_bus_id(ba, &ha) != 0 || nvml.by_bus_id(bb, &hb) != 0) return "unknown";
    constexpr int kCapsNvlink = 2, kStatusOk = 0;
    int status = -1;
    if (nvml.p2p_status(ha, hb, kCapsNvlink, &status) == 0 && status == kStatusOk) return "NVLink";
    int level = -1;
    if (nvml.common_ancestor(ha, hb, &level) != 0) return "PCIe";
    switch (level) {
        case 0:
            return "same board";
        case 10:
            return "PCIe, one switch";
        case 20:
            return "PCIe, several switches";
        case 30:
            return "PCIe, host bridge";
        case 40:
            return "PCIe, across host bridges";
        case 50:
            return "PCIe + CPU interconnect (SMP)";
        default:
            return "PCIe";
    }
}

CudaStatus probe_cuda() {
    CudaStatus st;
    int n = 0, driver = 0, runtime = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    cudaDriverGetVersion(&driver);
    cudaRuntimeGetVersion(&runtime);
    cudaGetLastError();
    if (e == cudaSuccess && n > 0) {
        st.state = CudaStatus::State::ok;
        st.devices = n;
        return st;
    }
    if (driver == 0) {
        st.state = CudaStatus::State::no_driver;
        st.reason = "no NVIDIA driver is loaded";
    } else if (e == cudaSuccess || e == cudaErrorNoDevice) {
        st.state = CudaStatus::State::no_device;
        const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
        st.reason = std::string("the NVIDIA driver sees no CUDA device") +
                    (visible ? " (CUDA_VISIBLE_DEVICES=" + std::string(visible) + ")" : "");
    } else if (e == cudaErrorInsufficientDriver) {
        st.state = CudaStatus::State::unusable;
        st.reason = "the NVIDIA driver supports CUDA " + cuda_version_text(driver) + ", but this build needs CUDA " +
                    cuda_version_text(runtime) +
                    ": install a newer NVIDIA driver (580 or newer for CUDA 13.0), "
                    "or rebuild with the CUDA toolkit the driver supports";
    } else {
        st.state = CudaStatus::State::unusable;
        st.reason = std::string("the CUDA runtime failed to start: ") + cudaGetErrorString(e) + " (driver for CUDA " +
                    cuda_version_text(driver) + ", runtime " + cuda_version_text(runtime) +
                    "): check that the NVIDIA kernel module is loaded (nvidia-smi) and matches the driver libraries";
    }
    return st;
}

}  // namespace

bool cuda_compiled() { return true; }

CudaStatus cuda_status() {
    static const CudaStatus status = probe_cuda();
    return status;
}

int cuda_device_count() { return cuda_status().devices; }

std::string cuda_unavailable_reason() { return cuda_status().reason; }

std::unique_ptr<Device> make_cuda_device(int ordinal) { return std::make_unique<CudaDevice>(ordinal); }

uint64_t cuda_free_memory(int ordinal) {
    if (ordinal < 0 || ordinal >= cuda_device_count() || cudaSetDevice(ordinal) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return free_b;
}

CudaVersions cuda_versions() {
    CudaVersions v;
    // A call that fails leaves its version 0 ("none"): asking must never fail a command.
    if (cudaRuntimeGetVersion(&v.runtime) != cudaSuccess) v.runtime = 0;
    if (cudaDriverGetVersion(&v.driver) != cudaSuccess) v.driver = 0;
    int major = 0, minor = 0, patch = 0;
    if (cublasGetProperty(MAJOR_VERSION, &major) == CUBLAS_STATUS_SUCCESS &&
        cublasGetProperty(MINOR_VERSION, &minor) == CUBLAS_STATUS_SUCCESS &&
        cublasGetProperty(PATCH_LEVEL, &patch) == CUBLAS_STATUS_SUCCESS)
        v.cublas = major * 10000 + minor * 100 + patch;
#if MIRRORED_NCCL
    if (ncclGetVersion(&v.nccl) != ncclSuccess) v.nccl = 0;
#endif
    cudaGetLastError();  // a failed query must not be reported by the next checked call
    return v;
}

CudaTopology cuda_topology() {
    CudaTopology t;
    const int n = cuda_device_count();
    const Nvml nvml;
    for (int i = 0; i < n; ++i) {
        cudaDeviceProp p{};
        CUDA_CHECK(i, cudaGetDeviceProperties(&p, i));
        t.devices.push_back({i, p.name, p.totalGlobalMem, p.major, p.minor, p.multiProcessorCount});
    }
    t.peer_access.assign(n, std::vector<int>(n, 0));
    t.perf_rank.assign(n, std::vector<int>(n, -1));
    t.link.assign(n, std::vector<std::string>(n, "-"));
    for (int i = 0; i < n; ++i)
        for (int j = 0; j < n; ++j) {
            if (i == j) continue;
            CUDA_CHECK(i, cudaDeviceCanAccessPeer(&t.peer_access[i][j], i, j));
            int rank = -1;
            if (cudaDeviceGetP2PAttribute(&rank, cudaDevP2PAttrPerformanceRank, i, j) == cudaSuccess)
                t.perf_rank[i][j] = rank;
            else cudaGetLastError();
            t.link[i][j] = link_name(nvml, i, j);
        }
    return t;
}

namespace {

// A board may report peer access and still corrupt peer traffic (an IOMMU or PCIe ACS between the
// GPUs): before any gradient crosses a link, 4 MiB of a known pattern cross it (GPU b's memory
// read by GPU a, as the ring reads), and come back to be compared. Start-up only; synchronous.
bool peer_link_corrupts(int a, int b) {
    constexpr size_t kWords = size_t(1) << 20, kBytes = kWords * sizeof(uint32_t);
    std::vector<uint32_t> pattern(kWords), back(kWords, 0);
    for (size_t i = 0; i < kWords; ++i) pattern[i] = uint32_t(i * 2654435761u) ^ uint32_t(a << 24 | b << 16);
    void *on_a = nullptr, *on_b = nullptr;
    cudaStream_t s_a = nullptr, s_b = nullptr;
    CUDA_CHECK(b, cudaSetDevice(b));
    CUDA_CHECK(b, cudaMalloc(&on_b, kBytes));
    CUDA_CHECK(b, cudaStreamCreateWithFlags(&s_b, cudaStreamNonBlocking));
    CUDA_CHECK(b, cudaMemcpyAsync(on_b, pattern.data(), kBytes, cudaMemcpyHostToDevice, s_b));
    CUDA_CHECK(b, cudaStreamSynchronize(s_b));
    CUDA_CHECK(a, cudaSetDevice(a));
    CUDA_CHECK(a, cudaMalloc(&on_a, kBytes));
    CUDA_CHECK(a, cudaStreamCreateWithFlags(&s_a, cudaStreamNonBlocking));
    CUDA_CHECK(a, cudaMemsetAsync(on_a, 0, kBytes, s_a));
    CUDA_CHECK(a, cudaMemcpyPeerAsync(on_a, a, on_b, b, kBytes, s_a));
    CUDA_CHECK(a, cudaMemcpyAsync(back.data(), on_a, kBytes, cudaMemcpyDeviceToHost, s_a));
    CUDA_CHECK(a, cudaStreamSynchronize(s_a));
    CUDA_CHECK(a, cudaStreamDestroy(s_a));
    CUDA_CHECK(a, cudaFree(on_a));
    CUDA_CHECK(b, cudaSetDevice(b));
    CUDA_CHECK(b, cudaStreamDestroy(s_b));
    CUDA_CHECK(b, cudaFree(on_b));
    return back != pattern;
}

}  // namespace

std::vector<StagedPair> cuda_enable_peer_access(const std::vector<int>& ordinals) {
    std::lock_guard<std::mutex> lock(g_peer_mutex);
    std::vector<int> unique(ordinals);
    std::sort(unique.begin(), unique.end());
    unique.erase(std::unique(unique.begin(), unique.end()), unique.end());
    std::vector<StagedPair> staged;
    for (int a : unique)
        for (int b : unique) {
            if (a == b || a >= kMaxGpus || b >= kMaxGpus || g_peer_enabled[a][b]) continue;
            int can = 0;
            CUDA_CHECK(a, cudaDeviceCanAccessPeer(&can, a, b));
            if (!can) {
                staged.push_back({a, b, "no peer access between these GPUs (cudaDeviceCanAccessPeer)"});
                continue;
            }
            CUDA_CHECK(a, cudaSetDevice(a));
            const cudaError_t e = cudaDeviceEnablePeerAccess(b, 0);
            if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled) {
                // e.g. too many peers (cudaErrorTooManyPeers) or an IOMMU refusing the mapping
                staged.push_back({a, b, std::string("cudaDeviceEnablePeerAccess failed: ") + cudaGetErrorString(e)});
                cudaGetLastError();
                continue;
            }
            cudaGetLastError();  // clear "already enabled"
            if (peer_link_corrupts(a, b)) {
                CUDA_CHECK(a, cudaSetDevice(a));
                CUDA_CHECK(a, cudaDeviceDisablePeerAccess(b));
                staged.push_back({a, b,
                                  "peer copies from cuda:" + std::to_string(b) + " to cuda:" + std::to_string(a) +
                                      " came back corrupted in the start-up self-test (an IOMMU or PCIe ACS "
                                      "setting?); staged through the host instead"});
                continue;
            }
            g_peer_enabled[a][b] = true;
        }
    return staged;
}

}  // namespace mirrored
