// Backend-neutral entry points of the op interface: names, the default ops, allocation
// accounting and the peer-transport knob.
#include <atomic>

#include "kernels/backends.h"
#include "kernels/device.h"
#include "kernels/ops/activation.h"
#include "base/error.h"

namespace mirrored {

namespace {
std::atomic<PeerTransport> g_transport{PeerTransport::automatic};
}

std::string cuda_version_text(int v) {
    return v > 0 ? std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10) : "none";
}

std::string nccl_version_text(int v) {
    if (v <= 0) return "none";
    const int major = v >= 10000 ? v / 10000 : v / 1000, minor = v >= 10000 ? (v / 100) % 100 : (v / 100) % 10;
    return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(v % 100);
}

const char* device_type_name(DeviceType t) {
    switch (t) {
        case DeviceType::cuda:
            return "cuda";
        case DeviceType::sim:
            return "sim";
        default:
            return "cpu";
    }
}

const char* dtype_name(DType t) {
    switch (t) {
        case DType::bf16:
            return "bf16";
        case DType::f16:
            return "fp16";
        default:
            return "fp32";
    }
}

void check_wire_dtype(const Device& d, DType t) {
    if (t != DType::f32 && t != DType::bf16)
        throw DeviceError(d.name() + ": peer reduction in " + dtype_name(t) + " (supported: fp32, bf16)");
}

const char* precision_name(Precision p) {
    switch (p) {
        case Precision::tf32:
            return "tf32";
        case Precision::bf16:
            return "bf16";
        case Precision::fp16:
            return "fp16";
        default:
            return "fp32";
    }
}

const char* activation_name(Activation a) {
    switch (a) {
        case Activation::relu:
            return "relu";
        case Activation::gelu:
            return "gelu";
        case Activation::gelu_tanh:
            return "gelu_tanh";
        default:
            return "none";
    }
}

const char* init_kind_name(InitKind k) {
    switch (k) {
        case InitKind::he_uniform:
            return "he_uniform";
        case InitKind::he_normal:
            return "he_normal";
        case InitKind::glorot_uniform:
            return "glorot_uniform";
        case InitKind::glorot_normal:
            return "glorot_normal";
        case InitKind::gpt2_normal:
            return "gpt2_normal";
        case InitKind::ones:
            return "ones";
        default:
            return "zeros";
    }
}

void Device::launch_host(Stream, const char* op, HostOp work) {
    if (asynchronous()) throw DeviceError(name() + ": " + op + " has no CPU implementation to run here");
    work(*this);
}
void missing_cuda_kernel(const Device& d, const char* op) {
    throw DeviceError(d.name() + ": " + op + ": this build has no CUDA kernel for it");
}
Device::NativeLaunch Device::native_launch(Stream) {
    throw DeviceError(name() + ": CUDA kernels run on CUDA devices only");
}

void Device::capture_begin(Stream) {
    throw DeviceError(name() + ": stream capture needs a GPU (CPU replicas run each op as it is issued)");
}
Graph Device::capture_end(Stream) { throw DeviceError(name() + ": stream capture needs a GPU"); }
void Device::graph_launch(Graph, Stream) { throw DeviceError(name() + ": graphs need a GPU"); }

void Device::note_alloc(void* p, size_t bytes) {
    {
        std::lock_guard<std::mutex> lock(sizes_mu_);
        sizes_[p] = bytes;
    }
    const int64_t now = allocated_.fetch_add(int64_t(bytes)) + int64_t(bytes);
    for (int64_t peak = peak_.load(); now > peak && !peak_.compare_exchange_weak(peak, now);) {}
}

void Device::note_free(void* p) noexcept {
    std::lock_guard<std::mutex> lock(sizes_mu_);
    auto it = sizes_.find(p);
    if (it == sizes_.end()) return;
    allocated_.fetch_sub(int64_t(it->second));
    sizes_.erase(it);
}

void set_peer_transport(PeerTransport t) { g_transport = t; }
PeerTransport peer_transport() { return g_transport; }

}  // namespace mirrored
