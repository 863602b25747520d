// The CPU backend: the reference every CUDA op is tested against. OpenBLAS for GEMM, plain loops
// elsewhere. Ops run to completion on the calling thread (a replica's own thread), so streams and
// events are no-ops here. Activations are stored as f32; with bf16/fp16 precision every stored
// activation is rounded to that type at the points where the CUDA backend stores it.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <thread>
#include <vector>

#include "kernels/blas.h"
#include "kernels/cpu/act_loops.h"
#include "kernels/cpu/loop_clones.h"
#include "kernels/cpu/gemm_choice.h"
#include "kernels/cpu/jit_gemm.h"
#include "kernels/device.h"
#include "base/error.h"
#include "kernels/op_math.h"

extern "C" void openblas_set_num_threads(int num_threads);

namespace mirrored {

void cpu_set_blas_threads(int n) { openblas_set_num_threads(n); }

namespace {

class CpuDevice final : public Device {
public:
    explicit CpuDevice(int index) : Device(DeviceType::cpu, index, "cpu:" + std::to_string(index)) {
        // Convolutions: whole pixels copied, not transposed; MIRRORED_PIXEL_MAJOR_COLUMNS=0 keeps
        // the GPU's column order, so CPU replicas compute convolutions bit for bit as the
        // simulated GPUs do.
        const char* e = std::getenv("MIRRORED_PIXEL_MAJOR_COLUMNS");
        pixel_major_columns_ = !(e && std::strcmp(e, "0") == 0);
    }

    std::string description() const override {
        return "CPU replica " + std::to_string(ordinal()) + " (" + std::to_string(std::thread::hardware_concurrency()) +
               " hardware threads; " + blas_description() + ")";
    }

    void* alloc_bytes(size_t bytes) override {
        void* p = allocate(bytes);
        note_alloc(p, bytes);
        return p;
    }
    void free_bytes(void* p) noexcept override {
        note_free(p);
        std::free(p);
    }
    void* alloc_host_bytes(size_t bytes) override { return allocate(bytes); }
    void free_host_bytes(void* p) noexcept override { std::free(p); }
    void copy_to_device(Stream, void* dst, const void* src, size_t bytes) override {
        if (bytes) std::memcpy(dst, src, bytes);
    }
    void copy_to_host(Stream, void* dst, const void* src, size_t bytes) override {
        if (bytes) std::memcpy(dst, src, bytes);
    }
    void copy_on_device(Stream, void* dst, const void* src, size_t bytes) override {
        if (bytes && dst != src) std::memmove(dst, src, bytes);
    }

    Event event_create(bool) override { return Event{}; }
    void event_destroy(Event) noexcept override {}
    void event_record(Event, Stream) override {}
    void stream_wait_event(Stream, Event) override {}
    bool event_query(Event) override { return true; }
    void event_synchronize(Event) override {}
    void stream_synchronize(Stream) override {}
    void synchronize() override {}
    bool query_idle() override { return true; }
    void abandon() noexcept override { abandoned_ = true; }
    float event_elapsed_ms(Event, Event) override { return 0.0f; }
    void host_callback(Stream, void (*fn)(void*), void* arg) override { fn(arg); }

    void set_precision(Precision p) override { precision_ = p; }

    void reduce_from_peer(Stream, void* dst, const Device& peer, const void* src, DType t, size_t n) override {
        require_cpu(peer);
        check_wire_dtype(*this, t);
        host_peer_add(dst, src, t, n);
    }
    void copy_from_peer(Stream, void* dst, const Device& peer, const void* src, size_t bytes) override {
        require_cpu(peer);
        if (bytes) std::memcpy(dst, src, bytes);
    }
    bool can_load_from(const Device& peer) const override { return peer.type() == DeviceType::cpu; }

private:
    // A pass's f32 results rounded to the values' 16-bit storage type, where one is in use.
    void round_stored(float* v, size_t n) const { mirrored::round_stored(v, n, value_dtype()); }

    void* allocate(size_t bytes) {
        const size_t rounded = (bytes + 63) / 64 * 64;
        void* p = std::aligned_alloc(64, rounded ? rounded : 64);
        if (!p) throw DeviceError(name() + ": out of host memory allocating " + std::to_string(bytes) + " bytes");
        return p;
    }
    void require_cpu(const Device& peer) const {
        if (peer.type() != DeviceType::cpu)
            throw DeviceError(name() + ": cannot exchange data with " + peer.name() +
                              " (replicas must all be of one kind)");
    }
};

}  // namespace

std::unique_ptr<Device> make_cpu_device(int index) { return std::make_unique<CpuDevice>(index); }

}  // namespace mirrored
