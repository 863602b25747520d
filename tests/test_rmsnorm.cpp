// RMSNorm (kernels/ops/rmsnorm.h): the CPU loops against a double-precision definition, the
// backward against central differences of that definition, the simulated GPU bit for bit against
// the CPU, and the CUDA kernels against the CPU on fresh random inputs with outputs poisoned first.
// Tolerances (normalised max error, tests/helpers.h rel_error):
//   CPU forward vs double                      1e-5 (f32 sums in eight lanes)
//   CPU backward vs central differences        2e-4 (step 1e-3 of a double forward: truncation)
//   simulated GPU vs CPU                       exact, fp32 and bf16
//   CUDA vs CPU                                1e-5 fp32; bf16 storage 1e-2 (one rounding apart)
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/device.h"
#include "kernels/op_math.h"
#include "kernels/ops/rmsnorm.h"
#include "tests/helpers.h"
#include "kernels/ops/elementwise.h"

using namespace mirrored;
using namespace mirrored::test;

namespace {

constexpr float kEps = 1e-6f;

struct RmsCase {
    int rows, c;
    std::vector<float> x, dy, gamma, dgamma0;
};

RmsCase make_case(Rng& rng, int rows, int c) {
    RmsCase n{
        rows,         c, rng.normal(size_t(rows) * c, 2.0f), rng.normal(size_t(rows) * c), rng.uniform(c, 0.5f, 1.5f),
        rng.normal(c)};
    return n;
}

// y of the definition, in double, and each row's rstd into *rstd where given.
std::vector<double> ref_forward(const RmsCase& n, const std::vector<double>& x, const std::vector<double>& gamma,
                                std::vector<double>* rstd = nullptr) {
    std::vector<double> y(x.size());
    if (rstd) rstd->assign(size_t(n.rows), 0.0);
    for (int r = 0; r < n.rows; ++r) {
        double q = 0;
        for (int j = 0; j < n.c; ++j) q += x[size_t(r) * n.c + j] * x[size_t(r) * n.c + j];
        const double rs = 1.0 / std::sqrt(q / n.c + double(kEps));
        if (rstd) (*rstd)[size_t(r)] = rs;
        for (int j = 0; j < n.c; ++j) y[size_t(r) * n.c + j] = gamma[j] * (x[size_t(r) * n.c + j] * rs);
    }
    return y;
}

struct RmsOut {
    std::vector<float> y, rstd, dx, dgamma;
    std::vector<float> all() const {
        std::vector<float> v = y;
        for (const auto* p : {&rstd, &dx, &dgamma}) v.insert(v.end(), p->begin(), p->end());
        return v;
    }
};

// forward, then backward with dgamma accumulated onto n.dgamma0 (or written over it); activations
// (x, dy, y, dx) in the device's storage type, converted from and to f32 around the ops
RmsOut run(Device& d, const RmsCase& n, bool with_dx = true, bool accumulate = true) {
    const Stream s = d.compute_stream();
    const DType t = d.act_dtype();
    const size_t count = n.x.size();
    const auto stored = [&](const DeviceBuffer<float>& f) {
        DeviceBuffer<unsigned char> a(d, d.act_bytes(f.size()));
        convert_values(d, s, f.size(), f.data(), DType::f32, a.data(), t);
        return a;
    };
    const auto widened = [&](const DeviceBuffer<unsigned char>& a) {
        DeviceBuffer<float> f(d, count);
        convert_values(d, s, count, a.data(), t, f.data(), DType::f32);
        return download(d, f);
    };
    auto x = stored(upload(d, n.x)), dy = stored(upload(d, n.dy));
    auto y = stored(poisoned(d, count)), dx = stored(poisoned(d, count));
    auto gamma = upload(d, n.gamma), dg = upload(d, n.dgamma0);
    auto rstd = poisoned(d, size_t(n.rows));
    rmsnorm_forward(d, s, n.rows, n.c, kEps, x.data(), gamma.data(), y.data(), rstd.data());
    rmsnorm_backward(d, s, n.rows, n.c, dy.data(), x.data(), rstd.data(), gamma.data(), with_dx ? dx.data() : nullptr,
                     dg.data(), accumulate);
    return {widened(y), download(d, rstd), with_dx ? widened(dx) : std::vector<float>{}, download(d, dg)};
}

// x and dy rounded to t: inputs a 16-bit store holds exactly, the same on every device
RmsCase rounded(RmsCase n, DType t) {
    for (auto* v : {&n.x, &n.dy})
        for (float& e : *v) e = round_to(t, e);
    return n;
}

}  // namespace

TEST_CASE("cpu rmsnorm forward against double; dgamma accumulates; dx may be skipped") {
    Rng rng(701);
    auto d = make_cpu_device(0);
    for (const int c : {1, 7, 8, 13, 64, 77, 4096}) {
        const RmsCase n = make_case(rng, rng.integer(1, 70), c);
        const RmsOut got = run(*d, n);
        const std::vector<double> x(n.x.begin(), n.x.end()), g(n.gamma.begin(), n.gamma.end());
        std::vector<double> rstd;
        CHECK(rel_error(got.y, ref_forward(n, x, g, &rstd)) < 1e-5);
        CHECK(rel_error(got.rstd, rstd) < 1e-5);
        // the same dgamma with dx skipped, and accumulation adds exactly what a fresh sum gives
        const RmsOut no_dx = run(*d, n, false);
        CHECK(std::memcmp(no_dx.dgamma.data(), got.dgamma.data(), got.dgamma.size() * sizeof(float)) == 0);
        RmsCase fresh = n;
        fresh.dgamma0.assign(size_t(c), 0.0f);
        const RmsOut f = run(*d, fresh);
        for (int j = 0; j < c; ++j) CHECK(got.dgamma[j] == n.dgamma0[j] + f.dgamma[j]);
        const RmsOut over = run(*d, n, true, false);  // written over n.dgamma0: the fresh sum
        CHECK(std::memcmp(over.dgamma.data(), f.dgamma.data(), f.dgamma.size() * sizeof(float)) == 0);
    }
}

TEST_CASE("cpu rmsnorm backward matches central differences of the definition") {
    Rng rng(702);
    auto d = make_cpu_device(0);
    for (const int c : {3, 8, 21}) {
        RmsCase n = make_case(rng, rng.integer(1, 5), c);
        n.dgamma0.assign(size_t(c), 0.0f);
        const RmsOut got = run(*d, n);
        // L = sum(dy y): dL/dx and dL/dgamma by central differences, in double
        const std::vector<double> x(n.x.begin(), n.x.end()), g(n.gamma.begin(), n.gamma.end());
        const auto loss = [&](const std::vector<double>& xv, const std::vector<double>& gv) {
            const std::vector<double> y = ref_forward(n, xv, gv);
            double l = 0;
            for (size_t i = 0; i < y.size(); ++i) l += double(n.dy[i]) * y[i];
            return l;
        };
        constexpr double h = 1e-3;
        std::vector<double> dx(x.size()), dg(g.size());
        for (size_t i = 0; i < x.size(); ++i) {
            auto p = x, m = x;
            p[i] += h, m[i] -= h;
            dx[i] = (loss(p, g) - loss(m, g)) / (2 * h);
        }
        for (size_t j = 0; j < g.size(); ++j) {
            auto p = g, m = g;
            p[j] += h, m[j] -= h;
            dg[j] = (loss(x, p) - loss(x, m)) / (2 * h);
        }
        CHECK(rel_error(got.dx, dx) < 2e-4);
        CHECK(rel_error(got.dgamma, dg) < 2e-4);
    }
}

TEST_CASE("rmsnorm on a simulated GPU equals the cpu bit for bit, fp32 and bf16") {
    Rng rng(703);
    auto cpu = make_cpu_device(0);
    auto sim = make_sim_device(0);
    for (const Precision p : {Precision::fp32, Precision::bf16}) {
        cpu->set_precision(p);
        sim->set_precision(p);
        const RmsCase n = rounded(make_case(rng, rng.integer(30, 90), rng.integer(1, 100)), cpu->value_dtype());
        const std::vector<float> a = run(*cpu, n).all(), b = run(*sim, n).all();
        REQUIRE(a.size() == b.size());
        CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
    }
}

TEST_CASE("cuda rmsnorm matches cpu: fp32, bf16 storage, many rows" * doctest::test_suite("cuda")) {
    SKIP_WITHOUT_CUDA();
    Rng rng(704);
    auto cpu = make_cpu_device(0);
    auto gpu = make_cuda_device(0);
    for (int rep = 0; rep < 4; ++rep) {
        const RmsCase n = rep == 3 ? make_case(rng, 70000, 3)  // several chunks in dgamma's column reduction
                                   : make_case(rng, rng.integer(1, 300), rng.integer(1, 200));
        for (const bool accumulate : {true, false}) {
            const RmsOut g = run(*gpu, n, true, accumulate), c = run(*cpu, n, true, accumulate);
            CHECK(rel_error(g.y, c.y) < 1e-5);
            CHECK(rel_error(g.rstd, c.rstd) < 1e-5);
            CHECK(rel_error(g.dx, c.dx) < 1e-5);
            CHECK(rel_error(g.dgamma, c.dgamma) < 1e-5);
        }
    }
    cpu->set_precision(Precision::bf16);
    gpu->set_precision(Precision::bf16);
    for (int rep = 0; rep < 3; ++rep) {
        const RmsCase n = rounded(make_case(rng, rng.integer(1, 300), rng.integer(1, 200)), DType::bf16);
        const RmsOut g = run(*gpu, n), c = run(*cpu, n);
        CHECK(rel_error(g.y, c.y) < 1e-2);  // one bf16 rounding apart at most
        CHECK(rel_error(g.dx, c.dx) < 1e-2);
        CHECK(rel_error(g.rstd, c.rstd) < 1e-5);
        CHECK(rel_error(g.dgamma, c.dgamma) < 1e-5);
    }
}
