// The Llama block's own ops: rotary position embeddings (kernels/ops/rope.h) and the SwiGLU gate
// (kernels/ops/swiglu.h). The CPU loops against double-precision definitions (the rotation at
// Hugging Face's f32 angles; SwiGLU's backward also by central differences), the simulated GPU
// bit for bit against the CPU, and the CUDA kernels against the CPU on fresh random inputs with
// outputs poisoned first. Tolerances (normalised max error, tests/helpers.h rel_error):
//   rope: CPU vs double 1e-6; inverse(rotate(x)) vs x 1e-6; CUDA vs CPU 1e-5 fp32, 1e-2 bf16
//   swiglu: CPU vs double 1e-6; backward vs central differences 1e-4; CUDA vs CPU 1e-5 fp32, 1e-2 bf16
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "base/error.h"
#include "kernels/device.h"
#include "kernels/op_math.h"
#include "kernels/ops/rope.h"
#include "kernels/ops/swiglu.h"
#include "tests/helpers.h"
#include "kernels/ops/elementwise.h"

using namespace mirrored;
using namespace mirrored::test;

namespace {

// values stored in the device's storage type, converted from and to f32 around an op
struct Stored {
    Device& d;
    DeviceBuffer<unsigned char> data;
    size_t n;
    Stored(Device& dev, const std::vector<float>& v) : d(dev), data(dev, dev.act_bytes(v.size())), n(v.size()) {
        DeviceBuffer<float> f = upload(d, v);
        convert_values(d, d.compute_stream(), n, f.data(), DType::f32, data.data(), d.act_dtype());
    }
    std::vector<float> get() const {
        DeviceBuffer<float> f(d, n);
        convert_values(d, d.compute_stream(), n, data.data(), d.act_dtype(), f.data(), DType::f32);
        return download(d, f);
    }
};

std::vector<float> rounded(std::vector<float> v, DType t) {
    for (float& e : v) e = round_to(t, e);
    return v;
}

// ---- rope --------------------------------------------------------------------------------------

RopeShape random_shape(Rng& rng) {
    RopeShape r;
    r.samples = rng.integer(1, 3);
    r.t = rng.integer(1, 40);
    r.first_position = rng.integer(0, 1) ? rng.integer(0, 3000) : 0;
    r.head_dim = 2 * rng.integer(1, 40);
    r.heads = rng.integer(1, 5);
    r.row_width = r.heads * r.head_dim + rng.integer(0, 1) * 3 * r.head_dim;  // v heads after q and k: untouched
    r.theta = rng.integer(0, 1) ? 10000.0f : 500000.0f;
    if (const int k = rng.integer(0, 2); k > 0) {  // rope_scaling: linear or Llama 3.1's
        r.scaling.kind = k == 1 ? RopeScaling::Kind::linear : RopeScaling::Kind::llama3;
        r.scaling.factor = k == 1 ? 4.0f : 8.0f;
        r.scaling.original_positions = 512;
    }
    return r;
}

std::vector<double> rope_ref(const RopeShape& r, const std::vector<float>& x, bool inverse) {
    std::vector<double> y(x.begin(), x.end());
    const RopeFrequencies f = rope_frequencies(r.theta, r.head_dim, r.scaling);
    const int half = r.head_dim / 2;
    for (int64_t row = 0; row < int64_t(r.samples) * r.t; ++row)
        for (int h = 0; h < r.heads; ++h)
            for (int e = 0; e < half; ++e) {
                const double angle = double(float(r.first_position + int(row % r.t)) * f.f[e]);  // f32, as HF
                const double c = std::cos(angle), s = (inverse ? -1 : 1) * std::sin(angle);
                const size_t a = size_t(row) * r.row_width + size_t(h) * r.head_dim + e, b = a + half;
                y[a] = double(x[a]) * c - double(x[b]) * s;
                y[b] = double(x[b]) * c + double(x[a]) * s;
            }
    return y;
}

std::vector<float> rope_on(Device& d, const RopeShape& r, const std::vector<float>& x, bool inverse) {
    Stored s(d, x);
    rope_rotate(d, d.compute_stream(), r, inverse, s.data.data());
    return s.get();
}

// ---- swiglu ------------------------------------------------------------------------------------

double sig(double g) { return 1.0 / (1.0 + std::exp(-g)); }

std::vector<double> swiglu_ref(int rows, int w, const std::vector<double>& gu) {
    std::vector<double> out(size_t(rows) * w);
    for (int r = 0; r < rows; ++r)
        for (int j = 0; j < w; ++j) {
            const double g = gu[size_t(r) * 2 * w + j], u = gu[size_t(r) * 2 * w + w + j];
            out[size_t(r) * w + j] = g * sig(g) * u;
        }
    return out;
}

struct SwigluOut {
    std::vector<float> out, dgu;
};

SwigluOut swiglu_on(Device& d, int rows, int w, const std::vector<float>& gu, const std::vector<float>& dout) {
    Stored x(d, gu), g(d, dout), y(d, std::vector<float>(size_t(rows) * w, std::nanf(""))),
        dx(d, std::vector<float>(gu.size(), std::nanf("")));
    swiglu_forward(d, d.compute_stream(), rows, w, x.data.data(), y.data.data());
    swiglu_backward(d, d.compute_stream(), rows, w, x.data.data(), g.data.data(), dx.data.data());
    return {y.get(), dx.get()};
}

}  // namespace

TEST_CASE("cpu rope against the double rotation at f32 angles; inverse undoes it; v heads untouched") {
    Rng rng(801);
    auto d = make_cpu_device(0);
    for (int rep = 0; rep < 12; ++rep) {
        const RopeShape r = random_shape(rng);
        CAPTURE(r.head_dim);
        CAPTURE(r.first_position);
        const std::vector<float> x = rng.normal(size_t(r.samples) * r.t * r.row_width);
        const std::vector<float> y = rope_on(*d, r, x, false);
        CHECK(rel_error(y, rope_ref(r, x, false)) < 1e-6);
        CHECK(rel_error(rope_on(*d, r, y, true), x) < 1e-6);
        for (size_t i = 0; i < x.size(); ++i)  // columns past the rotated heads keep their bits
            if (int(i % size_t(r.row_width)) >= r.heads * r.head_dim) CHECK(y[i] == x[i]);
    }
    // position 0 is the identity; Hugging Face's frequencies (1 / theta^(2e/d) in f32)
    RopeShape r{1, 1, 0, 8, 1, 8, 10000.0f, {}};
    const std::vector<float> x = rng.normal(8);
    CHECK(rope_on(*d, r, x, false) == x);
    const RopeFrequencies f = rope_frequencies(10000.0f, 8);
    CHECK(f.f[0] == 1.0f);
    CHECK(f.f[1] == doctest::Approx(0.1));
    CHECK(f.f[3] == doctest::Approx(0.001));
}

TEST_CASE("rope_scaling: linear divides every frequency; llama3 keeps high, slows low, blends the band between") {
    // head width 16, theta 500000: wavelengths 2 pi / f from 6.3 to about 1e6 positions; an original
    // context of 512 with factors 1 and 4 puts 2 pi, 32 under 128 (kept), 167 between and the rest
    // over 512 (divided by 8)
    const RopeFrequencies plain = rope_frequencies(500000.0f, 16);
    RopeScaling linear;
    linear.kind = RopeScaling::Kind::linear;
    linear.factor = 4.0f;
    const RopeFrequencies lin = rope_frequencies(500000.0f, 16, linear);
    RopeScaling llama3;
    llama3.kind = RopeScaling::Kind::llama3;
    llama3.factor = 8.0f;
    llama3.original_positions = 512;
    const RopeFrequencies l3 = rope_frequencies(500000.0f, 16, llama3);
    int kept = 0, slowed = 0, blended = 0;
    for (int e = 0; e < 8; ++e) {
        CAPTURE(e);
        CHECK(lin.f[e] == plain.f[e] / 4.0f);
        const double wavelength = 2 * M_PI / plain.f[e];
        if (wavelength < 128) {
            CHECK(l3.f[e] == plain.f[e]);
            ++kept;
        } else if (wavelength > 512) {
            CHECK(l3.f[e] == plain.f[e] / 8.0f);
            ++slowed;
        } else {  // (512 / wavelength - 1) / (4 - 1) of the way from f / 8 to f
            const double s = (512 / wavelength - 1) / 3;
            CHECK(l3.f[e] == doctest::Approx((1 - s) * plain.f[e] / 8 + s * plain.f[e]).epsilon(1e-6));
            ++blended;
        }
    }
    CHECK(kept == 2);
    CHECK(blended == 1);
    CHECK(slowed == 5);
}

TEST_CASE("rope refuses what it cannot rotate, on the caller's thread") {
    auto d = make_cpu_device(0);
    const auto refused = [&](RopeShape r, const char* what) {
        CHECK_THROWS_WITH_AS(rope_rotate(*d, {}, r, false, nullptr), doctest::Contains(what), Error);
    };
    refused(RopeShape{1, 4, 0, 12, 2, 5, 10000.0f, {}}, "must be even");
    refused(RopeShape{1, 4, 0, 600, 1, 300, 10000.0f, {}}, "at most 256");
    refused(RopeShape{1, 4, 0, 12, 3, 8, 10000.0f, {}}, "run past the row");
    refused(RopeShape{1, 4, 0, 8, 1, 8, 1.0f, {}}, "theta must be");
    refused(RopeShape{1, 4, (1 << 24) - 2, 8, 1, 8, 10000.0f, {}}, "positions past 2^24");
}

TEST_CASE("cpu swiglu against double; its backward against central differences") {
    Rng rng(802);
    auto d = make_cpu_device(0);
    for (const int w : {1, 7, 16, 45}) {
        const int rows = rng.integer(1, 9);
        std::vector<float> gu = rng.normal(size_t(rows) * 2 * w, 3.0f);
        gu[0] = 95.0f;  // past exp_poly's clamp both ways: silu(g) = g and 0, no overflow
        if (gu.size() > 2) gu[1] = -95.0f;
        const std::vector<float> dout = rng.normal(size_t(rows) * w);
        const SwigluOut got = swiglu_on(*d, rows, w, gu, dout);
        const std::vector<double> x(gu.begin(), gu.end());
        CHECK(rel_error(got.out, swiglu_ref(rows, w, x)) < 1e-6);
        std::vector<double> fd(x.size());
        for (size_t i = 0; i < x.size(); ++i) {
            const double h = 1e-4 * std::max(1.0, std::fabs(x[i]));
            auto p = x, m = x;
            p[i] += h, m[i] -= h;
            const auto up = swiglu_ref(rows, w, p), down = swiglu_ref(rows, w, m);
            double l = 0;
            for (size_t k = 0; k < up.size(); ++k) l += double(dout[k]) * (up[k] - down[k]);
            fd[i] = l / (2 * h);
        }
        CHECK(rel_error(got.dgu, fd) < 1e-4);
    }
}

TEST_CASE("rope and swiglu on a simulated GPU equal the cpu bit for bit, fp32 and bf16") {
    Rng rng(803);
    auto cpu = make_cpu_device(0);
    auto sim = make_sim_device(0);
    for (const Precision p : {Precision::fp32, Precision::bf16}) {
        cpu->set_precision(p);
        sim->set_precision(p);
        const DType t = cpu->value_dtype();
        const RopeShape r = random_shape(rng);
        const std::vector<float> x = rounded(rng.normal(size_t(r.samples) * r.t * r.row_width), t);
        CHECK(rope_on(*cpu, r, x, false) == rope_on(*sim, r, x, false));
        CHECK(rope_on(*cpu, r, x, true) == rope_on(*sim, r, x, true));
        const int rows = rng.integer(1, 20), w = rng.integer(1, 70);
        const std::vector<float> gu = rounded(rng.normal(size_t(rows) * 2 * w, 2.0f), t),
                                 dout = rounded(rng.normal(size_t(rows) * w), t);
        const SwigluOut a = swiglu_on(*cpu, rows, w, gu, dout), b = swiglu_on(*sim, rows, w, gu, dout);
        CHECK(a.out == b.out);
        CHECK(a.dgu == b.dgu);
    }
}

TEST_CASE("cuda rope and swiglu match cpu: fp32, bf16 storage" * doctest::test_suite("cuda")) {
    SKIP_WITHOUT_CUDA();
    Rng rng(804);
    auto cpu = make_cpu_device(0);
    auto gpu = make_cuda_device(0);
    for (const Precision p : {Precision::fp32, Precision::bf16}) {
        cpu->set_precision(p);
        gpu->set_precision(p);
        const DType t = cpu->value_dtype();
        const double tol = t == DType::f32 ? 1e-5 : 1e-2;  // bf16: one rounding apart at most
        for (int rep = 0; rep < 4; ++rep) {
            RopeShape r = random_shape(rng);
            if (rep == 3) r.samples = 40, r.t = 512, r.first_position = 0;  // a grid of many blocks
            const std::vector<float> x = rounded(rng.normal(size_t(r.samples) * r.t * r.row_width), t);
            CHECK(rel_error(rope_on(*gpu, r, x, false), rope_on(*cpu, r, x, false)) < tol);
            CHECK(rel_error(rope_on(*gpu, r, x, true), rope_on(*cpu, r, x, true)) < tol);
            const int rows = rep == 3 ? 5000 : rng.integer(1, 50), w = rng.integer(1, 300);
            const std::vector<float> gu = rounded(rng.normal(size_t(rows) * 2 * w, 2.0f), t),
                                     dout = rounded(rng.normal(size_t(rows) * w), t);
            const SwigluOut a = swiglu_on(*gpu, rows, w, gu, dout), b = swiglu_on(*cpu, rows, w, gu, dout);
            CHECK(rel_error(a.out, b.out) < tol);
            CHECK(rel_error(a.dgu, b.dgu) < tol);
        }
    }
}
