// Every op of the Device interface: the CPU backend against a naive double-precision reference,
// and the CUDA backend against the CPU backend, on fresh random inputs with outputs poisoned
// (NaN) first. Tolerances are normalised max errors (tests/helpers.h rel_error):
//   op                      CPU vs double ref   CUDA vs CPU
//   gemm fp32               1e-5 * sqrt(k)      1e-5 * sqrt(k) (TF32: 5e-3)
//   bias_act_forward        1e-6                1e-6
//   act_backward            1e-6                1e-5
//   bias_grad               1e-5                1e-5 (over n > 2500 rows: 2e-7 * sqrt(n))
//   dense_forward,          1e-5 * sqrt(k)      fused (cuBLASLt): 1e-5 * sqrt(k), TF32 5e-3 * sqrt(k);
//   dense_weight_grad                           bf16 against the unfused CUDA ops: y 2e-2, dW 1e-5 * sqrt(k)
//   softmax_xent            1e-5                1e-5 (argmax count: exact)
//   target_loss (mse, bce)  1e-5                1e-5 (bce's correct share: 1e-6)
//   dropout, init uniform, checksum, fill, copy/reduce_from_peer: exact
//   init normal             -                   1e-6
//   sum_squares, sgd, adamw 1e-5                1e-5
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <set>
#include <thread>
#include <filesystem>
#include <cstring>

#include "base/machine_cache.h"
#include "kernels/blas.h"
#include "kernels/cpu/few_rows_gemm.h"
#include "kernels/cpu/gemm_choice.h"
#include "kernels/cpu/jit_gemm.h"
#include "kernels/cpu/scratch.h"
#include "kernels/cuda/column_plan.h"
#include "kernels/device.h"
#include "base/error.h"
#include "kernels/op_math.h"
#include "kernels/ops/dropout.h"
#include "kernels/ops/gemm.h"
#include "kernels/ops/losses.h"
#include "kernels/ops/optimizer.h"
#include "kernels/ops/flat.h"
#include "mirrored/model.h"
#include "mirrored/replica_set.h"
#include "tests/helpers.h"
#include "kernels/ops/elementwise.h"
#include "kernels/ops/activation.h"

using namespace mirrored;
using namespace mirrored::test;

namespace {

double ref_act(Activation a, double z) {
    switch (a) {
        case Activation::relu:
            return z > 0 ? z : 0;
        case Activation::gelu:
            return 0.5 * z * (1 + std::erf(z / std::sqrt(2.0)));
        case Activation::gelu_tanh:
            return 0.5 * z * (1 + std::tanh(std::sqrt(2 / M_PI) * (z + 0.044715 * z * z * z)));
        default:
            return z;
    }
}
double ref_act_grad(Activation a, double z) {
    switch (a) {
        case Activation::relu:
            return z > 0 ? 1 : 0;
        case Activation::gelu:
            return 0.5 * (1 + std::erf(z / std::sqrt(2.0))) + z * std::exp(-0.5 * z * z) / std::sqrt(2 * M_PI);
        case Activation::gelu_tanh: {
            const double k = std::sqrt(2 / M_PI), t = std::tanh(k * (z + 0.044715 * z * z * z));
            return 0.5 * (1 + t) + 0.5 * z * (1 - t * t) * k * (1 + 3 * 0.044715 * z * z);
        }
        default:
            return 1;
    }
}

const Activation kActs[] = {Activation::none, Activation::relu, Activation::gelu, Activation::gelu_tanh};

// ---- op runners: the same call on any device, returning host results ----------------------

struct GemmCase {
    bool ta, tb;
    int m, n, k;
    float alpha, beta;
    std::vector<float> a, b, c0;
};

GemmCase make_gemm(Rng& rng, bool ta, bool tb) {
    GemmCase g{ta, tb, rng.integer(1, 70), rng.integer(1, 70), rng.integer(1, 130), 0, 0, {}, {}, {}};
    g.alpha = rng.uniform(1, 0.5f, 2.0f)[0];
    g.beta = rng.integer(0, 1) ? 0.5f : 0.0f;
    g.a = rng.normal(size_t(g.m) * g.k);
    g.b = rng.normal(size_t(g.k) * g.n);
    g.c0 = rng.normal(size_t(g.m) * g.n);
    return g;
}

std::vector<float> run_gemm(Device& d, const GemmCase& g, bool tf32 = false) {
    auto a = upload(d, g.a), b = upload(d, g.b);
    auto c = g.beta != 0.0f ? upload(d, g.c0) : poisoned(d, g.c0.size());
    d.set_precision(tf32 ? Precision::tf32 : Precision::fp32);
    gemm(d, d.compute_stream(), g.ta, g.tb, g.m, g.n, g.k, g.alpha, a.data(), g.ta ? g.m : g.k, b.data(),
         g.tb ? g.k : g.n, g.beta, c.data(), g.n);
    d.set_precision(Precision::fp32);
    return download(d, c);
}

std::vector<double> ref_gemm(const GemmCase& g) {
    std::vector<double> c(size_t(g.m) * g.n);
    for (int i = 0; i < g.m; ++i)
        for (int j = 0; j < g.n; ++j) {
            double s = 0;
            for (int p = 0; p < g.k; ++p) {
                const double av = g.ta ? g.a[size_t(p) * g.m + i] : g.a[size_t(i) * g.k + p];
                const double bv = g.tb ? g.b[size_t(j) * g.k + p] : g.b[size_t(p) * g.n + j];
                s += av * bv;
            }
            c[size_t(i) * g.n + j] = g.alpha * s + (g.beta != 0 ? g.beta * double(g.c0[size_t(i) * g.n + j]) : 0.0);
        }
    return c;
}

// A row-major [rows, cols] matrix stored with leading dimension ld, the padding set to pad.
std::vector<float> padded(const std::vector<float>& m, int rows, int cols, int ld, float pad) {
    std::vector<float> out(size_t(rows) * ld, pad);
    for (int i = 0; i < rows; ++i) std::copy_n(&m[size_t(i) * cols], cols, &out[size_t(i) * ld]);
    return out;
}

// The [rows, cols] matrix back out of its padded storage; padding_kept says whether every
// padding value is still pad.
std::vector<float> unpadded(const std::vector<float>& m, int rows, int cols, int ld, float pad, bool& padding_kept) {
    std::vector<float> out(size_t(rows) * cols);
    padding_kept = true;
    for (int i = 0; i < rows; ++i) {
        std::copy_n(&m[size_t(i) * ld], cols, &out[size_t(i) * cols]);
        for (int j = cols; j < ld; ++j) padding_kept = padding_kept && m[size_t(i) * ld + j] == pad;
    }
    return out;
}

struct ElemCase {
    int rows, cols;
    std::vector<float> z, bias, dout;
};
ElemCase make_elem(Rng& rng) {
    ElemCase e{rng.integer(1, 90), rng.integer(1, 300), {}, {}, {}};
    e.z = rng.normal(size_t(e.rows) * e.cols, 2.0f);
    e.bias = rng.normal(e.cols);
    e.dout = rng.normal(size_t(e.rows) * e.cols);
    return e;
}

std::vector<float> run_bias_act(Device& d, const ElemCase& e, Activation act, bool with_bias) {
    auto z = upload(d, e.z), bias = upload(d, e.bias);
    auto out = poisoned(d, e.z.size());
    bias_activation(d, d.compute_stream(), act, e.rows, e.cols, with_bias ? bias.data() : nullptr, z.data(),
                    out.data());
    auto zh = download(d, z), oh = download(d, out);
    zh.insert(zh.end(), oh.begin(), oh.end());  // z (biased in place) then out
    return zh;
}

std::vector<float> run_act_backward(Device& d, const ElemCase& e, Activation act) {
    auto z = upload(d, e.z), dout = upload(d, e.dout);
    auto dz = poisoned(d, e.z.size());
    activation_backward(d, d.compute_stream(), act, e.z.size(), z.data(), dout.data(), dz.data());
    return download(d, dz);
}

std::vector<float> run_bias_grad(Device& d, const ElemCase& e, bool accumulate) {
    auto dz = upload(d, e.dout);
    auto db = accumulate ? upload(d, e.bias) : poisoned(d, e.cols);
    bias_gradient(d, d.compute_stream(), e.rows, e.cols, dz.data(), db.data(), accumulate);
    return download(d, db);
}

// A dense layer's two fused-able products (dense_forward, dense_weight_grad: kernels/ops/gemm.h).
struct DenseCase {
    int rows, units, inputs;
    std::vector<float> x, w, bias, dz, dw0, db0;
};
DenseCase make_dense(Rng& rng, int rows, int units, int inputs) {
    DenseCase c{rows, units, inputs, {}, {}, {}, {}, {}, {}};
    c.x = rng.normal(size_t(rows) * inputs);
    c.w = rng.normal(size_t(units) * inputs, 0.2f);
    c.bias = rng.normal(units);
    c.dz = rng.normal(size_t(rows) * units);
    c.dw0 = rng.normal(size_t(units) * inputs);
    c.db0 = rng.normal(units);
    return c;
}
struct DenseOut {
    std::vector<float> y, dw, db;
    uint64_t forward_launches = 0, grad_launches = 0;
};

// Activations (x, w, y, dz) stored as the device's act_dtype() at precision p; dw, db in f32.
DenseOut run_dense(Device& d, const DenseCase& c, Activation act, bool bias, bool accumulate, Precision p, bool fused) {
    d.set_precision(p);
    d.set_fused_epilogues(fused);
    const DType t = d.act_dtype();
    const Stream s = d.compute_stream();
    auto stored = [&](const std::vector<float>& h) {
        DeviceBuffer<unsigned char> out(d, d.act_bytes(h.size()));
        auto f = upload(d, h);
        if (t == DType::f32) d.copy_on_device(s, out.data(), f.data(), f.bytes());
        else convert_values(d, s, h.size(), f.data(), DType::f32, out.data(), t);
        d.synchronize();
        return out;
    };
    auto x = stored(c.x), w = stored(c.w), dz = stored(c.dz);
    auto y = stored(std::vector<float>(size_t(c.rows) * c.units, std::nanf("")));
    auto b = upload(d, c.bias);
    auto dw = accumulate ? upload(d, c.dw0) : poisoned(d, c.dw0.size());
    auto db = accumulate ? upload(d, c.db0) : poisoned(d, c.db0.size());
    DenseOut out;
    const uint64_t l0 = d.host_work().launches;
    dense_forward(d, s, act, c.rows, c.units, c.inputs, x.data(), w.data(), bias ? b.data() : nullptr, y.data(),
                  y.data(), {t, t, t});
    const uint64_t l1 = d.host_work().launches;
    dense_weight_grad(d, s, c.rows, c.units, c.inputs, dz.data(), x.data(), dw.data(), bias ? db.data() : nullptr,
                      accumulate, {t, t, DType::f32});
    out.forward_launches = l1 - l0;
    out.grad_launches = d.host_work().launches - l1;
    DeviceBuffer<float> yf(d, size_t(c.rows) * c.units);
    if (t == DType::f32) d.copy_on_device(s, yf.data(), y.data(), yf.bytes());
    else convert_values(d, s, yf.size(), y.data(), t, yf.data(), DType::f32);
    out.y = download(d, yf);
    out.dw = download(d, dw);
    out.db = bias ? download(d, db) : std::vector<float>{};
    d.set_precision(Precision::fp32);
    d.set_fused_epilogues(false);
    return out;
}

DenseOut ref_dense(const DenseCase& c, Activation act, bool bias, bool accumulate) {
    DenseOut r;
    for (int i = 0; i < c.rows; ++i)
        for (int j = 0; j < c.units; ++j) {
            double z = bias ? c.bias[size_t(j)] : 0.0;
            for (int k = 0; k < c.inputs; ++k)
                z += double(c.x[size_t(i) * c.inputs + k]) * c.w[size_t(j) * c.inputs + k];
            r.y.push_back(float(ref_act(act, z)));
        }
    for (int j = 0; j < c.units; ++j)
        for (int k = 0; k < c.inputs; ++k) {
            double g = accumulate ? c.dw0[size_t(j) * c.inputs + k] : 0.0;
            for (int i = 0; i < c.rows; ++i) g += double(c.dz[size_t(i) * c.units + j]) * c.x[size_t(i) * c.inputs + k];
            r.dw.push_back(float(g));
        }
    for (int j = 0; bias && j < c.units; ++j) {
        double g = accumulate ? c.db0[size_t(j)] : 0.0;
        for (int i = 0; i < c.rows; ++i) g += c.dz[size_t(i) * c.units + j];
        r.db.push_back(float(g));
    }
    return r;
}

struct XentCase {
    int rows, classes;
    float scale;
    std::vector<float> logits;
    std::vector<int32_t> labels;
};
XentCase make_xent(Rng& rng) {
    XentCase x{rng.integer(1, 200), rng.integer(2, 70), 1.0f / 37.0f, {}, {}};
    x.logits = rng.normal(size_t(x.rows) * x.classes, 3.0f);
    x.labels = rng.labels(x.rows, x.classes);
    return x;
}
// dlogits followed by the 3 metric slots (accumulated onto 1, 2, 3)
std::vector<float> run_xent(Device& d, const XentCase& x) {
    auto logits = upload(d, x.logits);
    auto labels = upload(d, x.labels);
    auto dl = poisoned(d, x.logits.size());
    auto metrics = upload(d, std::vector<double>{1.0, 2.0, 3.0, 0.0});
    softmax_xent(d, d.compute_stream(), x.rows, x.classes, logits.data(), labels.data(), x.scale, nullptr, dl.data(),
                 metrics.data());
    auto out = download(d, dl);
    auto m = download(d, metrics);
    for (int i = 0; i < 3; ++i) out.push_back(float(m[i]));
    return out;
}
std::vector<double> ref_xent(const XentCase& x) {
    std::vector<double> out(x.logits.size());
    double loss = 0, correct = 0;
    for (int i = 0; i < x.rows; ++i) {
        const float* z = &x.logits[size_t(i) * x.classes];
        double mx = z[0];
        int arg = 0;
        for (int j = 1; j < x.classes; ++j)
            if (z[j] > mx) mx = z[j], arg = j;
        double sum = 0;
        for (int j = 0; j < x.classes; ++j) sum += std::exp(z[j] - mx);
        const int y = x.labels[i];
        loss += std::log(sum) + mx - z[y];
        correct += arg == y;
        for (int j = 0; j < x.classes; ++j)
            out[size_t(i) * x.classes + j] = (std::exp(z[j] - mx) / sum - (j == y)) * x.scale;
    }
    out.push_back(1.0 + loss);
    out.push_back(2.0 + correct);
    out.push_back(3.0 + x.rows);
    return out;
}

// Logits against float targets (target_loss): targets in [0, 1] for bce (a share of 1s
// and 0s among them, as multi-label data has), any for mse.
struct TargetCase {
    TargetLoss kind;
    int rows, n;
    float scale;
    std::vector<float> logits, targets;
};
TargetCase make_target_case(Rng& rng, TargetLoss kind) {
    TargetCase x{kind, rng.integer(1, 200), rng.integer(1, 70), 1.0f / 37.0f, {}, {}};
    x.logits = rng.normal(size_t(x.rows) * x.n, 3.0f);
    x.targets = kind == TargetLoss::bce ? rng.uniform(x.logits.size(), 0.0f, 1.0f) : rng.normal(x.logits.size(), 2.0f);
    if (kind == TargetLoss::bce)
        for (size_t i = 0; i < x.targets.size(); i += 3) x.targets[i] = x.targets[i] < 0.5f ? 0.0f : 1.0f;
    return x;
}
// dlogits followed by the 3 metric slots (accumulated onto 1, 2, 3)
std::vector<float> run_target_loss(Device& d, const TargetCase& x, const std::vector<float>* logits = nullptr) {
    auto z = upload(d, logits ? *logits : x.logits);
    auto t = upload(d, x.targets);
    auto dl = poisoned(d, x.logits.size());
    auto metrics = upload(d, std::vector<double>{1.0, 2.0, 3.0, 0.0});
    target_loss(d, d.compute_stream(), x.kind, x.rows, x.n, z.data(), t.data(), x.scale, nullptr, dl.data(),
                metrics.data());
    auto out = download(d, dl);
    auto m = download(d, metrics);
    for (int i = 0; i < 3; ++i) out.push_back(float(m[i]));
    return out;
}
std::vector<double> ref_target_loss(const TargetCase& x) {
    std::vector<double> out(x.logits.size());
    double loss = 0, correct = 0;
    for (int i = 0; i < x.rows; ++i) {
        double row = 0, right = 0;
        for (int j = 0; j < x.n; ++j) {
            const size_t k = size_t(i) * x.n + j;
            const double z = x.logits[k], t = x.targets[k];
            double l, g;
            if (x.kind == TargetLoss::mse) {
                l = (z - t) * (z - t);
                g = 2 * (z - t);
            } else {
                // -(t log p + (1 - t) log(1 - p)) for p = sigmoid(z), written without log(0)
                const double p = 1 / (1 + std::exp(-z));
                l = std::max(z, 0.0) - z * t + std::log1p(std::exp(-std::fabs(z)));
                g = p - t;
                right += (z > 0) == (t > 0.5);
            }
            row += l;
            out[k] = g / x.n * x.scale;
        }
        loss += row / x.n;
        correct += right / x.n;
    }
    out.push_back(1.0 + loss);
    out.push_back(2.0 + correct);
    out.push_back(3.0 + x.rows);
    return out;
}

struct OptCase {
    size_t n;
    std::vector<float> p, g, m, v;
};
OptCase make_opt(Rng& rng) {
    OptCase o{size_t(rng.integer(1, 5000)), {}, {}, {}, {}};
    o.p = rng.normal(o.n);
    o.g = rng.normal(o.n, 0.1f);
    o.m = rng.normal(o.n, 0.1f);
    o.v = rng.uniform(o.n, 0.0f, 0.01f);
    return o;
}

// Returns p, then m (and v). With clip, the grad norm is computed on the device by sum_squares.
std::vector<float> run_sgd(Device& d, const OptCase& o, SgdArgs a) {
    auto p = upload(d, o.p), g = upload(d, o.g), m = upload(d, o.m);
    DeviceBuffer<float> norm(d, 2);
    sum_squares(d, d.compute_stream(), o.n, g.data(), nullptr, norm.data());
    if (a.clip_norm > 0) a.grad_stats = norm.data();
    sgd_update(d, d.compute_stream(), o.n, p.data(), g.data(), m.data(), a);
    auto out = download(d, p);
    auto mh = download(d, m);
    out.insert(out.end(), mh.begin(), mh.end());
    return out;
}
std::vector<double> ref_sgd(const OptCase& o, const SgdArgs& a) {
    double sq = 0;
    for (float g : o.g) sq += double(g) * g;
    const double norm = std::sqrt(sq);
    const double clip = a.clip_norm > 0 && norm > a.clip_norm ? a.clip_norm / (norm + 1e-6) : 1.0;
    std::vector<double> p(o.n), m(o.n);
    for (size_t i = 0; i < o.n; ++i) {
        double d = o.g[i] * clip + double(a.weight_decay) * o.p[i];
        m[i] = o.m[i];
        if (a.momentum != 0) {
            m[i] = a.momentum * double(o.m[i]) + d;
            d = a.nesterov ? d + a.momentum * m[i] : m[i];
        }
        p[i] = o.p[i] - double(a.lr) * d;
    }
    p.insert(p.end(), m.begin(), m.end());
    return p;
}

std::vector<float> run_adamw(Device& d, const OptCase& o, AdamWArgs a) {
    auto p = upload(d, o.p), g = upload(d, o.g), m = upload(d, o.m), v = upload(d, o.v);
    DeviceBuffer<float> norm(d, 2);
    sum_squares(d, d.compute_stream(), o.n, g.data(), nullptr, norm.data());
    if (a.clip_norm > 0) a.grad_stats = norm.data();
    adamw_update(d, d.compute_stream(), o.n, p.data(), g.data(), m.data(), v.data(), a);
    auto out = download(d, p);
    for (auto* b : {&m, &v}) {
        auto h = download(d, *b);
        out.insert(out.end(), h.begin(), h.end());
    }
    return out;
}
std::vector<double> ref_adamw(const OptCase& o, const AdamWArgs& a) {
    double sq = 0;
    for (float g : o.g) sq += double(g) * g;
    const double norm = std::sqrt(sq);
    const double clip = a.clip_norm > 0 && norm > a.clip_norm ? a.clip_norm / (norm + 1e-6) : 1.0;
    const double bc1 = 1 - std::pow(double(a.beta1), double(a.step));
    const double bc2 = 1 - std::pow(double(a.beta2), double(a.step));
    std::vector<double> p(o.n), m(o.n), v(o.n);
    for (size_t i = 0; i < o.n; ++i) {
        const double g = o.g[i] * clip;
        m[i] = a.beta1 * double(o.m[i]) + (1 - double(a.beta1)) * g;
        v[i] = a.beta2 * double(o.v[i]) + (1 - double(a.beta2)) * g * g;
        const double denom = std::sqrt(v[i]) / std::sqrt(bc2) + a.eps;
        p[i] = o.p[i] * (1 - double(a.lr) * a.weight_decay) - double(a.lr) / bc1 * m[i] / denom;
    }
    p.insert(p.end(), m.begin(), m.end());
    p.insert(p.end(), v.begin(), v.end());
    return p;
}

std::vector<float> run_dropout(Device& d, const DropoutArgs& a, int rows, int cols, const std::vector<float>& x,
                               bool backward) {
    auto xb = upload(d, x);
    auto y = poisoned(d, x.size());
    if (backward) dropout_backward(d, d.compute_stream(), a, rows, cols, xb.data(), y.data());
    else dropout_forward(d, d.compute_stream(), a, rows, cols, xb.data(), y.data());
    return download(d, y);
}

std::vector<float> run_init(Device& d, const InitArgs& a, size_t n) {
    auto out = poisoned(d, n);
    init_param_values(d, d.compute_stream(), a, n, out.data());
    return download(d, out);
}

uint64_t run_checksum(Device& d, const std::vector<float>& x) {
    auto xb = upload(d, x);
    DeviceBuffer<uint64_t> out(d, 1);
    checksum_floats(d, d.compute_stream(), x.size(), xb.data(), out.data());
    return download(d, out)[0];
}

// Exercises fill, scale, axpy, sum_squares in sequence.
std::vector<float> run_flat_ops(Device& d, const std::vector<float>& x, const std::vector<float>& y) {
    auto xb = upload(d, x), yb = upload(d, y);
    auto f = poisoned(d, x.size());
    fill_floats(d, d.compute_stream(), x.size(), 0.25f, f.data());
    scale_floats(d, d.compute_stream(), x.size(), -1.5f, xb.data());
    axpy_floats(d, d.compute_stream(), x.size(), 0.75f, xb.data(), yb.data());
    auto sq = poisoned(d, 2);
    sum_squares(d, d.compute_stream(), y.size(), yb.data(), nullptr, sq.data());
    auto out = download(d, f);
    for (auto* b : {&xb, &yb, &sq}) {
        auto h = download(d, *b);
        out.insert(out.end(), h.begin(), h.end());
    }
    return out;
}
std::vector<double> ref_flat_ops(const std::vector<float>& x, const std::vector<float>& y) {
    std::vector<double> out(x.size(), 0.25);
    std::vector<double> xs(x.size()), ys(y.size());
    double sq = 0;
    for (size_t i = 0; i < x.size(); ++i) {
        xs[i] = -1.5 * x[i];
        ys[i] = y[i] + 0.75 * xs[i];
        sq += ys[i] * ys[i];
    }
    out.insert(out.end(), xs.begin(), xs.end());
    out.insert(out.end(), ys.begin(), ys.end());
    out.push_back(sq);
    out.push_back(0.0);  // non-finite count
    return out;
}

template <typename F>
void for_cpu_and_cuda(F&& f) {
    auto cpu = make_cpu_device(0);
    auto gpu = make_cuda_device(0);
    f(*cpu, *gpu);
}

}  // namespace

// ============================ CPU backend vs double reference ============================

TEST_CASE("cpu gemm matches double reference for every transpose combination") {
    Rng rng(1);
    auto d = make_cpu_device(0);
    for (int rep = 0; rep < 3; ++rep)
        for (bool ta : {false, true})
            for (bool tb : {false, true}) {
                const GemmCase g = make_gemm(rng, ta, tb);
                CAPTURE(ta);
                CAPTURE(tb);
                CAPTURE(g.m);
                CAPTURE(g.n);
                CAPTURE(g.k);
                CHECK(rel_error(run_gemm(*d, g), ref_gemm(g)) < 1e-5 * std::sqrt(g.k));
            }
}

// A Dense forward's product (few rows, B transposed, beta 0) is computed by the CPU backend as its
// transpose and transposed back: every leading dimension honoured, the padding beyond each row of
// C untouched, on both sides of the size floor and the 128-row limit of that path.
TEST_CASE("cpu gemm with few rows and a transposed B matches double reference, leading dimensions padded") {
    Rng rng(7);
    auto d = make_cpu_device(0);
    struct Shape {
        int m, n, k;
    };
    for (const Shape s :
         {Shape{64, 300, 40}, Shape{128, 129, 64}, Shape{1, 700, 800}, Shape{16, 64, 64}, Shape{200, 300, 40}}) {
        CAPTURE(s.m);
        CAPTURE(s.n);
        CAPTURE(s.k);
        const int lda = s.k + 3, ldb = s.k + 5, ldc = s.n + 7;
        GemmCase g{false, true, s.m, s.n, s.k, 1.5f, 0.0f, rng.normal(size_t(s.m) * s.k), rng.normal(size_t(s.n) * s.k),
                   {}};
        const std::vector<float> a = padded(g.a, s.m, s.k, lda, NAN), b = padded(g.b, s.n, s.k, ldb, NAN);
        std::vector<float> c = padded(std::vector<float>(size_t(s.m) * s.n, NAN), s.m, s.n, ldc, 42.0f);
        gemm(*d, d->compute_stream(), false, true, s.m, s.n, s.k, g.alpha, a.data(), lda, b.data(), ldb, 0.0f, c.data(),
             ldc);
        bool padding_kept = false;
        const std::vector<float> got = unpadded(c, s.m, s.n, ldc, 42.0f, padding_kept);
        CHECK(padding_kept);
        CHECK(rel_error(got, ref_gemm(g)) < 1e-5 * std::sqrt(s.k));
    }
}

// A^T B with a tall A and a small C (a first convolution's weight gradient) goes through the
// JIT kernel as its transpose, B^T A, transposed back into C: beta 0 and 1, leading dimensions
// padded, the padding beyond each row of C untouched.
TEST_CASE("cpu gemm A^T B computed as its transpose: accumulation and leading dimensions") {
    Rng rng(8);
    auto d = make_cpu_device(0);
    struct Shape {
        int m, n, k;
    };
    for (const Shape s : {Shape{32, 9, 14112}, Shape{40, 17, 5000}, Shape{512, 31, 520}}) {
        for (const float beta : {0.0f, 1.0f}) {
            CAPTURE(s.m);
            CAPTURE(s.n);
            CAPTURE(s.k);
            CAPTURE(beta);
            const int lda = s.m + 3, ldb = s.n + 5, ldc = s.n + 7;
            GemmCase g{true,
                       false,
                       s.m,
                       s.n,
                       s.k,
                       1.0f,
                       beta,
                       rng.normal(size_t(s.k) * s.m),
                       rng.normal(size_t(s.k) * s.n),
                       rng.normal(size_t(s.m) * s.n)};
            const std::vector<float> a = padded(g.a, s.k, s.m, lda, NAN), b = padded(g.b, s.k, s.n, ldb, NAN);
            std::vector<float> c = padded(g.c0, s.m, s.n, ldc, 42.0f);
            gemm(*d, d->compute_stream(), true, false, s.m, s.n, s.k, 1.0f, a.data(), lda, b.data(), ldb, beta,
                 c.data(), ldc);
            bool padding_kept = false;
            const std::vector<float> got = unpadded(c, s.m, s.n, ldc, 42.0f, padding_kept);
            CHECK(padding_kept);
            CHECK(rel_error(got, ref_gemm(g)) < 1e-5 * std::sqrt(s.k));
        }
    }
}

namespace {

// A row-major product with alpha 1 (beta 1 when it adds to C) on fresh operands, stored with every
// row padded - A [m,k] or [k,m] and B [k,n] or [n,k] with NaN, C [m,n] with 42 - so that a kernel
// reading or writing outside its rows shows.
struct ProductCase {
    bool ta, tb;
    int m, n, k;
    bool accumulate;
};
struct PaddedProduct {
    GemmCase g;
    ProductShape shape;
    std::vector<float> a, b;
    PaddedProduct(Rng& rng, ProductCase p) : PaddedProduct(rng, p.ta, p.tb, p.m, p.n, p.k, p.accumulate) {}
    PaddedProduct(Rng& rng, bool ta, bool tb, int m, int n, int k, bool accumulate)
        : g{ta,
            tb,
            m,
            n,
            k,
            1.0f,
            accumulate ? 1.0f : 0.0f,
            rng.normal(size_t(m) * k),
            rng.normal(size_t(k) * n),
            rng.normal(size_t(m) * n)} {
        const int a_rows = ta ? k : m, a_cols = ta ? m : k, b_rows = tb ? n : k, b_cols = tb ? k : n;
        shape = {ta, tb, m, n, k, a_cols + 3, b_cols + 5, n + 7, accumulate};
        a = padded(g.a, a_rows, a_cols, shape.lda, NAN);
        b = padded(g.b, b_rows, b_cols, shape.ldb, NAN);
    }
    std::vector<float> c() const { return padded(g.c0, g.m, g.n, shape.ldc, 42.0f); }
    // C as a kernel left it: its padding untouched, its values the reference's within the tolerance
    void check(const std::vector<float>& c) const {
        bool padding_kept = false;
        const std::vector<float> got = unpadded(c, g.m, g.n, shape.ldc, 42.0f, padding_kept);
        CHECK(padding_kept);
        CHECK(rel_error(got, ref_gemm(g)) < 1e-5 * std::sqrt(g.k));
    }
};

}  // namespace

// Products through kernels generated for their shape (kernels/cpu/jit_gemm.h): each layout they
// take, beta 0 and 1, leading dimensions padded and the padding untouched, sizes that are not a
// multiple of the vector width, and products cut into several row panels; and the rules of this
// CPU's vector width (the fallback where products are not timed: kernels/cpu/gemm_choice.h).
TEST_CASE("cpu gemm through JIT-generated kernels matches double reference, leading dimensions padded") {
    const std::string jit = jit_gemm_description();
    if (jit.empty()) {
        CHECK_FALSE(jit_gemm_takes(false, true, 64, 512, 784, false));
        CHECK_FALSE(jit_gemm_any_shape(false, false, 8, 8, 8, nullptr, 8, nullptr, 8, false, nullptr, 8));
        CHECK(jit_gemm_vector_floats() == 0);
        mark_skipped("no JIT GEMM kernels in this build or on this CPU (libxsmm, AVX2 or AVX-512)");
        return;
    }
    Rng rng(11);
    for (const ProductCase s : std::initializer_list<ProductCase>{{false, true, 64, 300, 40, false},
                                                                  {false, true, 37, 300, 784, false},
                                                                  {false, true, 128, 70, 1100, false},
                                                                  {true, false, 45, 67, 64, false},
                                                                  {true, false, 20, 300, 1024, true},
                                                                  {true, false, 256, 784, 63, true},
                                                                  {false, false, 64, 300, 1024, false},
                                                                  {false, false, 50, 33, 17, true},
                                                                  {false, false, 3, 1024, 5, true},
                                                                  {false, true, 1, 27, 9, false}}) {
        const PaddedProduct p(rng, s);
        INFO(product_text(p.shape));
        const ProductShape& q = p.shape;
        std::vector<float> c = p.c();
        REQUIRE(jit_gemm_multiplies(s.ta, s.tb, s.m, s.n, s.k, s.accumulate));
        REQUIRE(jit_gemm_any_shape(s.ta, s.tb, s.m, s.n, s.k, p.a.data(), q.lda, p.b.data(), q.ldb, s.accumulate,
                                   c.data(), q.ldc));
        p.check(c);
    }
    // B transposed with C added: the kernels cannot (the product is transposed into C)
    CHECK_FALSE(jit_gemm_multiplies(false, true, 64, 512, 784, true));
    CHECK_FALSE(jit_gemm_takes(false, true, 64, 512, 784, true));
    CHECK_FALSE(jit_gemm_any_shape(false, true, 8, 8, 8, nullptr, 8, nullptr, 8, true, nullptr, 8));
    // The rules measured for each vector width (docs/PERFORMANCE.md). On AVX-512 they take the
    // default MLP's products (a replica's 64 rows through 784-512-256); on AVX2 the parts that do
    // not depend on the cache sizes: a 64-row forward's transposed rows (200 KB) are more than
    // any L1 holds; B's rows 4 KiB apart, and result widths off the 8-float vector, stay with
    // OpenBLAS; up to 16 rows of A B, or 32 of A B^T, go to the kernels.
    CAPTURE(jit);
    REQUIRE((jit_gemm_vector_floats() == 8 || jit_gemm_vector_floats() == 16));
    if (jit_gemm_vector_floats() == 16) {
        CHECK(jit_gemm_takes(false, true, 64, 512, 784, false));   // forward
        CHECK(jit_gemm_takes(true, false, 512, 784, 64, false));   // weight gradient
        CHECK(jit_gemm_takes(false, false, 64, 512, 256, false));  // input gradient
    } else {
        CHECK_FALSE(jit_gemm_takes(false, true, 64, 512, 784, false));
        CHECK_FALSE(jit_gemm_takes(false, false, 64, 1024, 64, false));
        CHECK_FALSE(jit_gemm_takes(false, false, 8, 1024, 64, false));
        CHECK_FALSE(jit_gemm_takes(false, false, 64, 27, 64, false));
        CHECK(jit_gemm_takes(false, false, 16, 1000, 784, false));
        CHECK(jit_gemm_takes(false, true, 32, 1024, 784, false));
    }
}

namespace {

// Sets an environment variable for a scope, then puts back what was there.
class ScopedEnv {
public:
    ScopedEnv(const char* name, const std::string& value) : name_(name) {
        if (const char* old = std::getenv(name)) old_ = old;
        ::setenv(name, value.c_str(), 1);
    }
    ~ScopedEnv() {
        if (old_) ::setenv(name_, old_->c_str(), 1);
        else ::unsetenv(name_);
    }

private:
    const char* name_;
    std::optional<std::string> old_;
};

}  // namespace

// Each kernel a CPU replica's product can run through (kernels/cpu/gemm_choice.h), on every
// layout, beta 0 and 1, leading dimensions padded: all agree with the reference; where one cannot
// multiply a product it says so and leaves C alone.
TEST_CASE("cpu GEMM kernels per product: every kernel that fits matches double reference, the others refuse") {
    Rng rng(12);
    std::map<GemmKernel, int> ran;
    for (const ProductCase s : std::initializer_list<ProductCase>{{false, true, 64, 300, 40, false},
                                                                  {false, true, 200, 70, 33, false},
                                                                  {false, true, 20, 64, 17, true},
                                                                  {true, false, 45, 67, 64, false},
                                                                  {true, false, 32, 9, 1500, true},
                                                                  {true, false, 256, 784, 63, true},
                                                                  {false, false, 64, 300, 100, false},
                                                                  {false, false, 50, 33, 17, true},
                                                                  {true, true, 9, 11, 13, false},
                                                                  {false, true, 1, 27, 9, false},
                                                                  {false, true, 200, 64, 3000, true},
                                                                  {true, false, 300, 70, 1000, false},
                                                                  {true, false, 384, 128, 2048, true}}) {
        const PaddedProduct p(rng, s);
        INFO(product_text(p.shape));
        CHECK(gemm_kernel_fits(GemmKernel::openblas, p.shape));
        for (GemmKernel k : kGemmKernels) {
            CAPTURE(gemm_kernel_name(k));
            std::vector<float> c = p.c();
            if (!gemm_kernel_fits(k, p.shape)) {
                CHECK_FALSE(run_gemm_kernel(k, p.shape, p.a.data(), p.b.data(), c.data()));
                CHECK(c == p.c());
                continue;
            }
            REQUIRE(run_gemm_kernel(k, p.shape, p.a.data(), p.b.data(), c.data()));
            ++ran[k];
            p.check(c);
        }
    }
    // OpenBLAS as asked fits every product, turned the two with B transposed, nothing added and at
    // most 128 rows; the JIT kernels, where they are, most
    CHECK(ran[GemmKernel::openblas] == 13);
    CHECK(ran[GemmKernel::openblas_turned] == 2);
    // the few-rows kernels, where the CPU has them and the JIT kernels are in use: every product with
    // at most 64 rows on the batch side (m, or k for A^T B) and not both operands transposed
    CHECK(ran[GemmKernel::few_rows] == (few_rows_gemm_available() && !jit_gemm_description().empty() ? 7 : 0));
    if (!jit_gemm_description().empty()) {
        CHECK(ran[GemmKernel::jit] >= 6);
        CHECK(ran[GemmKernel::jit_turned] >= 2);
        // the products with B transposed: over 128 rows, or a small B; added to C or not; the weight
        // in row panels
        CHECK(ran[GemmKernel::jit_weight_turned] == 5);
        // A^T B over more rows than the transposing scratch holds at once: in blocks of rows, a
        // shorter last one (1000 = 2 x 432 + 136; 2048 = 6 x 336 + 32)
        CHECK(ran[GemmKernel::jit_k_blocked] == 2);
        CHECK(jit_gemm_k_block(300, 1000) == 432);
        CHECK(jit_gemm_k_block(384, 2048) == 336);
    }
    CHECK(gemm_kernel_fits(GemmKernel::openblas_turned, {false, true, 64, 300, 40, 40, 40, 300, false}));
    CHECK_FALSE(gemm_kernel_fits(GemmKernel::openblas_turned, {false, true, 64, 300, 40, 40, 40, 300, true}));
    if (jit_gemm_description().empty()) {
        for (GemmKernel k : {GemmKernel::jit, GemmKernel::jit_turned})
            CHECK_FALSE(gemm_kernel_fits(k, {true, false, 32, 9, 1500, 32, 9, 9, false}));
        CHECK_FALSE(gemm_kernel_fits(GemmKernel::jit_weight_turned, {false, true, 200, 64, 40, 40, 40, 64, false}));
        CHECK_FALSE(gemm_kernel_fits(GemmKernel::jit_weight_turned, {false, true, 20, 64, 40, 40, 40, 64, false}));
        CHECK_FALSE(gemm_kernel_fits(GemmKernel::jit_k_blocked, {true, false, 300, 70, 1000, 300, 70, 70, false}));
    } else {
        CHECK(gemm_kernel_fits(GemmKernel::jit, {false, false, 64, 300, 100, 100, 300, 300, false}));
        // A^T too large to transpose into the scratch, B^T not, C small: only turned
        CHECK_FALSE(gemm_kernel_fits(GemmKernel::jit, {true, false, 32, 9, 14112, 32, 9, 9, false}));
        CHECK(gemm_kernel_fits(GemmKernel::jit_turned, {true, false, 32, 9, 14112, 32, 9, 9, false}));
        // ... and in blocks of rows; where A^T fits whole the JIT kernel takes it at once
        CHECK(gemm_kernel_fits(GemmKernel::jit_k_blocked, {true, false, 32, 9, 14112, 32, 9, 9, false}));
        CHECK_FALSE(gemm_kernel_fits(GemmKernel::jit_k_blocked, {true, false, 32, 9, 1500, 32, 9, 9, false}));
        // B turned into the scratch: a small one at any rows, a larger one over 128 rows (under them A
        // and C are turned), within the scratch
        CHECK(gemm_kernel_fits(GemmKernel::jit_weight_turned, {false, true, 20, 64, 40, 40, 40, 64, false}));
        CHECK(gemm_kernel_fits(GemmKernel::jit_weight_turned, {false, true, 200, 300, 400, 400, 400, 300, false}));
        CHECK_FALSE(
            gemm_kernel_fits(GemmKernel::jit_weight_turned, {false, true, 128, 300, 400, 400, 400, 300, false}));
        CHECK_FALSE(
            gemm_kernel_fits(GemmKernel::jit_weight_turned, {false, true, 200, 1024, 512, 512, 512, 1024, false}));
    }
}

// The few-rows kernels (kernels/cpu/few_rows_gemm.h) over their edges: row tiles of 1-4, the last
// strip or block of B a few columns or rows wide, k past A B^T's blocks (with a masked tail) and
// past A B's blocks of 64 rows, C added to or not - the padding (NaN in A and B) never read, C's
// never written. Past 64 rows on the batch side, and with both operands transposed, they refuse.
TEST_CASE("cpu GEMM few-rows kernel: every layout and edge matches double reference; refuses past 64 rows") {
    if (!few_rows_gemm_available() || jit_gemm_description().empty()) {
        CHECK_FALSE(gemm_kernel_fits(GemmKernel::few_rows, {false, true, 16, 64, 64, 64, 64, 64, false}));
        mark_skipped("the few-rows kernels need AVX-512F and the JIT kernels in use");
        return;
    }
    Rng rng(31);
    int ran = 0;
    for (const int rows : {1, 3, 6, 16, 33, 64})
        for (const ProductCase s : std::initializer_list<ProductCase>{{false, true, rows, 13, 1100, false},
                                                                      {false, true, rows, 8, 1100, true},
                                                                      {false, true, rows, 9, 31, false},
                                                                      {false, true, rows, 10, 530, false},
                                                                      {false, true, rows, 11, 16, true},
                                                                      {false, true, rows, 97, 31, true},
                                                                      {false, false, rows, 211, 150, false},
                                                                      {false, false, rows, 40, 70, true},
                                                                      {false, false, rows, 7, 65, true},
                                                                      {true, false, 101, 250, rows, false},
                                                                      {true, false, 7, 75, rows, false},
                                                                      {true, false, 18, 96, rows, true}}) {
            const PaddedProduct p(rng, s);
            INFO(product_text(p.shape));
            std::vector<float> c = p.c();
            REQUIRE(run_gemm_kernel(GemmKernel::few_rows, p.shape, p.a.data(), p.b.data(), c.data()));
            p.check(c);
            ++ran;
        }
    CHECK(ran == 72);  // 6 batch sides x 12 products: tiles of 1-4 rows by 1-6 vectors, each kind
    CHECK(gemm_kernel_fits(GemmKernel::few_rows, {false, true, 64, 4096, 4096, 4096, 4096, 4096, false}));
    CHECK_FALSE(gemm_kernel_fits(GemmKernel::few_rows, {false, true, 65, 4096, 4096, 4096, 4096, 4096, false}));
    CHECK_FALSE(gemm_kernel_fits(GemmKernel::few_rows, {false, false, 65, 4096, 4096, 4096, 4096, 4096, false}));
    CHECK(gemm_kernel_fits(GemmKernel::few_rows, {true, false, 4096, 4096, 64, 4096, 4096, 4096, true}));
    CHECK_FALSE(gemm_kernel_fits(GemmKernel::few_rows, {true, false, 4096, 4096, 65, 4096, 4096, 4096, false}));
    CHECK_FALSE(gemm_kernel_fits(GemmKernel::few_rows, {true, true, 16, 16, 16, 16, 16, 16, false}));
}

// MIRRORED_CACHE_DIR names one folder: made when its parent exists, never a whole path (a typo
// such as /nonexistent/deep must not build a tree); the cache then stays unwritten, the run goes on.
TEST_CASE("machine cache: MIRRORED_CACHE_DIR makes its own folder only, never the path above it") {
    TempDir d;
    {
        const ScopedEnv cache_dir("MIRRORED_CACHE_DIR", d / "missing/deep");
        cache_store("probe.txt", "key", "value");
        CHECK(!std::filesystem::exists(d.path() / "missing"));
        CHECK(!cache_lookup("probe.txt", "key"));
    }
    for (const std::string& dir : {d / "made", d / "slash/"}) {
        CAPTURE(dir);
        const ScopedEnv cache_dir("MIRRORED_CACHE_DIR", dir);
        cache_store("probe.txt", "key", "value");
        CHECK(cache_lookup("probe.txt", "key").value_or("") == "value");
    }
    CHECK(std::filesystem::is_directory(d.path() / "slash"));
}

// MIRRORED_JIT_GEMM=measure: a product's kernel is timed once and kept for the process, read from
// the machine cache where an earlier run measured it (entries checked: one that does not parse, or
// names a kernel that cannot multiply the shape, is measured again and rewritten), and a
// checkpoint's choices, adopted, win over both.
TEST_CASE("cpu GEMM kernel measured per product: once per process, cached per machine, adopted from a checkpoint") {
    TempDir d;
    const ScopedEnv cache_dir("MIRRORED_CACHE_DIR", d / "cache");
    forget_gemm_choices();
    Rng rng(13);
    const ProductShape s{false, true, 64,  300,  40,
                         40,    40,   300, false};  // OpenBLAS and its turn fit, maybe JIT, few-rows
    const std::vector<float> a = rng.normal(64 * 40), b = rng.normal(300 * 40);
    std::vector<float> c(64 * 300);
    const std::string file = d / "cache/gemm-kernels.txt", key = gemm_choice_cache_key(s);
    const auto cached = [&] { return cache_lookup("gemm-kernels.txt", key).value_or(""); };

    const GemmKernel first = measured_gemm_kernel(s, a.data(), b.data(), c.data());
    CHECK(gemm_kernel_fits(first, s));
    const std::string entry = cached();
    CAPTURE(entry);
    CHECK(entry.rfind(std::string(gemm_kernel_name(first)) + " ", 0) == 0);  // the chosen kernel first
    CHECK(entry.find("openblas-turned ") != std::string::npos);              // every kernel measured is listed
    CHECK(measured_gemm_kernel(s, a.data(), b.data(), c.data()) == first);   // never again in this process
    CHECK(gemm_choices_text() == product_text(s) + "=" + gemm_kernel_name(first));

    // a later process reads the cache instead of measuring
    const GemmKernel other = first == GemmKernel::openblas ? GemmKernel::openblas_turned : GemmKernel::openblas;
    std::string full = std::string(gemm_kernel_name(other)) + " 999.0";
    for (GemmKernel k : kGemmKernels)
        if (k != other && gemm_kernel_fits(k, s)) full += std::string(" ") + gemm_kernel_name(k) + " 1.0";
    cache_store("gemm-kernels.txt", key, full);
    forget_gemm_choices();
    CHECK(measured_gemm_kernel(s, a.data(), b.data(), c.data()) == other);
    CHECK(cached() == full);
    // but not an entry that lacks a kernel fitting the shape (one written before it was added)
    const std::string partial = std::string(gemm_kernel_name(other)) + " 999.0";
    cache_store("gemm-kernels.txt", key, partial);
    forget_gemm_choices();
    const GemmKernel again = measured_gemm_kernel(s, a.data(), b.data(), c.data());
    CHECK(cached() != partial);
    CHECK(cached().rfind(std::string(gemm_kernel_name(again)) + " ", 0) == 0);

    // entries not as written are measured again, and replaced
    for (const std::string bad :
         {"jit nan", "bogus 5.0", "openblas 1.0 jit 2.0", "openblas", "openblas 5.0 extra", "", "openblas-turned -3"}) {
        CAPTURE(bad);
        cache_store("gemm-kernels.txt", key, bad);
        forget_gemm_choices();
        const GemmKernel k = measured_gemm_kernel(s, a.data(), b.data(), c.data());
        CHECK(gemm_kernel_fits(k, s));
        CHECK(cached() != bad);
        CHECK(cached().rfind(std::string(gemm_kernel_name(k)) + " ", 0) == 0);
    }
    const ProductShape tn{true, false, 45, 67, 64, 45, 67, 67, false};  // turned OpenBLAS cannot multiply A^T B
    const std::vector<float> ta = rng.normal(45 * 64), tb = rng.normal(64 * 67);
    std::vector<float> tc(45 * 67);
    const std::string tn_key = gemm_choice_cache_key(tn);
    cache_store("gemm-kernels.txt", tn_key, "openblas-turned 999.0");
    forget_gemm_choices();
    CHECK(measured_gemm_kernel(tn, ta.data(), tb.data(), tc.data()) != GemmKernel::openblas_turned);

    // a checkpoint's choices: well-formed entries for kernels that fit are adopted, the rest left out
    forget_gemm_choices();
    const std::string mine = product_text(s) + "=" + gemm_kernel_name(GemmKernel::openblas_turned);
    size_t recorded = 0;
    CHECK(adopt_gemm_choices(mine + ";garbage;tn:1x1x1:1,1,1:0=openblas-turned;nt:64x300x40:40,40,300:1=openblas-"
                                    "turned;nt:64x300x40:40,40,300:0=jit!;;nt:0x1x1:1,1,1:0=openblas",
                             &recorded) == 1);
    CHECK(recorded == 6);  // the empty entry between ";;" is none
    CHECK(measured_gemm_kernel(s, a.data(), b.data(), c.data()) == GemmKernel::openblas_turned);
    CHECK(gemm_choices_text() == mine);
    CHECK(adopt_gemm_choices(gemm_choices_text()) == 1);  // the text round-trips
    CHECK(std::filesystem::exists(file));
    forget_gemm_choices();
}

TEST_CASE("cpu bias_act_forward and act_backward match double reference") {
    Rng rng(2);
    auto d = make_cpu_device(0);
    const ElemCase e = make_elem(rng);
    for (Activation act : kActs)
        for (bool with_bias : {false, true}) {
            CAPTURE(activation_name(act));
            std::vector<double> want(e.z.size() * 2);
            for (int i = 0; i < e.rows; ++i)
                for (int j = 0; j < e.cols; ++j) {
                    const size_t k = size_t(i) * e.cols + j;
                    const double z = double(e.z[k]) + (with_bias ? e.bias[j] : 0.0f);
                    want[k] = float(z);
                    want[e.z.size() + k] = ref_act(act, float(z));
                }
            CHECK(rel_error(run_bias_act(*d, e, act, with_bias), want) < 1e-6);
            std::vector<double> dz(e.z.size());
            for (size_t k = 0; k < dz.size(); ++k) dz[k] = e.dout[k] * ref_act_grad(act, e.z[k]);
            CHECK(rel_error(run_act_backward(*d, e, act), dz) < 1e-6);
        }
}

TEST_CASE("cpu bias_grad matches double reference, with and without accumulation") {
    Rng rng(3);
    auto d = make_cpu_device(0);
    const ElemCase e = make_elem(rng);
    for (bool acc : {false, true}) {
        std::vector<double> want(e.cols);
        for (int j = 0; j < e.cols; ++j) {
            double s = acc ? e.bias[j] : 0.0;
            for (int i = 0; i < e.rows; ++i) s += e.dout[size_t(i) * e.cols + j];
            want[j] = s;
        }
        CHECK(rel_error(run_bias_grad(*d, e, acc), want) < 1e-5);
    }
}

TEST_CASE("cpu dense_forward and dense_weight_grad match double reference (every activation, bias, accumulation)") {
    Rng rng(15);
    auto d = make_cpu_device(0);
    for (int rep = 0; rep < 3; ++rep) {
        const DenseCase c = make_dense(rng, rng.integer(1, 70), rng.integer(1, 40), rng.integer(1, 90));
        for (Activation act : kActs)
            for (bool bias : {false, true})
                for (bool acc : {false, true}) {
                    CAPTURE(activation_name(act));
                    CAPTURE(bias);
                    CAPTURE(acc);
                    // fused asked for: the CPU runs the reference ops all the same
                    const DenseOut got = run_dense(*d, c, act, bias, acc, Precision::fp32, rep == 1);
                    const DenseOut want = ref_dense(c, act, bias, acc);
                    CHECK(rel_error(got.y, want.y) < 1e-5 * std::sqrt(c.inputs));
                    CHECK(rel_error(got.dw, want.dw) < 1e-5 * std::sqrt(c.rows));
                    CHECK(rel_error(got.db, want.db) < 1e-5);
                }
    }
}

TEST_CASE("cpu softmax_xent matches double reference: gradient, loss sum, correct count") {
    Rng rng(4);
    auto d = make_cpu_device(0);
    for (int rep = 0; rep < 6; ++rep) {
        XentCase x = make_xent(rng);
        if (rep >= 3) {  // a vocabulary's width: many blocks of the row's vector lanes and a tail
            x.classes = rng.integer(71, 700);
            x.logits = rng.normal(size_t(x.rows) * x.classes, 3.0f);
            x.labels = rng.labels(x.rows, x.classes);
        }
        if (rep == 5)  // ties: the first of the largest is the prediction
            for (float& v : x.logits) v = std::round(v);
        CAPTURE(x.classes);
        const auto got = run_xent(*d, x);
        const auto want = ref_xent(x);
        const size_t n = x.logits.size();
        CHECK(rel_error(std::vector<float>(got.begin(), got.begin() + n),
                        std::vector<double>(want.begin(), want.begin() + n)) < 1e-5);
        CHECK(std::fabs(got[n] - want[n]) / std::fabs(want[n]) < 1e-5);
        CHECK(got[n + 1] == want[n + 1]);
        CHECK(got[n + 2] == want[n + 2]);
        // without a gradient to write (evaluation): the same loss and count, bit for bit
        auto logits = upload(*d, x.logits);
        auto labels = upload(*d, x.labels);
        auto metrics = upload(*d, std::vector<double>{1.0, 2.0, 3.0, 0.0});
        softmax_xent(*d, d->compute_stream(), x.rows, x.classes, logits.data(), labels.data(), x.scale, nullptr,
                     nullptr, metrics.data());
        const auto m = download(*d, metrics);
        CHECK(float(m[0]) == got[n]);
        CHECK(float(m[1]) == got[n + 1]);
    }
}

TEST_CASE("cpu target_loss (mse, bce) matches double reference; its gradient matches finite differences") {
    Rng rng(41);
    auto d = make_cpu_device(0);
    for (TargetLoss kind : {TargetLoss::mse, TargetLoss::bce})
        for (int rep = 0; rep < 3; ++rep) {
            CAPTURE(int(kind));
            TargetCase x = make_target_case(rng, kind);
            if (kind == TargetLoss::bce && rep == 2)  // logits far out: no overflow, no log(0)
                for (size_t i = 0; i < x.logits.size(); ++i) x.logits[i] = (i % 2 ? 1 : -1) * 90.0f;
            const auto got = run_target_loss(*d, x);
            const auto want = ref_target_loss(x);
            const size_t n = x.logits.size();
            CHECK(rel_error(std::vector<float>(got.begin(), got.begin() + n),
                            std::vector<double>(want.begin(), want.begin() + n)) < 1e-5);
            CHECK(std::fabs(got[n] - want[n]) / std::fabs(want[n]) < 1e-5);
            CHECK(std::fabs(got[n + 1] - want[n + 1]) < 1e-6 * x.rows + 1e-6);
            CHECK(got[n + 2] == want[n + 2]);
        }
    // finite differences of the mean loss (metrics, scaled as the gradient is) against dlogits
    for (TargetLoss kind : {TargetLoss::mse, TargetLoss::bce}) {
        CAPTURE(int(kind));
        TargetCase x = make_target_case(rng, kind);
        x.rows = 4;
        x.n = 5;
        x.logits.resize(20);
        x.targets.resize(20);
        x.scale = 1.0f / float(x.rows);  // the gradient of the loss summed over rows / rows
        const auto grad = run_target_loss(*d, x);
        for (size_t k = 0; k < 20; k += 3) {
            std::vector<float> up = x.logits, down = x.logits;
            const float h = 1e-2f;
            up[k] += h;
            down[k] -= h;
            const double lu = (run_target_loss(*d, x, &up)[20] - 1.0) / x.rows;
            const double ld = (run_target_loss(*d, x, &down)[20] - 1.0) / x.rows;
            CHECK(std::fabs((lu - ld) / (2 * h) - grad[k]) < 2e-3 * std::max(1.0, std::fabs(double(grad[k]))));
        }
    }
}

TEST_CASE("metric accumulators count exactly beyond 2^24 samples (cpu, sim)") {
    for (DeviceType type : {DeviceType::cpu, DeviceType::sim}) {
        CAPTURE(device_type_name(type));
        auto d = backend_of(type).make(0);
        Rng rng(12);
        XentCase x = make_xent(rng);
        x.rows = 3;
        x.logits.resize(size_t(x.rows) * x.classes);
        x.labels.resize(x.rows);
        const double start = 16777216.0;  // 2^24: a float count would stop at this value
        auto logits = upload(*d, x.logits);
        auto labels = upload(*d, x.labels);
        auto metrics = upload(*d, std::vector<double>{0.0, start, start, 0.0});
        for (int i = 0; i < 5; ++i)
            softmax_xent(*d, d->compute_stream(), x.rows, x.classes, logits.data(), labels.data(), 0.0f, nullptr,
                         nullptr, metrics.data());
        const auto m = download(*d, metrics);
        CHECK(m[kMetricCount] == start + 5 * x.rows);
        CHECK(m[kMetricCorrect] >= start);
    }
}

TEST_CASE("cpu flat ops (fill, scale, axpy, sum_squares) match double reference") {
    Rng rng(5);
    auto d = make_cpu_device(0);
    const size_t n = rng.integer(1, 10000);
    const auto x = rng.normal(n), y = rng.normal(n);
    CHECK(rel_error(run_flat_ops(*d, x, y), ref_flat_ops(x, y)) < 1e-5);
    // sum_squares counts the non-finite values in its lanes and in the tail past them, with the
    // loss scale divided out of the sum
    for (size_t len : {size_t(1), size_t(7), size_t(8), size_t(29), size_t(1003)}) {
        CAPTURE(len);
        std::vector<float> v = rng.normal(len);
        double want = 0.0;
        for (float e : v) want += double(e) * double(e) / 16.0;
        auto sums = [&](const std::vector<float>& values) {
            auto vb = upload(*d, values);
            DeviceBuffer<float> scale = upload(*d, std::vector<float>{4.0f}), out = poisoned(*d, 2);
            sum_squares(*d, d->compute_stream(), len, vb.data(), scale.data(), out.data());
            return download(*d, out);
        };
        const std::vector<float> got = sums(v);
        CHECK(got[0] == doctest::Approx(want).epsilon(1e-6));
        CHECK(got[1] == 0.0f);
        v[len - 1] = std::numeric_limits<float>::infinity();
        v[len / 2] = -std::numeric_limits<float>::infinity();
        v[0] = std::numeric_limits<float>::quiet_NaN();
        CHECK(sums(v)[1] == float(std::set<size_t>{0, len / 2, len - 1}.size()));
    }
}

TEST_CASE("cpu sgd update matches double reference (momentum, nesterov, weight decay, clipping)") {
    Rng rng(6);
    auto d = make_cpu_device(0);
    const OptCase o = make_opt(rng);
    for (int variant = 0; variant < 5; ++variant) {
        SgdArgs a;
        a.lr = 0.05f;
        a.momentum = variant == 0 ? 0.0f : 0.9f;
        a.nesterov = variant == 2;
        a.weight_decay = variant >= 3 ? 1e-2f : 0.0f;
        a.clip_norm = variant == 4 ? 0.5f : 0.0f;
        CAPTURE(variant);
        CHECK(rel_error(run_sgd(*d, o, a), ref_sgd(o, a)) < 1e-5);
    }
}

TEST_CASE("cpu adamw update matches double reference (bias correction, decoupled decay, clipping)") {
    Rng rng(7);
    auto d = make_cpu_device(0);
    const OptCase o = make_opt(rng);
    for (int variant = 0; variant < 3; ++variant) {
        AdamWArgs a;
        a.lr = 1e-3f;
        a.weight_decay = variant ? 0.01f : 0.0f;
        a.step = variant == 2 ? 1 : 17;
        a.clip_norm = variant == 2 ? 0.3f : 0.0f;
        CAPTURE(variant);
        CHECK(rel_error(run_adamw(*d, o, a), ref_adamw(o, a)) < 1e-5);
    }
}

TEST_CASE("cpu dropout: keep rate, scaling, backward mask, and shard invariance") {
    Rng rng(8);
    auto d = make_cpu_device(0);
    const int rows = 64, cols = 257;
    const auto x = rng.uniform(size_t(rows) * cols, 0.5f, 1.5f);  // never zero
    DropoutArgs a{0.3f, base_seed(), 4, 11, 0};
    const auto y = run_dropout(*d, a, rows, cols, x, false);
    size_t kept = 0, as_defined = 0;
    for (size_t i = 0; i < x.size(); ++i) {
        const int row = int(i / cols), col = int(i % cols);  // 257 columns: rows start mid-draw
        as_defined += (y[i] != 0.0f) == dropout_keep(a.seed, a.layer_id, dropout_step(a), row, cols, col, a.rate);
        if (y[i] != 0.0f) {
            ++kept;
            CHECK(y[i] == x[i] * (1.0f / 0.7f));  // exactly the scaled input
        }
    }
    CHECK(as_defined == x.size());  // the CPU's row-wise draws decide as the per-element definition
    const double frac = double(kept) / x.size(), sd = std::sqrt(0.7 * 0.3 / x.size());
    CHECK(std::fabs(frac - 0.7) < 5 * sd);
    // backward applies the same mask as forward
    const auto dx = run_dropout(*d, a, rows, cols, x, true);
    CHECK(dx == y);
    // rows [16, 48) run as a shard with row_offset 16 draw the same masks as in the full batch
    DropoutArgs shard = a;
    shard.row_offset = 16;
    const std::vector<float> xs(x.begin() + 16 * cols, x.begin() + 48 * cols);
    const auto ys = run_dropout(*d, shard, 32, cols, xs, false);
    CHECK(ys == std::vector<float>(y.begin() + 16 * cols, y.begin() + 48 * cols));
    // another step draws another mask
    DropoutArgs next = a;
    next.step = 12;
    CHECK(run_dropout(*d, next, rows, cols, x, false) != y);
    // rows far into a huge batch (element counters past 2^32: the counter's high word), and in place
    DropoutArgs far = a;
    far.row_offset = int64_t(1) << 28;
    const auto yf = run_dropout(*d, far, rows, cols, x, false);
    auto in_place = upload(*d, x);
    dropout_forward(*d, d->compute_stream(), far, rows, cols, in_place.data(), in_place.data());
    CHECK(download(*d, in_place) == yf);
    size_t far_as_defined = 0;
    for (size_t i = 0; i < x.size(); ++i)
        far_as_defined +=
            (yf[i] != 0.0f) == dropout_keep(far.seed, far.layer_id, dropout_step(far),
                                            far.row_offset + int64_t(i / cols), cols, int(i % cols), far.rate);
    CHECK(far_as_defined == x.size());
    // rows wider than the in-place path's stack chunk (1024): the same masks in place
    const int wide = 2500;
    const auto xw = rng.uniform(size_t(4) * wide, 0.5f, 1.5f);
    const auto yw = run_dropout(*d, far, 4, wide, xw, false);
    auto wide_in_place = upload(*d, xw);
    dropout_forward(*d, d->compute_stream(), far, 4, wide, wide_in_place.data(), wide_in_place.data());
    CHECK(download(*d, wide_in_place) == yw);
}

TEST_CASE("cpu init_params: bounds and moments of every initialiser, deterministic by seed") {
    auto d = make_cpu_device(0);
    const size_t n = 200000;
    for (InitKind k : {InitKind::he_uniform, InitKind::he_normal, InitKind::glorot_uniform, InitKind::glorot_normal,
                       InitKind::zeros}) {
        CAPTURE(init_kind_name(k));
        InitArgs a{k, base_seed(), 3, 400, 100};
        const auto v = run_init(*d, a, n);
        const double scale = init_scale(a);
        double mean = 0, var = 0, mx = 0;
        for (float x : v) mean += x, mx = std::max(mx, std::fabs(double(x)));
        mean /= n;
        for (float x : v) var += (x - mean) * (x - mean);
        var /= n;
        if (k == InitKind::zeros) {
            CHECK(mx == 0.0);
            continue;
        }
        const double want_var = init_is_normal(k) ? scale * scale : scale * scale / 3.0;
        CHECK(std::fabs(mean) < 5 * std::sqrt(want_var / n));
        CHECK(var == doctest::Approx(want_var).epsilon(0.02));
        if (!init_is_normal(k)) CHECK(mx <= scale);
        CHECK(run_init(*d, a, n) == v);  // same seed, same values
        a.tensor_id = 4;
        CHECK(run_init(*d, a, n) != v);  // another tensor, other values
    }
}

TEST_CASE("cpu checksum: equal buffers agree, one flipped bit disagrees") {
    Rng rng(9);
    auto d = make_cpu_device(0);
    auto x = rng.normal(12345);
    const uint64_t c = run_checksum(*d, x);
    CHECK(run_checksum(*d, x) == c);
    uint32_t bits;
    std::memcpy(&bits, &x[777], 4);
    bits ^= 1u;
    std::memcpy(&x[777], &bits, 4);
    CHECK(run_checksum(*d, x) != c);
    std::swap(x[1], x[2]);
    CHECK(run_checksum(*d, x) != c);
}

TEST_CASE("cpu reduce_from_peer and copy_from_peer between two CPU replicas are exact") {
    Rng rng(10);
    auto a = make_cpu_device(0), b = make_cpu_device(1);
    const auto xa = rng.normal(1001), xb = rng.normal(1001);
    auto ba = upload(*a, xa), bb = upload(*b, xb);
    a->reduce_from_peer(a->comm_stream(), ba.data(), *b, bb.data(), DType::f32, xa.size());
    const auto sum = download(*a, ba);
    for (size_t i = 0; i < xa.size(); ++i) CHECK(sum[i] == xa[i] + xb[i]);
    b->copy_from_peer(b->comm_stream(), bb.data(), *a, ba.data(), xa.size() * sizeof(float));
    CHECK(download(*b, bb) == sum);
}

// The bf16 wire format against a reference built from the bit layout alone: bf16 is the top half
// of an f32, rounded to nearest even.
uint16_t reference_bf16(float x) {
    uint32_t b;
    std::memcpy(&b, &x, 4);
    if (std::isnan(x)) return uint16_t((b >> 16) | 0x40);
    const uint32_t low = b & 0xFFFF, high = b >> 16;
    return uint16_t(high + (low > 0x8000 || (low == 0x8000 && (high & 1))));
}
float reference_bf16_value(uint16_t h) {
    const uint32_t b = uint32_t(h) << 16;
    float x;
    std::memcpy(&x, &b, 4);
    return x;
}

// Every backend's pack_bf16, unpack_bf16 and bf16 reduce_from_peer against the reference: values
// over the whole range (ties, subnormals, infinities, overflow to infinity).
void check_bf16_wire(Device& a, Device& b, Rng& rng) {
    std::vector<float> x = rng.normal(4099);
    for (size_t i = 0; i < x.size(); i += 7) x[i] = std::ldexp(x[i], int(rng.integer(-140, 127)));
    x[0] = 1.0f + 1.0f / 256;  // a tie, rounds to even (down)
    x[1] = 1.0f + 3.0f / 256;  // a tie, rounds up
    x[2] = std::numeric_limits<float>::infinity();
    x[3] = 3.4e38f;  // rounds to infinity
    x[4] = 1e-40f;   // subnormal
    auto f = upload(a, x);
    DeviceBuffer<uint16_t> ha(a, x.size()), hb(b, x.size());
    pack_bf16_values(a, a.comm_stream(), x.size(), f.data(), ha.data());
    a.synchronize();
    std::vector<uint16_t> packed(x.size());
    a.copy_to_host(a.comm_stream(), packed.data(), ha.data(), packed.size() * 2);
    a.synchronize();
    bool same = true;
    for (size_t i = 0; i < x.size(); ++i) same = same && packed[i] == reference_bf16(x[i]);
    CHECK(same);
    // unpack is exact
    DeviceBuffer<float> back(a, x.size());
    unpack_bf16_values(a, a.comm_stream(), x.size(), ha.data(), back.data());
    a.synchronize();
    const auto unpacked = download(a, back);
    same = true;
    for (size_t i = 0; i < x.size(); ++i) same = same && unpacked[i] == reference_bf16_value(packed[i]);
    CHECK(same);
    // peer add: both operands bf16, the sum in f32 rounded once
    const std::vector<float> y = rng.normal(x.size());
    std::vector<uint16_t> py(y.size());
    for (size_t i = 0; i < y.size(); ++i) py[i] = reference_bf16(y[i]);
    b.copy_to_device(b.comm_stream(), hb.data(), py.data(), py.size() * 2);
    b.synchronize();
    a.reduce_from_peer(a.comm_stream(), ha.data(), b, hb.data(), DType::bf16, x.size());
    a.synchronize();
    std::vector<uint16_t> sum(x.size());
    a.copy_to_host(a.comm_stream(), sum.data(), ha.data(), sum.size() * 2);
    a.synchronize();
    same = true;
    for (size_t i = 0; i < x.size(); ++i)
        same = same && sum[i] == reference_bf16(reference_bf16_value(packed[i]) + reference_bf16_value(py[i]));
    CHECK(same);
    CHECK_THROWS_AS(a.reduce_from_peer(a.comm_stream(), ha.data(), b, hb.data(), DType::f16, 4), DeviceError);
}

TEST_CASE("cpu bf16 wire format: pack rounds to nearest even, unpack is exact, peer add rounds once") {
    Rng rng(11);
    auto a = make_cpu_device(0), b = make_cpu_device(1);
    check_bf16_wire(*a, *b, rng);
}

// ================================ CUDA backend vs CPU ====================================

TEST_CASE("cuda gemm matches cpu (fp32 and TF32)" * doctest::test_suite("cuda")) {
    SKIP_WITHOUT_CUDA();
    Rng rng(101);
    for_cpu_and_cuda([&](Device& cpu, Device& gpu) {
        for (bool ta : {false, true})
            for (bool tb : {false, true}) {
                const GemmCase g = make_gemm(rng, ta, tb);
                CAPTURE(ta);
                CAPTURE(tb);
                const auto want = run_gemm(cpu, g);
                CHECK(rel_error(run_gemm(gpu, g), want) < 1e-5 * std::sqrt(g.k));
                CHECK(rel_error(run_gemm(gpu, g, true), want) < 5e-3);
            }
    });
}

// One cuBLAS workspace per device, bound to its compute stream: a product issued on another stream
// is refused (on a GPU it could overlap a compute-stream product in the same workspace).
TEST_CASE("cuda gemm only on the compute stream: another stream's product is refused" * doctest::test_suite("cuda")) {
    SKIP_WITHOUT_CUDA();
    auto gpu = make_cuda_device(0);
    DeviceBuffer<float> a(*gpu, 64), b(*gpu, 64), c(*gpu, 64);
    const GemmTypes f32{DType::f32, DType::f32, DType::f32};
    for (Stream s : {gpu->comm_stream(), gpu->copy_stream()}) {
        CHECK_THROWS_WITH_AS(
            gemm(*gpu, s, false, false, 8, 8, 8, 1.0f, a.data(), 8, b.data(), 8, 0.0f, c.data(), 8, f32),
            doctest::Contains("other than the compute stream"), DeviceError);
        CHECK_THROWS_AS(gemm_batched(*gpu, s, false, false, 4, 4, 4, 1.0f, a.data(), 4, 16, b.data(), 4, 16, 0.0f,
                                     c.data(), 4, 16, 2, f32),
                        DeviceError);
    }
    gemm(*gpu, gpu->compute_stream(), false, false, 8, 8, 8, 1.0f, a.data(), 8, b.data(), 8, 0.0f, c.data(), 8, f32);
    gpu->synchronize();
}

// The CUDA column reductions' row split is host logic: every row in exactly one chunk, no empty
// chunk, partial sums within the scratch, and enough blocks for a GPU where there are rows to split.
TEST_CASE("column_plan: row chunks cover every row once, fit the scratch and fill the GPU") {
    using namespace mirrored::cuda;
    constexpr size_t kScratch = size_t(1) << 20;
    for (int rows : {0, 1, 300, 512, 513, 1000, 2048, 4099, 70000, 131072, 2000000, 2147483647})
        for (int cols : {1, 3, 16, 37, 1024, 5000, 300000}) {
            CAPTURE(rows);
            CAPTURE(cols);
            const ColumnPlan p = column_plan(rows, cols, kScratch);
            const long long covered = static_cast<long long>(p.chunks) * p.chunk_rows;
            REQUIRE(p.chunks >= 1);
            CHECK(p.chunk_rows >= 1);
            CHECK(covered >= rows);
            CHECK(static_cast<long long>(p.chunks - 1) * p.chunk_rows < std::max(rows, 1));
            if (rows <= kColumnOnePassRows) CHECK(p.chunks == 1);
            if (p.chunks > 1) {
                CHECK(2 * size_t(p.chunks) * cols <= kScratch);
                CHECK(p.chunks <= kColumnMaxChunks);
                CHECK(p.chunk_rows >= kColumnMinChunkRows);
            }
        }
    const auto blocks = [](int rows, int cols) {
        return column_plan(rows, cols, kScratch).chunks * ((cols + kColumnTile - 1) / kColumnTile);
    };
    CHECK(blocks(2048, 1024) >= 256);                 // the MLP's bias gradient at batch 2048 (32 blocks in one pass)
    CHECK(blocks(131072, 16) >= 512);                 // 16 channels over 128 x 32 x 32 rows (1 block in one pass)
    CHECK(blocks(256, 1024) == 32);                   // batch 256: one pass, no second launch
    CHECK(column_plan(131072, 16, 100).chunks == 3);  // a small scratch bounds the chunks
}

TEST_CASE("cuda bias_act_forward, act_backward, bias_grad match cpu" * doctest::test_suite("cuda")) {
    SKIP_WITHOUT_CUDA();
    Rng rng(102);
    for_cpu_and_cuda([&](Device& cpu, Device& gpu) {
        const ElemCase e = make_elem(rng);
        for (Activation act : kActs) {
            CAPTURE(activation_name(act));
            CHECK(rel_error(run_bias_act(gpu, e, act, true), run_bias_act(cpu, e, act, true)) < 1e-6);
            CHECK(rel_error(run_bias_act(gpu, e, act, false), run_bias_act(cpu, e, act, false)) < 1e-6);
            CHECK(rel_error(run_act_backward(gpu, e, act), run_act_backward(cpu, e, act)) < 1e-5);
        }
        for (bool acc : {false, true}) CHECK(rel_error(run_bias_grad(gpu, e, acc), run_bias_grad(cpu, e, acc)) < 1e-5);
        // many rows: one pass up to 512 rows, then row chunks and a second kernel (column_plan.h)
        for (const auto& [rows, cols] : {std::pair{512, 37}, {513, 37}, {4099, 37}, {2048, 1030}, {70001, 3}}) {
            CAPTURE(rows);
            CAPTURE(cols);
            ElemCase tall = e;
            tall.rows = rows;
            tall.cols = cols;
            tall.dout = rng.normal(size_t(tall.rows) * tall.cols);
            tall.bias = rng.normal(tall.cols);
            // two float sums of `rows` terms in different orders differ by about eps * sqrt(rows)
            // of the sum (70001 rows: 1.4e-5 seen)
            const double tol = std::max(1e-5, 2e-7 * std::sqrt(double(rows)));
            for (bool acc : {false, true})
                CHECK(rel_error(run_bias_grad(gpu, tall, acc), run_bias_grad(cpu, tall, acc)) < tol);
        }
    });
}

// cuBLASLt epilogues: fp32 and TF32 against the CPU; bf16 against the unfused CUDA ops on the
// same stored inputs (the fused product rounds y once, the unfused twice: 2e-2). Where a forward is
// fusable and its sizes are multiples of 8, the fused product must have been taken (one launch).
TEST_CASE("cuda dense ops with cuBLASLt epilogues (strategy.fused_epilogues) match cpu; one launch where fused" *
          doctest::test_suite("cuda")) {
    SKIP_WITHOUT_CUDA();
    Rng rng(105);
    auto cpu = make_cpu_device(0);
    auto gpu = make_cuda_device(0);
    const bool emulated = gpu->description().rfind("emulated GPU", 0) == 0;
    const int shapes[][3] = {{64, 1024, 784}, {256, 10, 1024}, {8, 16, 24}, {7, 37, 13}, {1, 5, 3}};
    for (const auto& sh : shapes) {
        const DenseCase c = make_dense(rng, sh[0], sh[1], sh[2]);
        const bool aligned = sh[0] % 8 == 0 && sh[1] % 8 == 0 && sh[2] % 8 == 0;
        for (Activation act : kActs)
            for (bool bias : {false, true})
                for (bool acc : {false, true}) {
                    CAPTURE(sh[0]);
                    CAPTURE(sh[1]);
                    CAPTURE(sh[2]);
                    CAPTURE(activation_name(act));
                    CAPTURE(bias);
                    CAPTURE(acc);
                    const DenseOut want = run_dense(*cpu, c, act, bias, acc, Precision::fp32, false);
                    const bool fuse_fwd = fusable_dense_forward(act, bias);
                    const bool fuse_grad = fusable_dense_weight_grad(bias, acc);
                    for (Precision p : {Precision::fp32, Precision::tf32}) {
                        CAPTURE(precision_name(p));
                        const DenseOut got = run_dense(*gpu, c, act, bias, acc, p, true);
                        const double tol = p == Precision::tf32 ? 5e-3 : 1e-5;
                        CHECK(rel_error(got.y, want.y) < tol * std::sqrt(c.inputs));
                        CHECK(rel_error(got.dw, want.dw) < tol * std::sqrt(c.rows));
                        CHECK(rel_error(got.db, want.db) < tol * std::sqrt(c.rows));
                        // cuBLASLt documents the epilogues without promising an algorithm for
                        // every f32/TF32 case; where it has none the op runs unfused (the results
                        // are checked above): on a GPU a reported result (the check script keeps
                        // every case's output), not a failure. The emulated cuBLASLt has them all.
                        if (aligned && fuse_fwd && got.forward_launches != 1) {
                            if (emulated) CHECK(got.forward_launches == 1);
                            else
                                MESSAGE("no cuBLASLt " << (bias ? "RELU_BIAS/BIAS" : "RELU") << " algorithm for "
                                                       << precision_name(p) << ": the forward runs unfused");
                        }
                        if (aligned && fuse_grad && got.grad_launches != 1) {
                            if (emulated) CHECK(got.grad_launches == 1);
                            else
                                MESSAGE("no cuBLASLt BGRADB algorithm for " << precision_name(p)
                                                                            << ": the bias gradient runs unfused");
                        }
                        if (!fuse_fwd) CHECK(got.forward_launches == (act == Activation::none && !bias ? 1u : 2u));
                        if (!fuse_grad) CHECK(got.grad_launches == (bias ? 2u : 1u));
                    }
                    const DenseOut unfused = run_dense(*gpu, c, act, bias, acc, Precision::bf16, false);
                    const DenseOut fused = run_dense(*gpu, c, act, bias, acc, Precision::bf16, true);
                    CHECK(rel_error(fused.y, unfused.y) < 2e-2);
                    CHECK(rel_error(fused.dw, unfused.dw) < 1e-5 * std::sqrt(c.rows));
                    CHECK(rel_error(fused.db, unfused.db) < 1e-5 * std::sqrt(c.rows));
                    if (aligned && act == Activation::relu && bias && !acc)
                        MESSAGE("bf16 fused: forward " << fused.forward_launches << " launch(es), weight gradient "
                                                       << fused.grad_launches);
                }
    }
}

TEST_CASE("cuda softmax_xent matches cpu, argmax count exactly" * doctest::test_suite("cuda")) {
    SKIP_WITHOUT_CUDA();
    Rng rng(103);
    for_cpu_and_cuda([&](Device& cpu, Device& gpu) {
        for (int rep = 0; rep < 4; ++rep) {
            XentCase x = make_xent(rng);
            if (rep == 3) {  // more classes than a warp has lanes
                x.classes = 1000;
                x.logits = rng.normal(size_t(x.rows) * x.classes, 3.0f);
                x.labels = rng.labels(x.rows, x.classes);
            }
            const auto g = run_xent(gpu, x), c = run_xent(cpu, x);
            const size_t n = x.logits.size();
            CHECK(rel_error(std::vector<float>(g.begin(), g.begin() + n),
                            std::vector<float>(c.begin(), c.begin() + n)) < 1e-5);
            CHECK(std::fabs(g[n] - c[n]) / std::fabs(c[n]) < 1e-5);
            CHECK(g[n + 1] == c[n + 1]);
            CHECK(g[n + 2] == c[n + 2]);
        }
    });
}

TEST_CASE("cuda target_loss (mse, bce) matches cpu" * doctest::test_suite("cuda")) {
    SKIP_WITHOUT_CUDA();
    Rng rng(141);
    for_cpu_and_cuda([&](Device& cpu, Device& gpu) {
        for (TargetLoss kind : {TargetLoss::mse, TargetLoss::bce})
            for (int rep = 0; rep < 3; ++rep) {
                CAPTURE(int(kind));
                TargetCase x = make_target_case(rng, kind);
                if (rep == 2) {  // more outputs than a warp has lanes
                    x.n = 300;
                    x = make_target_case(rng, kind);
                    x.n = 300;
                    x.logits = rng.normal(size_t(x.rows) * x.n, 3.0f);
                    x.targets = rng.uniform(x.logits.size(), 0.0f, 1.0f);
                }
                const auto g = run_target_loss(gpu, x), c = run_target_loss(cpu, x);
                const size_t n = x.logits.size();
                CHECK(rel_error(std::vector<float>(g.begin(), g.begin() + n),
                                std::vector<float>(c.begin(), c.begin() + n)) < 1e-5);
                CHECK(std::fabs(g[n] - c[n]) / std::fabs(c[n]) < 1e-5);
                CHECK(std::fabs(g[n + 1] - c[n + 1]) < 1e-6 * x.rows + 1e-6);
                CHECK(g[n + 2] == c[n + 2]);
            }
    });
}

TEST_CASE("cuda dropout, init_params and checksum match cpu exactly" * doctest::test_suite("cuda")) {
    SKIP_WITHOUT_CUDA();
    Rng rng(104);
    for_cpu_and_cuda([&](Device& cpu, Device& gpu) {
        const int rows = 33, cols = 129;
        const auto x = rng.normal(size_t(rows) * cols);
        DropoutArgs a{0.4f, base_seed(), 2, 5, 1000};
        CHECK(run_dropout(gpu, a, rows, cols, x, false) == run_dropout(cpu, a, rows, cols, x, false));
        CHECK(run_dropout(gpu, a, rows, cols, x, true) == run_dropout(cpu, a, rows, cols, x, true));
        for (InitKind k : {InitKind::he_uniform, InitKind::glorot_uniform})
            CHECK(run_init(gpu, InitArgs{k, base_seed(), 7, 300, 20}, 100003) ==
                  run_init(cpu, InitArgs{k, base_seed(), 7, 300, 20}, 100003));
        for (InitKind k : {InitKind::he_normal, InitKind::glorot_normal})
            CHECK(rel_error(run_init(gpu, InitArgs{k, base_seed(), 7, 300, 20}, 100003),
                            run_init(cpu, InitArgs{k, base_seed(), 7, 300, 20}, 100003)) < 1e-6);
        const auto big = rng.normal(3000017);
        CHECK(run_checksum(gpu, big) == run_checksum(cpu, big));
    });
}

TEST_CASE("cuda flat ops, sgd and adamw match cpu" * doctest::test_suite("cuda")) {
    SKIP_WITHOUT_CUDA();
    Rng rng(105);
    for_cpu_and_cuda([&](Device& cpu, Device& gpu) {
        const size_t n = 1000003;
        const auto x = rng.normal(n), y = rng.normal(n);
        CHECK(rel_error(run_flat_ops(gpu, x, y), run_flat_ops(cpu, x, y)) < 1e-5);
        // sum_squares alone around its grid's limits (a block per 256 elements, at most 256 blocks):
        // the sum, then the count of non-finite values
        for (size_t len :
             {size_t(1), size_t(255), size_t(257), size_t(65535), size_t(65536), size_t(65537), size_t(300001)}) {
            CAPTURE(len);
            std::vector<float> v = rng.normal(len);
            auto sums = [&](Device& d) {
                auto vb = upload(d, v);
                auto out = poisoned(d, 2);
                sum_squares(d, d.compute_stream(), len, vb.data(), nullptr, out.data());
                return download(d, out);
            };
            const std::vector<float> want = sums(cpu), got = sums(gpu);
            CHECK(got[0] == doctest::Approx(want[0]).epsilon(1e-5));
            CHECK(got[1] == 0.0f);
            v[len - 1] = std::numeric_limits<float>::infinity();
            v[0] = std::numeric_limits<float>::quiet_NaN();
            CHECK(sums(gpu)[1] == (len > 1 ? 2.0f : 1.0f));
        }
        const OptCase o = make_opt(rng);
        SgdArgs s;
        s.lr = 0.05f;
        s.momentum = 0.9f;
        s.nesterov = true;
        s.weight_decay = 1e-3f;
        s.clip_norm = 0.5f;
        CHECK(rel_error(run_sgd(gpu, o, s), run_sgd(cpu, o, s)) < 1e-5);
        AdamWArgs a;
        a.weight_decay = 0.01f;
        a.step = 3;
        a.clip_norm = 0.3f;
        CHECK(rel_error(run_adamw(gpu, o, a), run_adamw(cpu, o, a)) < 1e-5);
        // a step's values travel with the call: the host copy may change before the stream runs
        StepValues v{0.125f, 0.5f, 0.75f, 12345u};
        DeviceBuffer<StepValues> on_gpu(gpu, 1);
        set_step_values(gpu, gpu.compute_stream(), v, on_gpu.data());
        v = StepValues{};
        StepValues back;
        gpu.copy_to_host(gpu.compute_stream(), &back, on_gpu.data(), sizeof back);
        gpu.stream_synchronize(gpu.compute_stream());
        CHECK(back.lr == 0.125f);
        CHECK(back.adamw_bc1 == 0.5f);
        CHECK(back.adamw_bc2_sqrt == 0.75f);
        CHECK(back.step == 12345u);
    });
}

TEST_CASE("cuda reduce_from_peer and copy_from_peer are exact (two replicas on GPU 0)" * doctest::test_suite("cuda")) {
    SKIP_WITHOUT_CUDA();
    Rng rng(106);
    auto a = make_cuda_device(0), b = make_cuda_device(0);
    for (size_t n : {size_t(1), size_t(3), size_t(1001), size_t(1) << 20}) {
        const auto xa = rng.normal(n), xb = rng.normal(n);
        auto ba = upload(*a, xa), bb = upload(*b, xb);
        a->synchronize();
        b->synchronize();
        a->reduce_from_peer(a->comm_stream(), ba.data(), *b, bb.data(), DType::f32, n);
        a->synchronize();
        const auto sum = download(*a, ba);
        bool exact = true;
        for (size_t i = 0; i < n; ++i) exact = exact && sum[i] == xa[i] + xb[i];
        CHECK(exact);
        b->copy_from_peer(b->comm_stream(), bb.data(), *a, ba.data(), n * sizeof(float));
        b->synchronize();
        CHECK(download(*b, bb) == sum);
    }
}

TEST_CASE("cuda bf16 wire format matches the bit-level reference (two replicas on GPU 0)" *
          doctest::test_suite("cuda")) {
    SKIP_WITHOUT_CUDA();
    Rng rng(107);
    auto a = make_cuda_device(0), b = make_cuda_device(0);
    check_bf16_wire(*a, *b, rng);
}

// Finite gradients whose squared norm overflows a float (above ~1.8e19 in all): under loss
// scaling the step is skipped and the scale halved, as for a non-finite gradient - the clipping
// factor would otherwise be clip / inf = 0, an update that changes nothing without a word.
TEST_CASE("cpu loss scaling: a squared gradient norm that overflows skips the step and halves the scale") {
    auto d = make_cpu_device(0);
    const std::vector<float> big{3e19f, -3e19f, 1.0f};
    auto g = upload(*d, big), p = upload(*d, std::vector<float>{1, 2, 3}), m = upload(*d, std::vector<float>{0, 0, 0});
    DeviceBuffer<float> stats(*d, 2), state(*d, 2);
    sum_squares(*d, d->compute_stream(), big.size(), g.data(), nullptr, stats.data());
    const auto s = download(*d, stats);
    CHECK(std::isinf(s[0]));
    CHECK(s[1] == 0.0f);  // every gradient is finite
    SgdArgs a;
    a.lr = 0.1f;
    a.clip_norm = 1.0f;
    a.grad_stats = stats.data();
    a.skip_nonfinite = true;
    sgd_update(*d, d->compute_stream(), big.size(), p.data(), g.data(), m.data(), a);
    CHECK(download(*d, p) == std::vector<float>{1, 2, 3});  // skipped
    d->copy_to_device(d->compute_stream(), state.data(), std::vector<float>{1024.0f, 7.0f}.data(), 2 * sizeof(float));
    loss_scale_update(*d, d->compute_stream(), state.data(), stats.data(), 2000);
    CHECK(download(*d, state) == std::vector<float>{512.0f, 0.0f});
}

TEST_CASE("CPU kernels' scratch is counted per thread as it grows") {
    std::vector<uint64_t> grown(2);
    for (int t = 0; t < 2; ++t)
        std::thread([&, t] {
            const uint64_t before = cpu_thread_scratch_bytes();
            std::vector<float> v;
            grow_scratch(v, 1000 * size_t(t + 1));
            grow_scratch(v, 10);                    // never shrinks, never counted twice
            grow_scratch(v, 1500 * size_t(t + 1));  // grows to what is asked, not twice what it held
            grown[size_t(t)] = cpu_thread_scratch_bytes() - before;
            CHECK(grown[size_t(t)] == v.capacity() * sizeof(float));
            CHECK(v.capacity() == 1500 * size_t(t + 1));
        }).join();
    CHECK(grown[0] == 6000);
    CHECK(grown[1] == 12000);
}

namespace {

// The bytes the CPU kernels' scratches grow by on a new thread that runs every kernel fitting
// each of these products, as measuring them does on a replica's first step.
uint64_t scratch_of_every_kernel(Rng& rng, const std::vector<ProductCase>& products) {
    uint64_t grown = 0;
    std::thread([&] {
        const uint64_t before = cpu_thread_scratch_bytes();
        for (const ProductCase& s : products) {
            const PaddedProduct p(rng, s);
            for (GemmKernel k : kGemmKernels) {
                std::vector<float> c = p.c();
                run_gemm_kernel(k, p.shape, p.a.data(), p.b.data(), c.data());
            }
        }
        grown = cpu_thread_scratch_bytes() - before;
    }).join();
    return grown;
}

// A product with a weight [out, in] over `rows`: the forward (B transposed), the input gradient
// and the weight gradient (A transposed).
void add_weight_products(std::vector<ProductCase>& to, int rows, int out, int in) {
    to.push_back({false, true, rows, out, in, false});
    to.push_back({false, false, rows, in, out, false});
    to.push_back({true, false, out, in, rows, false});
}

}  // namespace

// The memory plan's CPU workspace (kernels/backends.cpp) bounds what the kernels' scratches grow
// to when every kernel runs on each of a dense layer's products, at the full micro-batch and at
// the fewer rows of a last batch: several row counts where the plan is not told which it meets
// (128, the turned kernels' limit, among them), else the ones it is told.
TEST_CASE("CPU workspace plan bounds the scratch of every kernel on a dense layer's products") {
    Rng rng(5);
    struct Layer {
        int in, out, micro_rows;
    };
    for (const Layer l : {Layer{784, 512, 128}, Layer{1024, 1024, 256}, Layer{300, 10, 64}, Layer{64, 2048, 1000}})
        for (const bool told : {false, true}) {
            CAPTURE(l.in);
            CAPTURE(l.out);
            CAPTURE(l.micro_rows);
            CAPTURE(told);
            const std::vector<int> met = told ? std::vector<int>{16, l.micro_rows} : std::vector<int>{};
            const uint64_t cells = uint64_t(l.in) * uint64_t(l.out),
                           weight = cells <= kCpuJitWeightMaxFloats ? cells : 0,
                           small = cells <= kCpuJitSmallWeightFloats ? cells : 0;
            WorkspaceNeeds needs{.micro_rows = l.micro_rows,
                                 .widest = uint64_t(std::max(l.in, l.out)),
                                 .product = {uint64_t(l.in), uint64_t(l.out), weight, small},
                                 .rows_met = met};
            const uint64_t plan = backend_of(DeviceType::cpu).workspace_bytes(needs);
            needs.rows_met = {l.micro_rows};
            const uint64_t full_batches_only = backend_of(DeviceType::cpu).workspace_bytes(needs);
            needs.rows_met = {};
            CHECK(full_batches_only <= plan);
            CHECK(plan <= backend_of(DeviceType::cpu).workspace_bytes(needs));
            if (l.micro_rows > 128) CHECK(full_batches_only < plan);  // only a last batch's 16 rows are turned
            std::vector<ProductCase> products;
            for (const int rows : told ? met : std::vector<int>{l.micro_rows, 128, 100, 16, 1})
                if (rows <= l.micro_rows) add_weight_products(products, rows, l.out, l.in);
            const uint64_t grown = scratch_of_every_kernel(rng, products);
            CHECK(grown > 0);
            CHECK(grown <= plan);
        }
}

// The same through a model's own plan (Model::product_widths, sequence_positions, plan_memory):
// a sequence flattened before a dense head, whose products inside run over 16 positions per
// sample although the model's input and output are not sequences of more than one position; its
// attention's per-head products have one sample's positions as rows.
TEST_CASE("CPU workspace plan of a model bounds every kernel's scratch on its products") {
    Rng rng(6);
    // a short context, and one whose attention products (positions by positions) outgrow its
    // rows by the widest weight
    for (const auto& [t, micro] : {std::pair{16, 2}, std::pair{512, 1}}) {
        CAPTURE(t);
        const int dim = 32, heads = 2;
        const Model m({t},
                      {make_layer_spec("embedding", {{"vocab", "40"}, {"dim", std::to_string(dim)}}),
                       make_layer_spec("transformer_block", {{"heads", std::to_string(heads)}}),
                       make_layer_spec("flatten"), make_layer_spec("dense", {{"units", "5"}})},
                      3);
        CHECK(m.sequence_positions() == t);
        std::vector<ProductCase> products;
        for (const TensorInfo& w : m.tensors())
            if (w.trainable && w.shape.size() == 2 && w.name.find("wte") == std::string::npos) {
                const bool head = w.shape[1] == t * dim;  // the dense head after flatten: a row per sample
                add_weight_products(products, head ? micro : micro * t, w.shape[0], w.shape[1]);
            }
        const int hd = dim / heads;  // scores Q K^T, then (scores) V, and their gradients
        products.push_back({false, true, t, t, hd, false});
        products.push_back({false, false, t, hd, t, false});
        products.push_back({true, false, t, hd, t, false});
        products.push_back({true, false, t, t, hd, false});
        const StrategyConfig sc;
        const uint64_t plan = plan_memory(m, OptimizerConfig{}, sc, backend_of(DeviceType::cpu), 1, micro, micro, false,
                                          sizeof(int32_t), nullptr, {micro})
                                  .workspace;
        const uint64_t grown = scratch_of_every_kernel(rng, products);
        CHECK(grown > 0);
        CHECK(grown <= plan);
    }
}
