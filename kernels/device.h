// The op interface: everything a replica does to memory goes through a Device.
// Three implementations: kernels/cpu (the reference: OpenBLAS + plain loops), kernels/cuda
// (cuBLAS + own kernels), and kernels/sim (a simulated GPU: CUDA's stream, event, copy and
// callback semantics on CPU threads, computing with the CPU reference - so the asynchronous host
// logic the CUDA path depends on is tested without a GPU). The model, strategy and trainer see
// only this header, so they never know which kind of device they run on.
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

#include <cstddef>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace mirrored {

enum class DeviceType { cpu, cuda, sim };
const char* device_type_name(DeviceType t);  // "cpu", "cuda", "sim"

// Opaque handles: cudaStream_t / cudaEvent_t on CUDA, unused on CPU.
struct Stream { void* handle = nullptr; };
struct Event { void* handle = nullptr; };

enum class Activation { none, relu, gelu };
enum class InitKind { zeros, he_uniform, he_normal, glorot_uniform, glorot_normal };

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

// Dropout mask element (row, col) is a pure function of (seed, layer_id, step, global row, col):
// a replica passes the offset of its shard in the global batch, so N replicas draw exactly the
// masks one replica would draw for the same global batch.
struct DropoutArgs {
    float rate = 0.0f;
    uint64_t seed = 0;
    uint32_t layer_id = 0;
    uint32_t step = 0;
    int64_t row_offset = 0;
};

// Hyper-parameters of one optimizer step. grad_sq_norm (device memory, may be null) holds the
// squared global gradient norm; when clip_norm > 0 the update scales gradients by
// min(1, clip_norm / norm) read on the device, so clipping needs no host round trip.
struct SgdArgs {
    float lr = 0.01f;
    float momentum = 0.0f;
    float weight_decay = 0.0f;  // L2, added to the gradient (PyTorch SGD)
    bool nesterov = false;
    float clip_norm = 0.0f;
    const float* grad_sq_norm = nullptr;
};

struct AdamWArgs {
    float lr = 1e-3f;
    float beta1 = 0.9f;
    float beta2 = 0.999f;
    float eps = 1e-8f;
    float weight_decay = 0.0f;  // decoupled (PyTorch AdamW)
    int64_t step = 1;           // 1-based, for bias correction
    float clip_norm = 0.0f;
    const float* grad_sq_norm = nullptr;
};

// metrics accumulated on the device by softmax_xent, read by the host only when logging. Double,
// so that sample counts stay exact far beyond 2^24.
enum MetricSlot { kMetricLossSum = 0, kMetricCorrect = 1, kMetricCount = 2, kMetricSlots = 4 };

// Calls the host made on a device since it was created: what a step costs the host.
struct HostWork {
    uint64_t launches = 0;       // kernels and library calls (GEMM)
    uint64_t copies = 0;         // memory copies
    uint64_t event_records = 0;
    uint64_t stream_waits = 0;   // cross-stream waits on events
    uint64_t host_syncs = 0;     // host waits for a device (synchronize, event/stream sync)
    uint64_t callbacks = 0;      // host functions enqueued on a stream
    HostWork operator-(const HostWork& o) const {
        return {launches - o.launches, copies - o.copies, event_records - o.event_records,
                stream_waits - o.stream_waits, host_syncs - o.host_syncs, callbacks - o.callbacks};
    }
    uint64_t total() const { return launches + copies + event_records + stream_waits + host_syncs + callbacks; }
};

class Device {
public:
    virtual ~Device() = default;
    Device(const Device&) = delete;
    Device& operator=(const Device&) = delete;

    DeviceType type() const { return type_; }
    // Streams are real queues that run behind the host (CUDA, sim); on CPU they are the caller.
    bool asynchronous() const { return type_ != DeviceType::cpu; }
    int ordinal() const { return ordinal_; }  // GPU ordinal (CUDA, sim); replica index on CPU
    const std::string& name() const { return name_; }  // "cuda:0", "cpu:1"
    virtual std::string description() const = 0;      // model name, memory

    // ---- memory -----------------------------------------------------------------------
    virtual void* alloc_bytes(size_t bytes) = 0;     // throws DeviceError naming the device and size
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
    virtual void set_tf32(bool enabled) = 0;

    // ---- dense-network ops ------------------------------------------------------------
    virtual void gemm(Stream s, bool trans_a, bool trans_b, int m, int n, int k, float alpha,
                      const float* a, int lda, const float* b, int ldb, float beta, float* c,
                      int ldc) = 0;
    // z[rows,cols] += bias[cols] (bias may be null); out = act(z) (out may equal z when act is none)
    virtual void bias_act_forward(Stream s, Activation act, int rows, int cols, const float* bias,
                                  float* z, float* out) = 0;
    // dz = dout * act'(z); dz may alias dout
    virtual void act_backward(Stream s, Activation act, size_t n, const float* z, const float* dout,
                              float* dz) = 0;
    // db[cols] (+)= column sums of dz[rows,cols]
    virtual void bias_grad(Stream s, int rows, int cols, const float* dz, float* db,
                           bool accumulate) = 0;
    // Fused softmax + cross-entropy over logits[rows,classes] with int labels.
    // dlogits = (softmax - onehot) * grad_scale (skipped when dlogits is null);
    // metrics[kMetricLossSum] += sum of per-row losses, [kMetricCorrect] += correct argmax,
    // [kMetricCount] += rows.
    virtual void softmax_xent(Stream s, int rows, int classes, const float* logits,
                              const int32_t* labels, float grad_scale, float* dlogits,
                              double* metrics) = 0;
    virtual void dropout_forward(Stream s, const DropoutArgs& a, int rows, int cols,
                                 const float* x, float* y) = 0;
    virtual void dropout_backward(Stream s, const DropoutArgs& a, int rows, int cols,
                                  const float* dy, float* dx) = 0;

    // ---- flat-buffer ops --------------------------------------------------------------
    virtual void fill(Stream s, size_t n, float value, float* x) = 0;
    virtual void scale(Stream s, size_t n, float alpha, float* x) = 0;
    virtual void axpy(Stream s, size_t n, float alpha, const float* x, float* y) = 0;  // y += a*x
    virtual void sum_squares(Stream s, size_t n, const float* x, float* out) = 0;  // *out = sum x^2
    virtual void init_params(Stream s, const InitArgs& a, size_t n, float* out) = 0;
    virtual void sgd_update(Stream s, size_t n, float* param, const float* grad, float* momentum,
                            const SgdArgs& a) = 0;
    virtual void adamw_update(Stream s, size_t n, float* param, const float* grad, float* m,
                              float* v, const AdamWArgs& a) = 0;
    // Order-independent 64-bit fingerprint of the bits of x[0..n), written to *out (device).
    virtual void checksum(Stream s, size_t n, const float* x, uint64_t* out) = 0;

    // ---- cross-replica ops (peer is a device of the same type) ---------------------------
    // dst[0..n) += src[0..n), where src lives on peer. Bit-identical on every device type.
    virtual void reduce_from_peer(Stream s, float* dst, const Device& peer, const float* src,
                                  size_t n) = 0;
    virtual void copy_from_peer(Stream s, float* dst, const Device& peer, const float* src,
                                size_t n) = 0;

    HostWork host_work() const { return work_; }  // read by the replica's own thread

protected:
    Device(DeviceType type, int ordinal, std::string name)
        : type_(type), ordinal_(ordinal), name_(std::move(name)) {}
    Stream compute_, comm_, copy_;
    HostWork work_;  // implementations count what the host issues
    std::atomic<bool> abandoned_{false};

private:
    DeviceType type_;
    int ordinal_;
    std::string name_;
};

// ---- factories --------------------------------------------------------------------------
std::unique_ptr<Device> make_cpu_device(int index);
// A CUDA replica on GPU `ordinal`. Several replicas may share one GPU (logical devices).
std::unique_ptr<Device> make_cuda_device(int ordinal);
// A replica on simulated GPU `ordinal` (kernels/sim/sim.h has its knobs).
std::unique_ptr<Device> make_sim_device(int ordinal);
// One of the above by type: `ordinal` is the GPU (CUDA, sim) or the replica index (CPU).
std::unique_ptr<Device> make_device(DeviceType type, int ordinal);

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
CudaStatus cuda_status();             // probed once
bool cuda_compiled();                 // was the CUDA backend built in?
int cuda_device_count();              // 0 unless cuda_status().state is ok
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
    std::vector<std::vector<int>> peer_access;        // [i][j] cudaDeviceCanAccessPeer
    std::vector<std::vector<int>> perf_rank;          // [i][j] CUDA's P2P performance rank, -1 unknown
    std::vector<std::vector<std::string>> link;       // [i][j] "NVLink", "PCIe, one switch", ...
    int cuda_runtime_version = 0, cuda_driver_version = 0, nccl_version = 0;
};
CudaTopology cuda_topology();
uint64_t cuda_free_memory(int ordinal);  // cudaMemGetInfo's free bytes (0 if unknown)

// A pair of distinct GPUs that kernels cannot load across: reduce_from_peer copies through local
// staging instead. `why` says what the runtime answered.
struct StagedPair {
    int from = 0, to = 0;
    std::string why;
};
// Enables peer access between every pair of distinct listed GPUs (CUDA or sim) that supports
// it; returns the pairs left on the staged path.
std::vector<StagedPair> enable_peer_access(DeviceType type, const std::vector<int>& ordinals);

// How reduce_from_peer reads another GPU's memory: automatic (a kernel loading the peer's memory
// where peer access allows, else staged), or forced - a knob for benchmarks and tests that
// compare the two. Applies to CUDA and sim devices.
enum class PeerTransport { automatic, direct, staged };
void set_peer_transport(PeerTransport t);
PeerTransport peer_transport();

// BLAS threads for CPU replicas: one each, because replicas are the parallelism.
void cpu_set_blas_threads(int n);

}  // namespace mirrored
