// The CPU backend: the reference every CUDA op is tested against. OpenBLAS for GEMM, plain loops
// elsewhere. Ops run to completion on the calling thread (a replica's own thread), so streams and
// events are no-ops here.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "kernels/device.h"
#include "kernels/error.h"
#include "kernels/op_math.h"

extern "C" void openblas_set_num_threads(int num_threads);

namespace mirrored {

void cpu_set_blas_threads(int n) { openblas_set_num_threads(n); }

namespace {

class CpuDevice final : public Device {
public:
    explicit CpuDevice(int index) : Device(DeviceType::cpu, index, "cpu:" + std::to_string(index)) {}

    std::string description() const override {
        return "CPU replica " + std::to_string(ordinal()) + " (" +
               std::to_string(std::thread::hardware_concurrency()) + " hardware threads)";
    }

    void* alloc_bytes(size_t bytes) override {
        const size_t rounded = (bytes + 63) / 64 * 64;
        void* p = std::aligned_alloc(64, rounded ? rounded : 64);
        if (!p)
            throw DeviceError(name() + ": out of host memory allocating " + std::to_string(bytes) +
                              " bytes");
        return p;
    }
    void free_bytes(void* p) noexcept override { std::free(p); }
    void* alloc_host_bytes(size_t bytes) override { return alloc_bytes(bytes); }
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
    void set_tf32(bool) override {}

    void gemm(Stream, bool ta, bool tb, int m, int n, int k, float alpha, const float* a, int lda,
              const float* b, int ldb, float beta, float* c, int ldc) override {
        if (m <= 0 || n <= 0) return;
        if (k <= 0) {
            for (int i = 0; i < m; ++i)
                for (int j = 0; j < n; ++j) c[size_t(i) * ldc + j] = beta == 0.0f ? 0.0f : beta * c[size_t(i) * ldc + j];
            return;
        }
        cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m,
                    n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    }

    void bias_act_forward(Stream, Activation act, int rows, int cols, const float* bias, float* z,
                          float* out) override {
        for (int i = 0; i < rows; ++i) {
            float* zr = z + size_t(i) * cols;
            float* orow = out + size_t(i) * cols;
            for (int j = 0; j < cols; ++j) {
                const float v = bias ? zr[j] + bias[j] : zr[j];
                zr[j] = v;
                orow[j] = act_forward(act, v);
            }
        }
    }

    void act_backward(Stream, Activation act, size_t n, const float* z, const float* dout,
                      float* dz) override {
        for (size_t i = 0; i < n; ++i) dz[i] = dout[i] * act_derivative(act, z[i]);
    }

    void bias_grad(Stream, int rows, int cols, const float* dz, float* db, bool accumulate) override {
        for (int j = 0; j < cols; ++j) {
            float s = 0.0f;
            for (int i = 0; i < rows; ++i) s += dz[size_t(i) * cols + j];
            db[j] = accumulate ? db[j] + s : s;
        }
    }

    void softmax_xent(Stream, int rows, int classes, const float* logits, const int32_t* labels,
                      float grad_scale, float* dlogits, double* metrics) override {
        double loss_sum = 0.0, correct = 0.0;
        for (int i = 0; i < rows; ++i) {
            const float* z = logits + size_t(i) * classes;
            int arg = 0;
            for (int j = 1; j < classes; ++j)
                if (z[j] > z[arg]) arg = j;
            const float mx = z[arg];
            float sum = 0.0f;
            for (int j = 0; j < classes; ++j) sum += std::exp(z[j] - mx);
            const int y = labels[i];
            loss_sum += double(std::log(sum) + mx - z[y]);
            correct += arg == y ? 1.0 : 0.0;
            if (dlogits) {
                float* d = dlogits + size_t(i) * classes;
                const float inv = 1.0f / sum;
                for (int j = 0; j < classes; ++j)
                    d[j] = (std::exp(z[j] - mx) * inv - (j == y ? 1.0f : 0.0f)) * grad_scale;
            }
        }
        metrics[kMetricLossSum] += loss_sum;
        metrics[kMetricCorrect] += correct;
        metrics[kMetricCount] += double(rows);
    }

    void dropout_forward(Stream, const DropoutArgs& a, int rows, int cols, const float* x,
                         float* y) override {
        const float keep_scale = 1.0f / (1.0f - a.rate);
        for (int i = 0; i < rows; ++i)
            for (int j = 0; j < cols; ++j) {
                const size_t e = size_t(i) * cols + j;
                y[e] = dropout_keep(a.seed, a.layer_id, a.step, a.row_offset + i, cols, j, a.rate)
                           ? x[e] * keep_scale
                           : 0.0f;
            }
    }

    void dropout_backward(Stream s, const DropoutArgs& a, int rows, int cols, const float* dy,
                          float* dx) override {
        dropout_forward(s, a, rows, cols, dy, dx);  // the same mask and scale
    }

    void fill(Stream, size_t n, float value, float* x) override { std::fill(x, x + n, value); }
    void scale(Stream, size_t n, float alpha, float* x) override {
        for (size_t i = 0; i < n; ++i) x[i] *= alpha;
    }
    void axpy(Stream, size_t n, float alpha, const float* x, float* y) override {
        for (size_t i = 0; i < n; ++i) y[i] += alpha * x[i];
    }
    void sum_squares(Stream, size_t n, const float* x, float* out) override {
        double s = 0.0;
        for (size_t i = 0; i < n; ++i) s += double(x[i]) * x[i];
        *out = static_cast<float>(s);
    }
    void init_params(Stream, const InitArgs& a, size_t n, float* out) override {
        const float sc = init_scale(a);
        for (size_t i = 0; i < n; ++i) out[i] = init_value(a.kind, a.seed, a.tensor_id, sc, i);
    }

    void sgd_update(Stream, size_t n, float* p, const float* g, float* m, const SgdArgs& a) override {
        const float clip = clip_factor(a.clip_norm, a.grad_sq_norm);
        for (size_t i = 0; i < n; ++i) {
            float d = g[i] * clip + a.weight_decay * p[i];
            if (a.momentum != 0.0f) {
                m[i] = a.momentum * m[i] + d;
                d = a.nesterov ? d + a.momentum * m[i] : m[i];
            }
            p[i] -= a.lr * d;
        }
    }

    void adamw_update(Stream, size_t n, float* p, const float* g, float* m, float* v,
                      const AdamWArgs& a) override {
        const float clip = clip_factor(a.clip_norm, a.grad_sq_norm);
        const auto [bc1, bc2_sqrt] = adamw_corrections(a);
        const float step_size = a.lr / bc1;
        const float decay = 1.0f - a.lr * a.weight_decay;
        for (size_t i = 0; i < n; ++i) {
            const float gi = g[i] * clip;
            p[i] *= decay;
            m[i] = a.beta1 * m[i] + (1.0f - a.beta1) * gi;
            v[i] = a.beta2 * v[i] + (1.0f - a.beta2) * gi * gi;
            p[i] -= step_size * m[i] / (std::sqrt(v[i]) / bc2_sqrt + a.eps);
        }
    }

    void checksum(Stream, size_t n, const float* x, uint64_t* out) override {
        uint64_t s = 0;
        for (size_t i = 0; i < n; ++i) {
            uint32_t bits;
            std::memcpy(&bits, x + i, 4);
            s += checksum_term(bits, i);
        }
        *out = s;
    }

    void reduce_from_peer(Stream, float* dst, const Device& peer, const float* src,
                          size_t n) override {
        require_cpu(peer);
        for (size_t i = 0; i < n; ++i) dst[i] += src[i];
    }
    void copy_from_peer(Stream, float* dst, const Device& peer, const float* src, size_t n) override {
        require_cpu(peer);
        if (n) std::memcpy(dst, src, n * sizeof(float));
    }

private:
    void require_cpu(const Device& peer) const {
        if (peer.type() != DeviceType::cpu)
            throw DeviceError(name() + ": cannot exchange data with " + peer.name() +
                              " (replicas must all be of one kind)");
    }
};

}  // namespace

std::unique_ptr<Device> make_cpu_device(int index) { return std::make_unique<CpuDevice>(index); }

}  // namespace mirrored
