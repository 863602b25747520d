// The convolutional, normalisation and precision ops: the CPU backend against naive
// double-precision references, and the CUDA backend against the CPU on fresh random inputs with
// outputs poisoned first. Tolerances (normalised max error, tests/helpers.h rel_error):
//   op                                   CPU vs double ref   CUDA vs CPU
//   im2col, nhwc_to_nchw, max pool       exact               exact
//   col2im, avg pool, pool backward      1e-6                1e-5 (sum order)
//   channel_sums, batchnorm ops          1e-5                1e-4 (f32 trees vs f64)
//   layernorm forward/backward           1e-5                1e-4
//   bf16/fp16 rounding (convert)         exact (round to nearest even, overflow to inf, subnormals)
//   bf16/fp16 storage on CUDA            -                   the CPU emulation's values, 1e-2 x |value|
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/ops/conv.h"
#include "kernels/ops/batchnorm.h"
#include "kernels/device.h"
#include "kernels/op_math.h"
#include "kernels/ops/layernorm.h"
#include "kernels/ops/optimizer.h"
#include "kernels/ops/flat.h"
#include "tests/helpers.h"
#include "kernels/ops/elementwise.h"
#include "kernels/ops/activation.h"

using namespace mirrored;
using namespace mirrored::test;

namespace {

Window2d random_window(Rng& rng) {
    Window2d g;
    g.n = rng.integer(1, 3);
    g.h = rng.integer(3, 9);
    g.w = rng.integer(3, 9);
    g.c = rng.integer(1, 5);
    g.kh = rng.integer(1, 3);
    g.kw = rng.integer(1, 3);
    g.sh = rng.integer(1, 2);
    g.sw = rng.integer(1, 2);
    g.ph = rng.integer(0, g.kh / 2);
    g.pw = rng.integer(0, g.kw / 2);
    return g;
}

size_t image_size(const Window2d& g) { return size_t(g.n) * g.h * g.w * g.c; }
size_t cols_size(const Window2d& g) { return size_t(g.n) * g.oh() * g.ow() * g.c * g.kh * g.kw; }
size_t pooled_size(const Window2d& g) { return size_t(g.n) * g.oh() * g.ow() * g.c; }

// The input element a column entry reads, or -1 for padding.
long source_of(const Window2d& g, size_t col_index) {
    const size_t K = size_t(g.c) * g.kh * g.kw;
    const size_t m = col_index / K, k = col_index % K;
    const int c = int(k / (g.kh * g.kw)), ky = int(k % (g.kh * g.kw)) / g.kw, kx = int(k % g.kw);
    const int ox = int(m % g.ow()), oy = int((m / g.ow()) % g.oh()), n = int(m / (size_t(g.ow()) * g.oh()));
    const int iy = oy * g.sh + ky - g.ph, ix = ox * g.sw + kx - g.pw;
    if (iy < 0 || iy >= g.h || ix < 0 || ix >= g.w) return -1;
    return long(((size_t(n) * g.h + iy) * g.w + ix) * g.c + c);
}

std::vector<float> run_im2col(Device& d, const Window2d& g, const std::vector<float>& x) {
    auto xb = upload(d, x);
    auto col = poisoned(d, cols_size(g));
    im2col(d, d.compute_stream(), g, xb.data(), col.data());
    return download(d, col);
}
std::vector<float> run_col2im(Device& d, const Window2d& g, const std::vector<float>& dcol) {
    auto db = upload(d, dcol);
    auto dx = poisoned(d, image_size(g));
    col2im(d, d.compute_stream(), g, db.data(), dx.data());
    return download(d, dx);
}
std::vector<float> run_pool(Device& d, PoolKind k, const Window2d& g, const std::vector<float>& x,
                            const std::vector<float>& dy) {
    auto xb = upload(d, x), dyb = upload(d, dy);
    auto y = poisoned(d, pooled_size(g)), dx = poisoned(d, image_size(g));
    pool_forward(d, d.compute_stream(), k, g, xb.data(), y.data());
    pool_backward(d, d.compute_stream(), k, g, xb.data(), dyb.data(), dx.data());
    auto out = download(d, y);
    const auto dxh = download(d, dx);
    out.insert(out.end(), dxh.begin(), dxh.end());
    return out;
}

struct NormCase {
    int rows, c;
    std::vector<float> x, dy, gamma, beta;
};
// min_c: layernorm normalises over the channels, and two or three nearly equal values give a
// variance far below epsilon, where float against double differs by the conditioning, not a bug.
NormCase make_norm(Rng& rng, int min_c = 1) {
    NormCase n{rng.integer(2, 300), rng.integer(min_c, 40), {}, {}, {}, {}};
    n.x = rng.normal(size_t(n.rows) * n.c, 2.0f);
    for (auto& v : n.x) v += 3.0f;  // an offset: the two-pass statistics must not care
    n.dy = rng.normal(size_t(n.rows) * n.c);
    n.gamma = rng.uniform(n.c, 0.5f, 1.5f);
    n.beta = rng.normal(n.c);
    return n;
}

// Batchnorm in training: statistics, running contributions, output, backward sums and dx.
std::vector<float> run_batchnorm(Device& d, const NormCase& n) {
    const Stream s = d.compute_stream();
    auto x = upload(d, n.x), dy = upload(d, n.dy), gamma = upload(d, n.gamma), beta = upload(d, n.beta);
    DeviceBuffer<float> sum(d, n.c), sq(d, n.c), mean(d, n.c), invstd(d, n.c), sums(d, 2 * n.c);
    auto rm = upload(d, std::vector<float>(n.c, 0.5f)), rv = upload(d, std::vector<float>(n.c, 0.25f));
    auto y = poisoned(d, n.x.size()), dx = poisoned(d, n.x.size());
    const BnStats a{n.c, double(n.rows), 1e-5f, 0.5f};
    channel_sums(d, s, n.rows, n.c, x.data(), nullptr, false, sum.data());
    bn_finalize(d, s, a, sum.data(), nullptr, mean.data(), nullptr, nullptr, nullptr);
    channel_sums(d, s, n.rows, n.c, x.data(), mean.data(), true, sq.data());
    bn_finalize(d, s, a, sum.data(), sq.data(), mean.data(), invstd.data(), rm.data(), rv.data());
    channel_affine(d, s, Activation::none, n.rows, n.c, x.data(), mean.data(), invstd.data(), gamma.data(), beta.data(),
                   y.data());
    bn_backward_sums(d, s, n.rows, n.c, dy.data(), x.data(), mean.data(), invstd.data(), sums.data());
    bn_backward_dx(d, s, n.rows, n.c, dy.data(), x.data(), mean.data(), invstd.data(), gamma.data(), sums.data(),
                   double(n.rows), dx.data());
    std::vector<float> out;
    for (auto* b : {&mean, &invstd, &rm, &rv, &y, &sums, &dx}) {
        const auto h = download(d, *b);
        out.insert(out.end(), h.begin(), h.end());
    }
    return out;
}

std::vector<double> ref_batchnorm(const NormCase& n) {
    const int C = n.c, R = n.rows;
    std::vector<double> mean(C, 0), var(C, 0);
    for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) mean[size_t(c)] += n.x[size_t(r) * C + c];
    for (auto& m : mean) m /= R;
    for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) var[size_t(c)] += std::pow(n.x[size_t(r) * C + c] - mean[size_t(c)], 2);
    for (auto& v : var) v /= R;
    std::vector<double> invstd(C), rm(C), rv(C), y(n.x.size()), s0(C, 0), s1(C, 0), dx(n.x.size());
    for (int c = 0; c < C; ++c) {
        invstd[size_t(c)] = 1 / std::sqrt(var[size_t(c)] + 1e-5);
        rm[size_t(c)] = 0.5 + 0.5 * mean[size_t(c)];
        rv[size_t(c)] = 0.25 + 0.5 * var[size_t(c)] * R / (R - 1);
    }
    for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) {
            const size_t e = size_t(r) * C + c;
            const double xhat = (n.x[e] - mean[size_t(c)]) * invstd[size_t(c)];
            y[e] = n.gamma[size_t(c)] * xhat + n.beta[size_t(c)];
            s0[size_t(c)] += n.dy[e];
            s1[size_t(c)] += n.dy[e] * xhat;
        }
    for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) {
            const size_t e = size_t(r) * C + c;
            const double xhat = (n.x[e] - mean[size_t(c)]) * invstd[size_t(c)];
            dx[e] = n.gamma[size_t(c)] * invstd[size_t(c)] * (n.dy[e] - s0[size_t(c)] / R - xhat * s1[size_t(c)] / R);
        }
    std::vector<double> out;
    for (auto* v : {&mean, &invstd, &rm, &rv, &y}) out.insert(out.end(), v->begin(), v->end());
    out.insert(out.end(), s0.begin(), s0.end());
    out.insert(out.end(), s1.begin(), s1.end());
    out.insert(out.end(), dx.begin(), dx.end());
    return out;
}

std::vector<float> run_layernorm(Device& d, const NormCase& n) {
    const Stream s = d.compute_stream();
    auto x = upload(d, n.x), dy = upload(d, n.dy), gamma = upload(d, n.gamma), beta = upload(d, n.beta);
    DeviceBuffer<float> mean(d, n.rows), rstd(d, n.rows);
    auto y = poisoned(d, n.x.size()), dx = poisoned(d, n.x.size());
    auto dg = upload(d, std::vector<float>(n.c, 1.0f)), db = upload(d, std::vector<float>(n.c, 2.0f));
    layernorm_forward(d, s, n.rows, n.c, 1e-5f, x.data(), gamma.data(), beta.data(), y.data(), mean.data(),
                      rstd.data());
    layernorm_backward(d, s, n.rows, n.c, dy.data(), x.data(), mean.data(), rstd.data(), gamma.data(), dx.data(),
                       dg.data(), db.data(), true);
    std::vector<float> out;
    for (auto* b : {&y, &dx, &dg, &db}) {
        const auto h = download(d, *b);
        out.insert(out.end(), h.begin(), h.end());
    }
    return out;
}

std::vector<double> ref_layernorm(const NormCase& n) {
    const int C = n.c, R = n.rows;
    std::vector<double> y(n.x.size()), dx(n.x.size()), dg(C, 1.0), db(C, 2.0);
    for (int r = 0; r < R; ++r) {
        const float* x = &n.x[size_t(r) * C];
        const float* g = &n.dy[size_t(r) * C];
        double m = 0, v = 0;
        for (int c = 0; c < C; ++c) m += x[c];
        m /= C;
        for (int c = 0; c < C; ++c) v += (x[c] - m) * (x[c] - m);
        const double rs = 1 / std::sqrt(v / C + 1e-5);
        double a = 0, b = 0;
        for (int c = 0; c < C; ++c) {
            const double xhat = (x[c] - m) * rs;
            y[size_t(r) * C + c] = n.gamma[size_t(c)] * xhat + n.beta[size_t(c)];
            a += n.gamma[size_t(c)] * g[c];
            b += n.gamma[size_t(c)] * g[c] * xhat;
            dg[size_t(c)] += g[c] * xhat;
            db[size_t(c)] += g[c];
        }
        for (int c = 0; c < C; ++c) {
            const double xhat = (x[c] - m) * rs;
            dx[size_t(r) * C + c] = rs * (n.gamma[size_t(c)] * g[c] - a / C - xhat * b / C);
        }
    }
    std::vector<double> out(y);
    out.insert(out.end(), dx.begin(), dx.end());
    out.insert(out.end(), dg.begin(), dg.end());
    out.insert(out.end(), db.begin(), db.end());
    return out;
}

// bf16 round-to-nearest-even in double: the nearest of the two bf16 neighbours, ties to the one
// with an even last bit.
float ref_bf16(float x) {
    if (std::isnan(x)) return x;
    uint32_t b;
    std::memcpy(&b, &x, 4);
    const uint32_t lo = b & 0xFFFF0000u, hi = lo + 0x10000u;
    float fl, fh;
    std::memcpy(&fl, &lo, 4);
    std::memcpy(&fh, &hi, 4);
    const double dl = std::fabs(double(x) - fl), dh = std::fabs(double(fh) - x);
    if (dl < dh) return fl;
    if (dh < dl) return fh;
    return (lo >> 16) & 1 ? fh : fl;
}

}  // namespace

// ============================ CPU backend vs double reference ============================

TEST_CASE("cpu im2col reads exactly the windows' elements; col2im is its adjoint") {
    Rng rng(201);
    auto d = make_cpu_device(0);
    for (int rep = 0; rep < 20; ++rep) {
        Window2d g = random_window(rng);
        if (rep % 2) {  // 3 x 3 windows over many channels: the CPU's unrolled, vectorised rows
            g.kh = g.kw = 3;
            g.c = rng.integer(8, 40);
        }
        if (rep % 5 == 3) {  // padding wider than the window: whole windows and window rows outside
            g.ph = g.kh + rng.integer(0, 1);
            g.pw = g.kw;
        }
        CAPTURE(g.c);
        CAPTURE(g.h);
        CAPTURE(g.kh);
        CAPTURE(g.sh);
        CAPTURE(g.ph);
        const auto x = rng.normal(image_size(g));
        const auto col = run_im2col(*d, g, x);
        bool exact = true;
        for (size_t i = 0; i < col.size(); ++i) {
            const long src = source_of(g, i);
            exact = exact && col[i] == (src < 0 ? 0.0f : x[size_t(src)]);
        }
        CHECK(exact);
        // <col2im(dcol), x> == <dcol, im2col(x)>
        const auto dcol = rng.normal(cols_size(g));
        const auto dx = run_col2im(*d, g, dcol);
        double lhs = 0, rhs = 0, scale = 0;
        for (size_t i = 0; i < x.size(); ++i) lhs += double(dx[i]) * x[i];
        for (size_t i = 0; i < col.size(); ++i) rhs += double(dcol[i]) * col[i], scale += std::fabs(dcol[i] * col[i]);
        CHECK(std::fabs(lhs - rhs) <= 1e-5 * (scale + 1));
        // pixel-major columns: the same entries, (ky, kx, channel) instead of (channel, ky, kx)
        Window2d gp = g;
        gp.pixel_major = true;
        const auto colp = run_im2col(*d, gp, x);
        const size_t kk = size_t(g.kh) * g.kw, K = kk * g.c;
        bool same = colp.size() == col.size();
        for (size_t i = 0; same && i < col.size(); ++i) {
            const size_t m = i / K, k = i % K, c = k / kk, p = k % kk;
            same = colp[m * K + p * g.c + c] == col[i];
        }
        CHECK(same);
        const auto dxp = run_col2im(*d, gp, dcol);
        // and col2im adds the same values in the same order either way: bit for bit
        std::vector<float> dcol_channel_major(dcol.size());
        for (size_t i = 0; i < dcol.size(); ++i) {
            const size_t m = i / K, k = i % K, c = k / kk, p = k % kk;
            dcol_channel_major[i] = dcol[m * K + p * g.c + c];
        }
        CHECK(run_col2im(*d, g, dcol_channel_major) == dxp);
        double lhs_p = 0, rhs_p = 0;
        for (size_t i = 0; i < x.size(); ++i) lhs_p += double(dxp[i]) * x[i];
        for (size_t i = 0; i < colp.size(); ++i) rhs_p += double(dcol[i]) * colp[i];
        CHECK(std::fabs(lhs_p - rhs_p) <= 1e-5 * (scale + 1));
    }
}

// conv_forward (kernels/ops/conv.h): the product of pixel-major columns and wt[kh, kw, c, F] without making
// the columns (CPUs with the JIT kernels; others say no and the layer makes columns).
TEST_CASE("cpu conv_forward, conv_weight_grad, conv_input_grad: the columns' products without the columns") {
    Rng rng(207);
    auto d = make_cpu_device(0);
    int ran = 0, weight_grads = 0, few_channel_weight_grads = 0, input_grads = 0;
    for (int rep = 0; rep < 24; ++rep) {
        Window2d g = random_window(rng);
        g.pixel_major = true;
        if (rep % 2) g.c = rng.integer(16, 40);  // the gradients' kernels want a vector of channels
        if (rep % 5 == 3) g.ph = g.pw = g.kh;    // whole window rows in the padding
        g.pw = std::min(g.pw, g.kw);
        if (rep == 23) {  // 32 x 32 outputs, as ResNet-20's first stage (rows of 4 KiB)
            g.n = 1;
            g.h = g.w = 32;
            g.kh = g.kw = 3;
            g.sh = g.sw = 1;
            g.ph = g.pw = 1;
        }
        const int F = rep % 3 == 0 ? rng.integer(1, 5) : rng.integer(16, 70);
        CAPTURE(rep);
        const auto x = rng.normal(image_size(g));
        const auto wt = rng.normal(size_t(g.kh) * g.kw * g.c * F);
        const size_t M = size_t(g.n) * g.oh() * g.ow(), K = size_t(g.kh) * g.kw * g.c;
        auto xb = upload(*d, x), wb = upload(*d, wt);
        auto z = poisoned(*d, M * F);
        if (!conv_forward(*d, d->compute_stream(), g, xb.data(), wb.data(), F, z.data(), GemmTypes{})) continue;
        ++ran;
        const auto got = download(*d, z);
        const auto col = run_im2col(*d, g, x);  // the reference: the columns' product in double
        double worst = 0;
        for (size_t m = 0; m < M; ++m)
            for (int f = 0; f < F; ++f) {
                double ref = 0, mag = 0;
                for (size_t k = 0; k < K; ++k) {
                    ref += double(col[m * K + k]) * wt[k * F + size_t(f)];
                    mag += std::fabs(double(col[m * K + k]) * wt[k * F + size_t(f)]);
                }
                worst = std::max(worst, std::fabs(got[m * F + size_t(f)] - ref) / (mag + 1e-6));
            }
        CHECK(worst < 1e-5);

        // the gradients: dw[F, K] = dz^T cols, dx = col2im(dz w) (stride 1 only)
        const auto dz = rng.normal(M * F);
        auto dzb = upload(*d, dz);
        auto dw = poisoned(*d, K * F);
        // (a backend may decline either gradient, and the layer makes columns)
        if (!conv_weight_grad(*d, d->compute_stream(), g, xb.data(), dzb.data(), F, dw.data())) continue;
        ++weight_grads;
        if (g.c < 16) ++few_channel_weight_grads;  // the product turned around
        const auto dwh = download(*d, dw);
        worst = 0;
        for (int f = 0; f < F; ++f)
            for (size_t k = 0; k < K; ++k) {
                double ref = 0, mag = 0;
                for (size_t m = 0; m < M; ++m) {
                    ref += double(dz[m * F + size_t(f)]) * col[m * K + k];
                    mag += std::fabs(double(dz[m * F + size_t(f)]) * col[m * K + k]);
                }
                worst = std::max(worst, std::fabs(dwh[size_t(f) * K + k] - ref) / (mag + 1e-6));
            }
        CHECK(worst < 1e-5);
        const std::vector<float>& w = wt;  // read as [F, K] here
        auto dx = poisoned(*d, image_size(g));
        if (!conv_input_grad(*d, d->compute_stream(), g, dzb.data(), wb.data(), F, dx.data())) continue;
        ++input_grads;
        std::vector<float> dcol(M * K);
        std::vector<double> mag_col(M * K);
        for (size_t m = 0; m < M; ++m)
            for (size_t k = 0; k < K; ++k) {
                double v = 0, a = 0;
                for (int f = 0; f < F; ++f) {
                    v += double(dz[m * F + size_t(f)]) * w[size_t(f) * K + k];
                    a += std::fabs(double(dz[m * F + size_t(f)]) * w[size_t(f) * K + k]);
                }
                dcol[m * K + k] = float(v);
                mag_col[m * K + k] = a;
            }
        const auto ref_dx = run_col2im(*d, g, dcol);
        std::vector<float> mag_f(mag_col.begin(), mag_col.end());
        const auto mag_dx = run_col2im(*d, g, mag_f);
        const auto dxh = download(*d, dx);
        worst = 0;
        for (size_t i = 0; i < dxh.size(); ++i)
            worst = std::max(worst, double(std::fabs(dxh[i] - ref_dx[i])) / (mag_dx[i] + 1e-6));
        CHECK(worst < 1e-5);
    }
    if (ran == 0) mark_skipped("no convolution kernel on this CPU (the JIT GEMMs need libxsmm and AVX2 or AVX-512)");
    else CHECK((weight_grads > 0 && few_channel_weight_grads > 0 && input_grads > 0));  // the gradients' kernels too
}

TEST_CASE("cpu pooling: max and average forward against the definition; backward routes and averages") {
    Rng rng(202);
    auto d = make_cpu_device(0);
    for (int rep = 0; rep < 24; ++rep) {
        Window2d g = random_window(rng);
        g.kh = g.kw = rng.integer(1, 3);
        g.ph = g.pw = rng.integer(0, g.kh / 2);
        if (rep % 3 == 1) g.c = rng.integer(16, 40);  // whole vectors and a remainder
        if (rep % 4 == 2) {                           // windows that tile the image: stored, not added
            if (rep % 8 == 2) g.kh = g.kw = 2;        // 2x2 at stride 2, the CPU's own loops
            g.sh = g.kh;
            g.sw = g.kw;
            g.ph = g.pw = 0;
            g.h = g.kh * rng.integer(1, 4);
            g.w = g.kw * rng.integer(1, 4);
        }
        CAPTURE(g.c);
        CAPTURE(g.kh);
        CAPTURE(g.sh);
        CAPTURE(g.ph);
        auto x = rng.normal(image_size(g));
        if (rep % 2 || rep % 8 == 2)  // ties: the gradient goes to the first maximum in window order
            for (float& v : x) v = std::round(v);
        const auto dy = rng.normal(pooled_size(g));
        for (PoolKind k : {PoolKind::max, PoolKind::average}) {
            const auto got = run_pool(*d, k, g, x, dy);
            std::vector<double> y(pooled_size(g)), dx(image_size(g), 0.0);
            for (int n = 0; n < g.n; ++n)
                for (int oy = 0; oy < g.oh(); ++oy)
                    for (int ox = 0; ox < g.ow(); ++ox)
                        for (int c = 0; c < g.c; ++c) {
                            const size_t o = ((size_t(n) * g.oh() + oy) * g.ow() + ox) * g.c + c;
                            double acc = k == PoolKind::max ? -INFINITY : 0.0;
                            long best = -1;
                            for (int ky = 0; ky < g.kh; ++ky)
                                for (int kx = 0; kx < g.kw; ++kx) {
                                    const int iy = oy * g.sh + ky - g.ph, ix = ox * g.sw + kx - g.pw;
                                    if (iy < 0 || iy >= g.h || ix < 0 || ix >= g.w) continue;
                                    const size_t e = ((size_t(n) * g.h + iy) * g.w + ix) * g.c + c;
                                    if (k == PoolKind::average) acc += x[e], dx[e] += dy[o] / (g.kh * g.kw);
                                    else if (best < 0 || x[e] > acc) acc = x[e], best = long(e);
                                }
                            y[o] = k == PoolKind::max ? acc : acc / (g.kh * g.kw);
                            if (k == PoolKind::max && best >= 0) dx[size_t(best)] += dy[o];
                        }
            y.insert(y.end(), dx.begin(), dx.end());
            CAPTURE(int(k));
            CHECK(rel_error(got, y) < 1e-6);
        }
    }
}

TEST_CASE("cpu nhwc_to_nchw permutes to PyTorch's flatten order and back") {
    auto d = make_cpu_device(0);
    const int n = 2, h = 3, w = 4, c = 5;
    std::vector<float> x(size_t(n) * h * w * c);
    for (size_t i = 0; i < x.size(); ++i) x[i] = float(i);
    auto xb = upload(*d, x);
    auto y = poisoned(*d, x.size()), back = poisoned(*d, x.size());
    nhwc_to_nchw(*d, d->compute_stream(), n, h, w, c, xb.data(), y.data(), false);
    nhwc_to_nchw(*d, d->compute_stream(), n, h, w, c, y.data(), back.data(), true);
    const auto yh = download(*d, y);
    CHECK(yh[size_t(1) * c * h * w + 2 * h * w + 1 * w + 3] ==
          x[((size_t(1) * h + 1) * w + 3) * c + 2]);  // [b=1][c=2][y=1][x=3]
    CHECK(download(*d, back) == x);
}

TEST_CASE("cpu batchnorm ops: statistics, running contributions, output, gradients against double") {
    Rng rng(203);
    auto d = make_cpu_device(0);
    for (int rep = 0; rep < 4; ++rep) {
        const NormCase n = make_norm(rng);
        CHECK(rel_error(run_batchnorm(*d, n), ref_batchnorm(n)) < 1e-5);
    }
}

// The CPU's batchnorm passes take rows of 16, 32 and 64 channels as compile-time widths and
// other widths in plain loops; each channel still adds its terms row by row, so the bits are those
// of kernels/device.h's definitions, written out here as plain loops. Both paths, one random row
// count each.
TEST_CASE("cpu batchnorm passes: the plain loops' bits at the fixed widths and others") {
    Rng rng(211);
    auto d = make_cpu_device(0);
    const Stream s = d->compute_stream();
    for (int c : {1, 7, 15, 16, 17, 31, 32, 48, 64, 70}) {
        const int rows = rng.integer(1, 200);
        CAPTURE(c);
        CAPTURE(rows);
        const size_t n = size_t(rows) * size_t(c);
        const auto x = rng.normal(n, 2.0f), dy = rng.normal(n), shift = rng.normal(size_t(c));
        const auto invstd = rng.uniform(size_t(c), 0.5f, 2.0f), gamma = rng.uniform(size_t(c), 0.5f, 1.5f);
        const auto sums = rng.normal(2 * size_t(c));
        const size_t cs = size_t(c);
        std::vector<float> want_sum(cs), want_sq(cs), want_b(2 * cs), want_dx(n), want_y(n);
        const float inv_count = float(1.0 / double(rows));
        for (int ch = 0; ch < c; ++ch) {
            double a = 0, q = 0, s0 = 0, s1 = 0;
            for (int r = 0; r < rows; ++r) {
                const size_t e = size_t(r) * size_t(c) + size_t(ch);
                a += double(x[e]);
                const double v = double(x[e]) - double(shift[size_t(ch)]);
                q += v * v;
                s0 += dy[e];
                s1 += double(dy[e]) * ((x[e] - shift[size_t(ch)]) * invstd[size_t(ch)]);
                const float xhat = (x[e] - shift[size_t(ch)]) * invstd[size_t(ch)];
                want_y[e] = gamma[size_t(ch)] * xhat + sums[size_t(ch)];
                want_dx[e] = gamma[size_t(ch)] * invstd[size_t(ch)] *
                             (dy[e] - sums[size_t(ch)] * inv_count - xhat * (sums[size_t(c + ch)] * inv_count));
            }
            want_sum[size_t(ch)] = float(a);
            want_sq[size_t(ch)] = float(q);
            want_b[size_t(ch)] = float(s0);
            want_b[size_t(c + ch)] = float(s1);
        }
        auto dx_ = upload(*d, x), ddy = upload(*d, dy), dshift = upload(*d, shift), dinv = upload(*d, invstd),
             dgamma = upload(*d, gamma), dsums = upload(*d, sums);
        auto sum = poisoned(*d, size_t(c)), sq = poisoned(*d, size_t(c)), b = poisoned(*d, 2 * size_t(c)),
             dx = poisoned(*d, n);
        channel_sums(*d, s, rows, c, dx_.data(), nullptr, false, sum.data());
        channel_sums(*d, s, rows, c, dx_.data(), dshift.data(), true, sq.data());
        bn_backward_sums(*d, s, rows, c, ddy.data(), dx_.data(), dshift.data(), dinv.data(), b.data());
        bn_backward_dx(*d, s, rows, c, ddy.data(), dx_.data(), dshift.data(), dinv.data(), dgamma.data(), dsums.data(),
                       double(rows), dx.data());
        CHECK(download(*d, sum) == want_sum);
        CHECK(download(*d, sq) == want_sq);
        CHECK(download(*d, b) == want_b);
        CHECK(download(*d, dx) == want_dx);
        // in place, as the layer may call it: dx over dy
        bn_backward_dx(*d, s, rows, c, ddy.data(), dx_.data(), dshift.data(), dinv.data(), dgamma.data(), dsums.data(),
                       double(rows), ddy.data());
        CHECK(download(*d, ddy) == want_dx);
        // channel_affine (beta: the first c of sums), apart and in place
        auto y = poisoned(*d, n);
        channel_affine(*d, s, Activation::none, rows, c, dx_.data(), dshift.data(), dinv.data(), dgamma.data(),
                       dsums.data(), y.data());
        CHECK(download(*d, y) == want_y);
        // channel_affine's ReLU pass (the CPU's own loop), apart and in place
        std::vector<float> want_relu = want_y;
        for (float& v : want_relu) v = v > 0.0f ? v : 0.0f;
        channel_affine(*d, s, Activation::relu, rows, c, dx_.data(), dshift.data(), dinv.data(), dgamma.data(),
                       dsums.data(), y.data());
        CHECK(download(*d, y) == want_relu);
        channel_affine(*d, s, Activation::none, rows, c, dx_.data(), dshift.data(), dinv.data(), dgamma.data(),
                       dsums.data(), dx_.data());
        CHECK(download(*d, dx_) == want_y);
        auto again = upload(*d, x);
        channel_affine(*d, s, Activation::relu, rows, c, again.data(), dshift.data(), dinv.data(), dgamma.data(),
                       dsums.data(), again.data());
        CHECK(download(*d, again) == want_relu);
    }
}

// channel_affine with an activation and add_act: the CPU's one-pass loops (ReLU or none, f32) against the
// Device reference (channel_affine / copy + add, then bias_act_forward in place), bit for bit -
// the layers rely on it to keep runs identical - and the rounded precisions, which take the
// reference, likewise.
TEST_CASE("cpu channel_affine with ReLU and add_act: one pass, the reference's bits") {
    Rng rng(209);
    auto d = make_cpu_device(0);
    const Stream s = d->compute_stream();
    int compared = 0;
    for (Precision prec : {Precision::fp32, Precision::bf16})
        for (Activation act : {Activation::none, Activation::relu, Activation::gelu})
            for (int rep = 0; rep < 3; ++rep) {
                CAPTURE(int(prec));
                CAPTURE(int(act));
                d->set_precision(prec);
                NormCase n = make_norm(rng);
                const size_t count = n.x.size();
                auto x = rng.normal(count);
                for (size_t i = 0; i < count; i += 7) {  // ReLU's edge: sums of +-0
                    n.x[i] = i % 2 ? 0.0f : -0.0f;
                    n.dy[i] = -0.0f;
                }
                n.gamma[0] = 0.0f;  // channel 0's outputs +-0
                n.beta[0] = -0.0f;
                const auto mean = rng.normal(size_t(n.c)), invstd = rng.uniform(n.c, 0.5f, 2.0f);
                auto xb = upload(*d, x), meanb = upload(*d, mean), invb = upload(*d, invstd);
                auto gb = upload(*d, n.gamma), bb = upload(*d, n.beta);
                auto y = poisoned(*d, count), ref = poisoned(*d, count);
                if (prec == Precision::fp32 && act == Activation::relu) {  // the one pass (elsewhere it is the two)
                    channel_affine(*d, s, act, n.rows, n.c, xb.data(), meanb.data(), invb.data(), gb.data(), bb.data(),
                                   y.data());
                    // the reference: the affine map, then the activation in place
                    channel_affine(*d, s, Activation::none, n.rows, n.c, xb.data(), meanb.data(), invb.data(),
                                   gb.data(), bb.data(), ref.data());
                    bias_activation(*d, s, act, n.rows, n.c, nullptr, ref.data(), ref.data());
                    CHECK(std::memcmp(download(*d, y).data(), download(*d, ref).data(), count * sizeof(float)) == 0);
                }

                auto a = upload(*d, n.x), b = upload(*d, n.dy);  // apart, then y == a
                add_act_values(*d, s, act, n.rows, n.c, a.data(), b.data(), y.data());
                // the reference: a copied, b added, then the activation in place
                d->copy_on_device(s, ref.data(), a.data(), d->act_bytes(count));
                add_values(*d, s, count, b.data(), ref.data());
                if (act != Activation::none) bias_activation(*d, s, act, n.rows, n.c, nullptr, ref.data(), ref.data());
                CHECK(std::memcmp(download(*d, y).data(), download(*d, ref).data(), count * sizeof(float)) == 0);
                auto a2 = upload(*d, n.x);
                add_act_values(*d, s, act, n.rows, n.c, a2.data(), b.data(), a2.data());
                CHECK(std::memcmp(download(*d, a2).data(), download(*d, ref).data(), count * sizeof(float)) == 0);
                ++compared;
            }
    d->set_precision(Precision::fp32);
    CHECK(compared == 18);
}

TEST_CASE("cpu layernorm forward and backward against double") {
    Rng rng(204);
    auto d = make_cpu_device(0);
    for (int rep = 0; rep < 4; ++rep) {
        const NormCase n = make_norm(rng, 8);
        CHECK(rel_error(run_layernorm(*d, n), ref_layernorm(n)) < 1e-5);
    }
}

TEST_CASE("bf16 and fp16 rounding: to nearest even, overflow to inf, subnormals, NaN kept") {
    Rng rng(205);
    // fp16 against the compiler's own IEEE half conversion, over a million values of every scale
    int bad16 = 0, badbf = 0;
    for (int i = 0; i < 1000000; ++i) {
        const float x = rng.normal(1)[0] * std::ldexp(1.0f, rng.integer(-30, 18));
        bad16 += round_f16(x) != float(_Float16(x));
        badbf += round_bf16(x) != ref_bf16(x);
    }
    CHECK(bad16 == 0);
    CHECK(badbf == 0);
    CHECK(round_f16(65504.0f) == 65504.0f);
    CHECK(std::isinf(round_f16(65520.0f)));
    CHECK(round_f16(65519.0f) == 65504.0f);
    CHECK(round_f16(std::ldexp(1.0f, -24)) == std::ldexp(1.0f, -24));  // the smallest subnormal
    CHECK(round_f16(std::ldexp(1.0f, -25)) == 0.0f);                   // a tie: to even, zero
    CHECK(round_bf16(1.0f + std::ldexp(1.0f, -8)) == 1.0f);            // a tie: to even
    CHECK(round_bf16(1.0f + std::ldexp(3.0f, -8)) == 1.0f + std::ldexp(1.0f, -6));
    CHECK(std::isnan(round_bf16(std::nanf(""))));
    CHECK(std::isinf(round_bf16(std::numeric_limits<float>::max())));
    // the CPU backend's convert and its emulated activations land on these values
    auto d = make_cpu_device(0);
    d->set_precision(Precision::bf16);
    const auto x = rng.normal(1000, 3.0f);
    auto xb = upload(*d, x);
    auto y = poisoned(*d, x.size());
    convert_values(*d, d->compute_stream(), x.size(), xb.data(), DType::f32, y.data(), DType::bf16);
    const auto yh = download(*d, y);
    bool all = true;
    for (size_t i = 0; i < x.size(); ++i) all = all && yh[i] == round_bf16(x[i]);
    CHECK(all);
    auto z = upload(*d, x);
    bias_activation(*d, d->compute_stream(), Activation::gelu, 10, 100, nullptr, z.data(), y.data());
    const auto gh = download(*d, y);
    for (float v : gh) all = all && round_bf16(v) == v;
    CHECK(all);  // stored activations are bf16 values
}

TEST_CASE("cpu loss scaling: the scale halves on an overflow, doubles after good steps; updates skip") {
    auto d = make_cpu_device(0);
    auto state = upload(*d, std::vector<float>{1024.0f, 0.0f});
    auto good = upload(*d, std::vector<float>{4.0f, 0.0f}), bad = upload(*d, std::vector<float>{4.0f, 3.0f});
    const Stream s = d->compute_stream();
    loss_scale_update(*d, s, state.data(), bad.data(), 3);
    CHECK(download(*d, state) == std::vector<float>{512.0f, 0.0f});
    for (int i = 0; i < 3; ++i) loss_scale_update(*d, s, state.data(), good.data(), 3);
    CHECK(download(*d, state) == std::vector<float>{1024.0f, 0.0f});
    // an update with loss scaling skips on an overflow, and divides by the scale otherwise
    auto p = upload(*d, std::vector<float>{1.0f, 2.0f}), g = upload(*d, std::vector<float>{8.0f, 16.0f});
    auto m = upload(*d, std::vector<float>{0.0f, 0.0f}), scale = upload(*d, std::vector<float>{8.0f});
    SgdArgs a;
    a.lr = 0.5f;
    a.loss_scale = scale.data();
    a.skip_nonfinite = true;
    a.grad_stats = bad.data();
    sgd_update(*d, s, 2, p.data(), g.data(), m.data(), a);
    CHECK(download(*d, p) == std::vector<float>{1.0f, 2.0f});
    a.grad_stats = good.data();
    sgd_update(*d, s, 2, p.data(), g.data(), m.data(), a);
    CHECK(download(*d, p) == std::vector<float>{0.5f, 1.0f});
    // sum_squares counts non-finite values and measures the unscaled norm
    auto x = upload(*d, std::vector<float>{3.0f, 4.0f, INFINITY, NAN});
    DeviceBuffer<float> out(*d, 2);
    auto two = upload(*d, std::vector<float>{2.0f});
    sum_squares(*d, s, 2, x.data(), two.data(), out.data());
    CHECK(download(*d, out) == std::vector<float>{6.25f, 0.0f});
    sum_squares(*d, s, 4, x.data(), nullptr, out.data());
    CHECK(download(*d, out)[1] == 2.0f);
}

// ================================ CUDA backend vs CPU ====================================

TEST_CASE("cuda im2col, col2im, pooling and nhwc_to_nchw match cpu" * doctest::test_suite("cuda")) {
    SKIP_WITHOUT_CUDA();
    Rng rng(301);
    auto cpu = make_cpu_device(0);
    auto gpu = make_cuda_device(0);
    for (int rep = 0; rep < 10; ++rep) {
        Window2d g = random_window(rng);
        g.pixel_major = rep % 2;  // both column orders
        const auto x = rng.normal(image_size(g));
        CHECK(run_im2col(*gpu, g, x) == run_im2col(*cpu, g, x));
        const auto dcol = rng.normal(cols_size(g));
        CHECK(rel_error(run_col2im(*gpu, g, dcol), run_col2im(*cpu, g, dcol)) < 1e-5);
        const auto dy = rng.normal(pooled_size(g));
        for (PoolKind k : {PoolKind::max, PoolKind::average})
            CHECK(rel_error(run_pool(*gpu, k, g, x, dy), run_pool(*cpu, k, g, x, dy)) < 1e-5);
    }
}

TEST_CASE("cuda batchnorm and layernorm ops match cpu" * doctest::test_suite("cuda")) {
    SKIP_WITHOUT_CUDA();
    Rng rng(302);
    auto cpu = make_cpu_device(0);
    auto gpu = make_cuda_device(0);
    for (int rep = 0; rep < 4; ++rep) {
        NormCase n = make_norm(rng);
        if (rep == 3) {  // many rows: several chunks in the column reductions
            n.rows = 70000;
            n.c = 3;
            n.x = rng.normal(size_t(n.rows) * n.c);
            n.dy = rng.normal(size_t(n.rows) * n.c);
            n.gamma = rng.uniform(n.c, 0.5f, 1.5f);
            n.beta = rng.normal(n.c);
        }
        CHECK(rel_error(run_batchnorm(*gpu, n), run_batchnorm(*cpu, n)) < 1e-4);
        CHECK(rel_error(run_layernorm(*gpu, n), run_layernorm(*cpu, n)) < 1e-4);
    }
}

TEST_CASE("cuda bf16 and fp16 storage round exactly as the cpu emulation" * doctest::test_suite("cuda")) {
    SKIP_WITHOUT_CUDA();
    Rng rng(303);
    auto gpu = make_cuda_device(0);
    for (Precision p : {Precision::bf16, Precision::fp16}) {
        gpu->set_precision(p);
        const DType t = gpu->act_dtype();
        const auto x = rng.normal(100000, 50.0f);
        auto xb = upload(*gpu, x);
        DeviceBuffer<unsigned char> half(*gpu, gpu->act_bytes(x.size()));
        DeviceBuffer<float> back(*gpu, x.size());
        convert_values(*gpu, gpu->compute_stream(), x.size(), xb.data(), DType::f32, half.data(), t);
        convert_values(*gpu, gpu->compute_stream(), x.size(), half.data(), t, back.data(), DType::f32);
        const auto got = download(*gpu, back);
        bool exact = true;
        for (size_t i = 0; i < x.size(); ++i) exact = exact && got[i] == round_to(t, x[i]);
        CHECK(exact);
    }
}
