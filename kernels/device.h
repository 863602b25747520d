// The op interface: everything a replica does to memory goes through a Device.
// Three implementations: kernels/cpu (the reference: OpenBLAS + plain loops), kernels/cuda
// (cuBLAS + own kernels), and kernels/sim (a simulated GPU: CUDA's stream, event, copy and
// callback semantics on CPU threads, computing with the CPU reference - so the asynchronous host
// logic the CUDA path depends on is tested without a GPU), registered as backends by name with
// their devices-spec parser (kernels/backends.cpp). Ops move out of this interface into families
// (kernels/ops/: each family's CPU loops and CUDA kernels side by side), which reach a device
// through launch_host and native_launch. Code above kernels/ sees only the headers at this
// folder's top (this one, buffer.h, chunks.h, nccl.h, blas.h, op_math.h) and kernels/ops/*.h, and asks a
// backend's DeviceTraits what differs between kinds of device, never its type.
//
// Conventions
// - Matrices are row-major. gemm computes C[M,N] = alpha * op(A)[M,K] * op(B)[K,N] + beta * C.
// - Every op is asynchronous on the Stream it is given (CPU ops run to completion on the calling
//   thread; the stream is ignored). Nothing here synchronizes the host unless its name says so.
//   Copies from or to host memory that alloc_host_bytes did not return (pageable memory) follow
//   cudaMemcpyAsync: host-to-device takes a snapshot before returning, device-to-host returns
//   once the copy is done.
// - Ops never allocate; scratch space is sized once when a Device is created.
// - Reductions are deterministic: a fixed order, no floating-point atomics.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <string>
#include <vector>

#include "base/host_device.h"
#include "base/registry.h"

namespace mirrored {

enum class DeviceType { cpu, cuda, sim };
const char* device_type_name(DeviceType t);  // "cpu", "cuda", "sim"

// Opaque handles: cudaStream_t / cudaEvent_t on CUDA, unused on CPU.
struct Stream {
    void* handle = nullptr;
};
struct Event {
    void* handle = nullptr;
};
struct Graph {
    void* handle = nullptr;
};  // an instantiated capture (cudaGraphExec_t on CUDA)

// gelu: x Phi(x) with the exact normal cdf (torch.nn.GELU()); gelu_tanh: GPT-2's tanh approximation
// (torch.nn.GELU(approximate="tanh")).
enum class Activation { none, relu, gelu, gelu_tanh };
// Whether a layer keeps the pre-activation for backward: ReLU's gradient reads the output itself.
inline bool keeps_preactivation(Activation a) { return a == Activation::gelu || a == Activation::gelu_tanh; }

// The losses of target_loss (kernels/ops/losses.h): logits against a float target per output.
enum class TargetLoss {
    mse,  // (z - t)^2: torch.nn.MSELoss
    bce,  // binary cross-entropy of sigmoid(z): torch.nn.BCEWithLogitsLoss
};

// Element types of device buffers. f32 for parameters, gradients and optimizer state; activations
// may be bf16 or f16 (Device::act_dtype).
enum class DType : uint8_t { f32, bf16, f16 };
inline size_t dtype_size(DType t) { return t == DType::f32 ? 4 : 2; }
const char* dtype_name(DType t);

// train.precision: fp32; tf32 (f32 storage, TF32 tensor-core GEMMs on CUDA); bf16 and fp16
// (16-bit activations and weight copies, f32 master weights; fp16 with dynamic loss scaling).
enum class Precision { fp32, tf32, bf16, fp16 };
inline DType precision_dtype(Precision p) {
    return p == Precision::bf16 ? DType::bf16 : p == Precision::fp16 ? DType::f16 : DType::f32;
}
const char* precision_name(Precision p);

// Every replica's buffer of one all-reduce, for the ops that read them all.
struct PeerBuffers {
    static constexpr int kMax = 16;
    void* ptr[kMax] = {};
    int count = 0;
};

struct GemmTypes {
    DType a = DType::f32, b = DType::f32, c = DType::f32;
};

// A 2-D window op over NHWC images [n, h, w, c]: kernel, stride, and zero padding on each side.
struct Window2d {
    int n = 0, h = 0, w = 0, c = 0;
    int kh = 1, kw = 1, sh = 1, sw = 1, ph = 0, pw = 0;
    // im2col/col2im only: the column index runs over (ky, kx, channel) - whole pixels, copied -
    // instead of (channel, ky, kx) (Device::pixel_major_columns says which a device prefers).
    bool pixel_major = false;
    MIRRORED_HD int oh() const { return (h + 2 * ph - kh) / sh + 1; }
    MIRRORED_HD int ow() const { return (w + 2 * pw - kw) / sw + 1; }
    // f(iy, ix, ky, kx) for every input position window (oy, ox) reads, in (ky, kx) order;
    // positions in the padding are skipped.
    template <typename F>
    MIRRORED_HD void for_each_input(int oy, int ox, F&& f) const {
        for (int ky = 0; ky < kh; ++ky) {
            const int iy = oy * sh + ky - ph;
            if (iy < 0 || iy >= h) continue;
            for (int kx = 0; kx < kw; ++kx) {
                const int ix = ox * sw + kx - pw;
                if (ix >= 0 && ix < w) f(iy, ix, ky, kx);
            }
        }
    }
    // f(oy, ox, ky, kx) for every window that reads input position (iy, ix), in (ky, kx) order:
    // the gather form of the backward passes (each input sums its windows, no atomics).
    template <typename F>
    MIRRORED_HD void for_each_window(int iy, int ix, F&& f) const {
        const int out_h = oh(), out_w = ow();
        for (int ky = 0; ky < kh; ++ky) {
            const int ty = iy + ph - ky;
            if (ty < 0 || ty % sh || ty / sh >= out_h) continue;
            for (int kx = 0; kx < kw; ++kx) {
                const int tx = ix + pw - kx;
                if (tx < 0 || tx % sw || tx / sw >= out_w) continue;
                f(ty / sh, tx / sw, ky, kx);
            }
        }
    }
};
enum class PoolKind { max, average };

// Batch statistics of c channels over `count` values; `weight` scales the running-statistics
// contributions (1 / (replicas x micro-batches): their sum over a step is the mean).
struct BnStats {
    int channels = 0;
    double count = 0;
    float eps = 1e-5f;
    float weight = 1.0f;
};
// gpt2_normal: normal with standard deviation 0.02, as GPT-2 initialises every matrix and embedding.
enum class InitKind { zeros, he_uniform, he_normal, glorot_uniform, glorot_normal, ones, gpt2_normal };

const char* activation_name(Activation a);
const char* init_kind_name(InitKind k);

// Parameter initialisation: element i of a tensor is a pure function of (seed, tensor_id, i)
// (Philox4x32-10), so every device produces the same weights.
struct InitArgs {
    InitKind kind = InitKind::zeros;
    uint64_t seed = 0;
    uint32_t tensor_id = 0;
    int fan_in = 1;
    int fan_out = 1;
};

// What changes from one step to the next, in device memory: a captured step (strategy.cuda_graph)
// replays unchanged while the host copies each step's values in before its launch. Ops given a
// pointer to these read them instead of their arguments' host values; the host computes them
// exactly as it computes those values, so both paths give the same bits.
struct StepValues {
    float lr = 0.0f;
    float adamw_bc1 = 1.0f, adamw_bc2_sqrt = 1.0f;  // AdamW bias corrections of this step
    uint32_t step = 0;                              // dropout masks' step
};

// Dropout mask element (row, col) is a pure function of (seed, layer_id, step, global row, col):
// a replica passes the offset of its shard in the global batch, so N replicas draw exactly the
// masks one replica would draw for the same global batch.
struct DropoutArgs {
    float rate = 0.0f;
    uint64_t seed = 0;
    uint32_t layer_id = 0;
    uint32_t step = 0;
    int64_t row_offset = 0;
    const StepValues* values = nullptr;  // device: the step from here
};

// Hyper-parameters of one optimizer step. When clip_norm > 0 the update scales gradients by
// min(1, clip_norm / norm) with the norm read on the device, so clipping needs no host round trip.
// grad_stats (device memory, may be null) is sum_squares' output over the gradients: [squared
// norm of the unscaled gradients, non-finite count]. loss_scale (device, may be null): gradients
// are divided by it. skip_nonfinite: a non-finite gradient anywhere leaves everything unchanged
// (fp16 loss scaling skips the step).
struct SgdArgs {
    float lr = 0.01f;
    float momentum = 0.0f;
    float weight_decay = 0.0f;  // L2, added to the gradient (PyTorch SGD)
    bool nesterov = false;
    float clip_norm = 0.0f;
    const float* grad_stats = nullptr;
    const float* loss_scale = nullptr;
    bool skip_nonfinite = false;
    const StepValues* values = nullptr;  // device: lr from here
};

struct AdamWArgs {
    float lr = 1e-3f;
    float beta1 = 0.9f;
    float beta2 = 0.999f;
    float eps = 1e-8f;
    float weight_decay = 0.0f;  // decoupled (PyTorch AdamW)
    int64_t step = 1;           // 1-based, for bias correction
    float clip_norm = 0.0f;
    const float* grad_stats = nullptr;
    const float* loss_scale = nullptr;
    bool skip_nonfinite = false;
    const StepValues* values = nullptr;  // device: lr and the bias corrections from here
};

// metrics accumulated on the device by softmax_xent, read by the host only when logging. Double,
// so that sample counts stay exact far beyond 2^24.
enum MetricSlot { kMetricLossSum = 0, kMetricCorrect = 1, kMetricCount = 2, kMetricSlots = 4 };

// Calls the host made on a device since it was created: what a step costs the host.
struct HostWork {
    uint64_t launches = 0;  // kernels and library calls (GEMM)
    uint64_t copies = 0;    // memory copies
    uint64_t event_records = 0;
    uint64_t stream_waits = 0;    // cross-stream waits on events
    uint64_t host_syncs = 0;      // host waits for a device (synchronize, event/stream sync)
    uint64_t callbacks = 0;       // host functions enqueued on a stream
    uint64_t graph_launches = 0;  // captured graphs replayed
    HostWork& operator+=(const HostWork& o) {
        launches += o.launches, copies += o.copies, event_records += o.event_records, stream_waits += o.stream_waits;
        host_syncs += o.host_syncs, callbacks += o.callbacks, graph_launches += o.graph_launches;
        return *this;
    }
    HostWork operator-(const HostWork& o) const {
        return {launches - o.launches,
                copies - o.copies,
                event_records - o.event_records,
                stream_waits - o.stream_waits,
                host_syncs - o.host_syncs,
                callbacks - o.callbacks,
                graph_launches - o.graph_launches};
    }
    uint64_t total() const {
        return launches + copies + event_records + stream_waits + host_syncs + callbacks + graph_launches;
    }
};

struct DeviceTraits;

class Device {
public:
    virtual ~Device() = default;
    Device(const Device&) = delete;
    Device& operator=(const Device&) = delete;

    DeviceType type() const { return type_; }
    const DeviceTraits& traits() const;  // its backend's
    // Streams are real queues that run behind the host (CUDA, sim); on CPU they are the caller.
    bool asynchronous() const;                         // traits().asynchronous
    int ordinal() const { return ordinal_; }           // GPU ordinal (CUDA, sim); replica index on CPU
    const std::string& name() const { return name_; }  // "cuda:0", "cpu:1"
    virtual std::string description() const = 0;       // model name, memory

    // ---- memory -----------------------------------------------------------------------
    virtual void* alloc_bytes(size_t bytes) = 0;  // throws DeviceError naming the device and size
    virtual void free_bytes(void* p) noexcept = 0;
    virtual void* alloc_host_bytes(size_t bytes) = 0;  // pinned where the device benefits
    virtual void free_host_bytes(void* p) noexcept = 0;
    virtual void copy_to_device(Stream s, void* dst, const void* host_src, size_t bytes) = 0;
    virtual void copy_to_host(Stream s, void* host_dst, const void* src, size_t bytes) = 0;
    virtual void copy_on_device(Stream s, void* dst, const void* src, size_t bytes) = 0;

    // ---- streams and events -----------------------------------------------------------
    Stream compute_stream() const { return compute_; }
    Stream comm_stream() const { return comm_; }
    Stream copy_stream() const { return copy_; }
    virtual Event event_create(bool timing = false) = 0;
    virtual void event_destroy(Event e) noexcept = 0;
    virtual void event_record(Event e, Stream s) = 0;
    virtual void stream_wait_event(Stream s, Event e) = 0;  // e may belong to another device
    virtual bool event_query(Event e) = 0;                  // complete? never blocks
    virtual void event_synchronize(Event e) = 0;            // host waits
    virtual void stream_synchronize(Stream s) = 0;          // host waits
    virtual void synchronize() = 0;                         // host waits for all streams
    // Never blocks: has every stream finished its work? Throws DeviceError when the device has
    // failed (a sticky error such as an illegal address), so polling it surfaces the failure.
    virtual bool query_idle() = 0;
    // After a failure anywhere: stop waiting for this device. Queued work may be dropped, and
    // destruction no longer synchronizes (a failed peer may hold this device's streams forever).
    virtual void abandon() noexcept = 0;
    bool abandoned() const { return abandoned_; }
    virtual float event_elapsed_ms(Event start, Event end) = 0;  // both complete; 0 on CPU
    // Run fn(arg) on a host thread once all prior work on s is done (CPU: at once).
    virtual void host_callback(Stream s, void (*fn)(void*), void* arg) = 0;

    // ---- graphs: work captured once, replayed with one host call ---------------------------
    // Stream capture with CUDA's relaxed-mode rules. Between capture_begin(s) and capture_end(s),
    // work issued on s - and on any stream, of this or another device, that waits on an event
    // recorded in the capture (it joins the capture) - is recorded instead of run. Every joined
    // stream must join back (an event recorded on it that s waits on, directly or through other
    // joined streams) before capture_end, which returns the graph ready to launch. Inside a
    // capture a captured stream may not synchronise the host, copy from or to pageable host
    // memory, or wait on an event recorded outside the capture: each throws DeviceError and
    // invalidates the capture. graph_launch(g, s) runs the graph once after s's earlier work and
    // before its later work; its nodes are ordered only by the captured dependencies, not by the
    // streams they were captured from. Devices without graphs (CPU) throw DeviceError.
    bool supports_graphs() const;  // traits().graphs
    // The capture sequence s is part of (unique per capture), 0 when s is not being captured.
    virtual uint64_t capture_id(Stream) const { return 0; }
    virtual void capture_begin(Stream s);
    virtual Graph capture_end(Stream s);
    virtual void graph_launch(Graph g, Stream s);
    virtual void graph_destroy(Graph) noexcept {}

    // ---- where an op family's work runs (kernels/ops/: its CPU loops and CUDA kernels) ------
    // A family's op is a function of the device: on a CUDA device it calls its launcher with
    // native_launch(s) and counts the kernels launched (note_launches); elsewhere it runs its CPU
    // loops through run_on_host (below): at once on a CPU replica's own thread, in stream order on
    // a simulated GPU's stream thread, so the simulated GPU needs no code of its own per op.
    bool runs_cuda_kernels() const { return type_ == DeviceType::cuda; }
    // `host` is the device whose values the loops compute (its value_dtype rounds what they store).
    using HostOp = std::function<void(const Device& host)>;
    virtual void launch_host(Stream s, const char* op, HostOp work);  // DeviceError on CUDA
    struct NativeLaunch {
        void* stream = nullptr;    // cudaStream_t
        int device = 0;            // the GPU, named in errors
        DType act = DType::f32;    // the activations' storage type
        float* scratch = nullptr;  // the compute stream's scratch (kernels/cuda/cuda_kernels.h)
        // The products' (kernels/ops/gemm.h): cuBLAS's handle with its workspace, bound to the
        // compute stream - null on every other stream -, cuBLASLt's fused products where
        // set_fused_epilogues(true), and whether f32 products may use TF32.
        void* blas = nullptr;        // cublasHandle_t
        void* fused_gemm = nullptr;  // FusedGemm (kernels/cuda/fused_gemm.h)
        bool tf32 = false;
    };
    virtual NativeLaunch native_launch(Stream s);  // makes the GPU current; DeviceError off CUDA
    void note_launches(int kernels) { work_.launches += uint64_t(kernels); }

    // ---- precision ----------------------------------------------------------------------
    // Activations (and the compute copy of the weights) are stored in act_dtype(): the
    // precision's own type on CUDA (half the memory for bf16/fp16); f32 on CPU and sim, which
    // round every stored activation to value_dtype() at the same points instead, so precision
    // behaviour is testable without a GPU. GEMMs accumulate in f32; parameters, gradients and
    // optimizer state are always f32.
    virtual void set_precision(Precision p) = 0;
    Precision precision() const { return precision_; }
    DType value_dtype() const { return precision_dtype(precision_); }
    DType act_dtype() const;  // value_dtype() where traits().stores_16bit, else f32
    size_t act_bytes(size_t elements) const { return elements * dtype_size(act_dtype()); }

    // ---- products (kernels/ops/gemm.h) ------------------------------------------------------
    // Off by default: the fused products have not yet run on a GPU (strategy.fused_epilogues).
    // CUDA makes its cuBLASLt handle and workspace here, before any step.
    virtual void set_fused_epilogues(bool on) { fused_epilogues_ = on; }
    bool fused_epilogues() const { return fused_epilogues_; }

    // ---- convolutional networks (their ops: kernels/ops/conv.h) ----------------------------
    // Whether convolutions should use pixel-major columns (Window2d::pixel_major) and weights
    // permuted to match: on the CPU a column row is then whole pixels copied, not a transpose.
    // The conv layer permutes with nhwc_to_nchw, so a device saying yes stores activations as f32.
    bool pixel_major_columns() const { return pixel_major_columns_; }
    // Bytes of im2col columns a convolution should make and multiply at a time (whole images),
    // and of attention probabilities (whole samples): 0, the whole batch in one product (GPUs); a
    // cache's worth on CPUs, whose products would otherwise stream a batch's through memory.
    size_t column_block_bytes() const;  // traits().column_block_bytes
    // Whole images per block of columns of `image_bytes` each, out of `rows`: what a convolution
    // multiplies at a time and the activations' scratch is sized for.
    static int column_block_images(size_t image_bytes, size_t block_bytes, int rows) {
        rows = std::max(rows, 1);
        if (block_bytes == 0) return rows;
        return int(std::clamp<size_t>(block_bytes / std::max<size_t>(image_bytes, 1), 1, size_t(rows)));
    }

    // ---- cross-replica ops (peer is a device of the same type) ---------------------------
    // dst[0..n) += src[0..n), where src lives on peer, elementwise in type t: f32, or bf16 (the
    // all-reduce's wire format, strategy.allreduce_dtype) held in 16-bit storage on every backend,
    // added in f32 and rounded once to nearest even. Bit-identical on every device type.
    virtual void reduce_from_peer(Stream s, void* dst, const Device& peer, const void* src, DType t, size_t n) = 0;
    virtual void copy_from_peer(Stream s, void* dst, const Device& peer, const void* src, size_t bytes) = 0;
    // (the sums over every replica's buffer in one kernel: kernels/ops/peer_sums.h)
    // Can kernels on this device load (and store) peer's memory directly?
    virtual bool can_load_from(const Device& peer) const = 0;

    HostWork host_work() const { return work_; }  // read by the replica's own thread

    // Device memory this Device holds through alloc_bytes, now and at most, measured from its own
    // allocations; and what the whole GPU has in use (CUDA: cudaMemGetInfo, the context and
    // libraries included; elsewhere the same as allocated_bytes).
    uint64_t allocated_bytes() const { return uint64_t(allocated_.load()); }
    uint64_t peak_allocated_bytes() const { return uint64_t(peak_.load()); }
    virtual uint64_t memory_in_use() const { return allocated_bytes(); }

protected:
    Device(DeviceType type, int ordinal, std::string name) : type_(type), ordinal_(ordinal), name_(std::move(name)) {}
    Stream compute_, comm_, copy_;
    HostWork work_;  // implementations count what the host issues
    Precision precision_ = Precision::fp32;
    bool fused_epilogues_ = false;
    bool pixel_major_columns_ = false;  // set by the backend, once, as it is made
    // Implementations report every alloc_bytes / free_bytes here.
    void note_alloc(void* p, size_t bytes);
    void note_free(void* p) noexcept;
    std::atomic<bool> abandoned_{false};

private:
    std::atomic<int64_t> allocated_{0}, peak_{0};
    std::mutex sizes_mu_;
    std::unordered_map<void*, size_t> sizes_;

private:
    DeviceType type_;
    int ordinal_;
    std::string name_;
};

// Runs an op family's CPU loops on d in s's order (Device::launch_host): a CPU replica calls them
// at once, without the type-erased copy a queued task needs.
template <typename Work>
void run_on_host(Device& d, Stream s, const char* op, Work&& work) {
    if (!d.asynchronous()) work(static_cast<const Device&>(d));
    else d.launch_host(s, op, Device::HostOp(std::forward<Work>(work)));
}

// Runs an op family's CUDA launcher on d and counts the kernels it returns having launched; a
// DeviceError naming the op where this build has no launcher for it.
[[noreturn]] void missing_cuda_kernel(const Device& d, const char* op);
template <typename Launcher, typename... Args>
void launch_cuda(Device& d, Stream s, Launcher* launcher, const char* op, Args&&... args) {
    if (!launcher) missing_cuda_kernel(d, op);
    d.note_launches(launcher(d.native_launch(s), std::forward<Args>(args)...));
}

// ---- factories --------------------------------------------------------------------------
std::unique_ptr<Device> make_cpu_device(int index);
// A CUDA replica on GPU `ordinal`. Several replicas may share one GPU (logical devices).
std::unique_ptr<Device> make_cuda_device(int ordinal);
// A replica on simulated GPU `ordinal` (kernels/sim/sim.h has its knobs).
std::unique_ptr<Device> make_sim_device(int ordinal);

// Whether the CUDA backend can run here, and if not, why.
struct CudaStatus {
    enum class State {
        not_compiled,  // a CPU-only build (no nvcc at build time)
        no_driver,     // no NVIDIA driver: CPU replicas are the right choice
        no_device,     // a driver, but no GPU visible (CUDA_VISIBLE_DEVICES, containers)
        unusable,      // a driver and GPUs that this build cannot use: a configuration to fix
        ok,
    } state = State::not_compiled;
    int devices = 0;
    std::string reason;  // what is wrong and what to install ("" when ok)
};
CudaStatus cuda_status();               // probed once
bool cuda_compiled();                   // was the CUDA backend built in?
int cuda_device_count();                // 0 unless cuda_status().state is ok
std::string cuda_unavailable_reason();  // cuda_status().reason

struct CudaDeviceInfo {
    int ordinal = 0;
    std::string name;
    size_t total_memory = 0;
    int cc_major = 0, cc_minor = 0;
    int multiprocessors = 0;
};
struct CudaTopology {
    std::vector<CudaDeviceInfo> devices;
    std::vector<std::vector<int>> peer_access;   // [i][j] cudaDeviceCanAccessPeer
    std::vector<std::vector<int>> perf_rank;     // [i][j] CUDA's P2P performance rank, -1 unknown
    std::vector<std::vector<std::string>> link;  // [i][j] "NVLink", "PCIe, one switch", ...
};
CudaTopology cuda_topology();
// The CUDA libraries this build runs on, each 0 where there is none (no driver, not compiled in).
// Starts nothing on the GPUs: `mirrored --version` asks for it. cublas: major x 10000 + minor x
// 100 + patch; the others as cudaRuntimeGetVersion and ncclGetVersion count.
struct CudaVersions {
    int runtime = 0, driver = 0, cublas = 0, nccl = 0;
};
CudaVersions cuda_versions();
// "13.0" for 13000, as cudaRuntimeGetVersion counts; "none" for 0.
std::string cuda_version_text(int v);
// "2.28.9" for 22809, as ncclGetVersion counts (before NCCL 2.9: 2708 -> "2.7.8"); "none" for 0.
std::string nccl_version_text(int v);
uint64_t cuda_free_memory(int ordinal);  // cudaMemGetInfo's free bytes (0 if unknown)

// A pair of distinct GPUs that kernels cannot load across: reduce_from_peer copies through local
// staging instead. `why` says what the runtime answered.
struct StagedPair {
    int from = 0, to = 0;
    std::string why;
};

// ---- backends: the kinds of device, registered by name (kernels/backends.cpp) ----------------
// What the code above kernels/ may know of a kind of device: asked of its backend (before any
// device exists, as the memory plan is) or of a device, never by comparing device types.
struct DeviceTraits {
    const char* display;          // "CPU", "CUDA", "simulated-GPU": the start-up line's word
    bool asynchronous;            // streams run behind the host (GPUs, simulated GPUs)
    bool gpu;                     // a GPU: its memory is not the host's, and cuBLAS decides the bits
    bool one_memory;              // every replica in one memory (CPU), so they may share parameters
    bool replicas_alike;          // every replica is the same device: describe one
    bool shares_ordinals;         // several replicas may name one device (cuda:0,0), sharing its memory
    bool nccl;                    // the nccl op runs on distinct devices of this kind, in this build
    bool nccl_capturable;         // its NCCL calls may be captured into a graph
    bool nccl_between_nodes;      // multi-node sums go through NCCL (else MPI, on the host)
    bool stores_16bit;            // bf16/fp16 activations stored in 16 bits (else f32, rounded)
    bool graphs;                  // streams can be captured into graphs (Device::capture_begin)
    bool stable_description;      // description() names hardware, not measured figures (cache keys)
    int loader_threads;           // data.loader_threads: auto
    size_t column_block_bytes;    // Device::column_block_bytes of its devices
    const char* fused_epilogues;  // what strategy.fused_epilogues does here
    const char* note;             // a line for the start-up header ("" for none)
};

// The widest rows of a model's products with its weights [out, in]: a row of inputs (the
// products' depth) and a row of outputs; in floats, the largest weights the JIT kernels may turn
// around (at most kCpuJitWeightMaxFloats, and at most kCpuJitSmallWeightFloats) and the largest
// convolution weight.
struct ProductWidths {
    uint64_t in = 0, out = 0;
    uint64_t weight = 0, small_weight = 0, convolution = 0;
};

// What a device's workspaces are sized by (the memory plan): rows of a micro-batch, the widest
// activation or input row, whether cuBLASLt epilogues are on.
struct WorkspaceNeeds {
    int micro_rows = 0;
    uint64_t widest = 0;  // elements per sample of the largest activation (or input)
    bool fused_epilogues = false;
    int positions = 1;          // a sequence's length: its products have micro_rows x positions rows
    ProductWidths product;      // the widest inputs and outputs of a product with a weight
    bool convolutions = false;  // the model convolves (im2col columns, padded images)
    // Every micro-batch's rows a replica computes (full batches' and last, partial ones'), or
    // empty where they are not known: then any count up to micro_rows.
    std::vector<int> rows_met;
};

struct Backend {
    const char* name;  // the devices spec's prefix: "cpu", "cuda", "sim"
    DeviceType type;
    DeviceTraits traits;
    // The ordinals of a devices spec: `tail` is what follows "name:" (null for the bare name).
    // ConfigError for a malformed spec, DeviceError for devices this machine does not have.
    std::vector<int> (*parse)(const std::string& spec, const std::string* tail, const CudaStatus& cuda);
    // A replica's device: the GPU `ordinal` (several replicas may share one), or CPU replica `ordinal`.
    std::unique_ptr<Device> (*make)(int ordinal);
    // Enables peer access between every pair of distinct listed devices that supports it;
    // returns the pairs left on the staged path.
    std::vector<StagedPair> (*enable_peer_access)(const std::vector<int>& ordinals);
    uint64_t (*workspace_bytes)(const WorkspaceNeeds& needs);  // per replica, all scratch included
    // The library whose rounding a result depends on ("blas-kernel ...", "cuBLAS").
    std::string (*gemm_library)(bool fused_epilogues);
    // Which kernel each product ran where that was measured per shape (CPU replicas and the
    // simulated GPUs: kernels/cpu/gemm_choice.h), for the checkpoint; "" where it is not.
    std::string (*gemm_choices)();
    // Adopts a checkpoint's gemm_choices before a resume's first step; how many were adopted, and
    // into `recorded` (where given) how many entries the choices hold.
    size_t (*adopt_gemm_choices)(const std::string& choices, size_t* recorded);
};
const Registry<Backend>& backends();  // cpu, cuda, sim: kernels/backends.cpp lists them
const Backend& backend_of(DeviceType t);
// The backend named by a spec's prefix, or null.
const Backend* find_backend(const std::string& name);

// strategy.devices: "auto" (every GPU, else one CPU replica per core), "cuda", "cuda:all",
// "cuda:0,1,3", "cuda:0,0,0,0" (four replicas sharing GPU 0), "cpu" (one per core), "cpu:N", and
// simulated GPUs for tests and debugging: "sim:0,1" (two), "sim:0,0,0,0" (four sharing one).
// `auto` fails (DeviceError) where a driver is present but CUDA cannot start: silently training on
// the CPU would hide a broken installation.
struct DeviceList {
    const Backend* backend = nullptr;
    std::vector<int> ordinals;  // GPU ordinals (CUDA, sim); 0..N-1 for CPU replicas
    const DeviceTraits& traits() const { return backend->traits; }
    std::string describe() const;  // "cuda:0,cuda:1"
    size_t distinct() const;       // devices, each counted once (cuda:0,0,0,0 is one GPU)
};
DeviceList parse_devices(const std::string& spec, const CudaStatus& cuda = cuda_status());

// The wire types reduce_from_peer accepts (f32, bf16); a DeviceError naming d otherwise.
void check_wire_dtype(const Device& d, DType t);

// How reduce_from_peer reads another GPU's memory: automatic (a kernel loading the peer's memory
// where peer access allows, else staged), or forced - a knob for benchmarks and tests that
// compare the two. Applies to CUDA and sim devices.
enum class PeerTransport { automatic, direct, staged };
void set_peer_transport(PeerTransport t);
PeerTransport peer_transport();

// BLAS threads for CPU replicas: one each, because replicas are the parallelism.
void cpu_set_blas_threads(int n);
// Bytes the CPU kernels' per-thread scratch holds on the calling thread (kernels/cpu/scratch.h):
// a CPU replica's workspace, which its thread's kernels grow to the run's largest product.
uint64_t cpu_thread_scratch_bytes();
// CPU products' GEMM kernels by the static rules instead of measured (kernels/cpu/gemm_choice.h):
// for multi-node runs, whose nodes would each measure for themselves. Call before any product.
void cpu_gemm_use_rules();
// The CPU backend computes a GEMM with up to this many rows and B transposed as its transpose,
// in a scratch of rows x columns floats per thread (kernels/cpu/cpu_device.cpp and
// kernels/cpu/jit_gemm.cpp say why).
constexpr int kCpuTransposedGemmMaxRows = 128;
// The JIT kernels take A transposed (A^T B) through a transposed copy of at most this many floats
// per thread, and turn a product of at most kCpuJitTurnedMaxCells cells around
// (kernels/cpu/gemm_choice.cpp).
constexpr size_t kCpuJitTransposedMaxFloats = size_t(128) << 10;
constexpr size_t kCpuJitTurnedMaxCells = 16384;
// The JIT kernels take A B^T with B (a weight, attention's keys) turned around into a scratch per
// thread: at most this many floats (1 MiB: a 512 x 512 layer) where the product has more than
// kCpuTransposedGemmMaxRows rows, at most kCpuJitSmallWeightFloats (64 KiB) at any row count.
constexpr size_t kCpuJitWeightMaxFloats = size_t(256) << 10;
constexpr size_t kCpuJitSmallWeightFloats = size_t(16) << 10;
// Device::column_block_bytes of CPU replicas: half a 1 MiB L2 (AMD Zen 5, most
// Xeons since Skylake-SP), so a block's columns stay in the core's cache from im2col through
// both products.
constexpr size_t kCpuColumnBlockBytes = size_t(512) << 10;

}  // namespace mirrored
