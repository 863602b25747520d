// bench-conv-layout: one convolution's forward and backward (im2col, the GEMMs, col2im) with the
// activations NHWC - the layout mirrored uses - and NCHW (Caffe's arrangement: columns
// [c*kh*kw, n*oh*ow], one GEMM, a permute to NCHW), on one CPU replica with one BLAS thread. Both
// im2col/col2im are plain loops of the same quality here (not the CPU backend's tuned ones), so
// the difference is the layout: the GEMM shapes and what the gather and the permute cost.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <vector>

#include "kernels/buffer.h"
#include "base/error.h"
#include "kernels/blas.h"
#include "kernels/ops/flat.h"
#include "kernels/ops/gemm.h"
#include "mirrored/tools/tools.h"
#include "mirrored/util.h"

namespace mirrored {

using json = nlohmann::json;

namespace {

// NHWC x[n, h, w, c] -> col[(n, oy, ox), (c, ky, kx)]
void im2col_nhwc(const Window2d& g, const float* x, float* col) {
    const int oh = g.oh(), ow = g.ow(), kk = g.kh * g.kw;
    for (int n = 0; n < g.n; ++n)
        for (int oy = 0; oy < oh; ++oy)
            for (int ox = 0; ox < ow; ++ox) {
                float* row = col + ((size_t(n) * oh + oy) * ow + ox) * g.c * kk;
                for (int ky = 0; ky < g.kh; ++ky)
                    for (int kx = 0; kx < g.kw; ++kx) {
                        const int iy = oy * g.sh + ky - g.ph, ix = ox * g.sw + kx - g.pw;
                        const bool inside = iy >= 0 && iy < g.h && ix >= 0 && ix < g.w;
                        const float* src = inside ? x + ((size_t(n) * g.h + iy) * g.w + ix) * g.c : nullptr;
                        for (int c = 0; c < g.c; ++c) row[size_t(c) * kk + ky * g.kw + kx] = src ? src[c] : 0.0f;
                    }
            }
}

// The adjoint of im2col_nhwc.
void col2im_nhwc(const Window2d& g, const float* col, float* dx) {
    const int oh = g.oh(), ow = g.ow(), kk = g.kh * g.kw;
    std::fill(dx, dx + size_t(g.n) * g.h * g.w * g.c, 0.0f);
    for (int n = 0; n < g.n; ++n)
        for (int oy = 0; oy < oh; ++oy)
            for (int ox = 0; ox < ow; ++ox) {
                const float* row = col + ((size_t(n) * oh + oy) * ow + ox) * g.c * kk;
                for (int ky = 0; ky < g.kh; ++ky)
                    for (int kx = 0; kx < g.kw; ++kx) {
                        const int iy = oy * g.sh + ky - g.ph, ix = ox * g.sw + kx - g.pw;
                        if (iy < 0 || iy >= g.h || ix < 0 || ix >= g.w) continue;
                        float* dst = dx + ((size_t(n) * g.h + iy) * g.w + ix) * g.c;
                        for (int c = 0; c < g.c; ++c) dst[c] += row[size_t(c) * kk + ky * g.kw + kx];
                    }
            }
}

// NCHW x[n, c, h, w] -> col[(c, ky, kx), (n, oy, ox)]
void im2col_nchw(const Window2d& g, const float* x, float* col) {
    const int oh = g.oh(), ow = g.ow();
    const size_t pixels = size_t(g.n) * oh * ow;
    for (int c = 0; c < g.c; ++c)
        for (int ky = 0; ky < g.kh; ++ky)
            for (int kx = 0; kx < g.kw; ++kx) {
                float* row = col + (size_t(c) * g.kh * g.kw + size_t(ky) * g.kw + kx) * pixels;
                for (int n = 0; n < g.n; ++n) {
                    const float* plane = x + (size_t(n) * g.c + c) * g.h * g.w;
                    for (int oy = 0; oy < oh; ++oy) {
                        float* out = row + (size_t(n) * oh + oy) * ow;
                        const int iy = oy * g.sh + ky - g.ph;
                        for (int ox = 0; ox < ow; ++ox) {
                            const int ix = ox * g.sw + kx - g.pw;
                            out[ox] = iy >= 0 && iy < g.h && ix >= 0 && ix < g.w ? plane[size_t(iy) * g.w + ix] : 0.0f;
                        }
                    }
                }
            }
}

// The adjoint of im2col_nchw.
void col2im_nchw(const Window2d& g, const float* col, float* dx) {
    const int oh = g.oh(), ow = g.ow();
    const size_t pixels = size_t(g.n) * oh * ow;
    std::fill(dx, dx + size_t(g.n) * g.c * g.h * g.w, 0.0f);
    for (int c = 0; c < g.c; ++c)
        for (int ky = 0; ky < g.kh; ++ky)
            for (int kx = 0; kx < g.kw; ++kx) {
                const float* row = col + (size_t(c) * g.kh * g.kw + size_t(ky) * g.kw + kx) * pixels;
                for (int n = 0; n < g.n; ++n) {
                    float* plane = dx + (size_t(n) * g.c + c) * g.h * g.w;
                    for (int oy = 0; oy < oh; ++oy) {
                        const float* in = row + (size_t(n) * oh + oy) * ow;
                        const int iy = oy * g.sh + ky - g.ph;
                        if (iy < 0 || iy >= g.h) continue;
                        for (int ox = 0; ox < ow; ++ox) {
                            const int ix = ox * g.sw + kx - g.pw;
                            if (ix >= 0 && ix < g.w) plane[size_t(iy) * g.w + ix] += in[ox];
                        }
                    }
                }
            }
}

// [f, (n, p)] <-> [n, f, p]: the GEMM's output in NCHW, and the incoming gradient back.
void permute_fn_to_nf(int n, int f, size_t p, const float* a, float* b, bool inverse) {
    for (int i = 0; i < n; ++i)
        for (int j = 0; j < f; ++j) {
            float* nf = b + (size_t(i) * f + j) * p;
            float* fn = const_cast<float*>(a) + (size_t(j) * n + i) * p;
            if (inverse) std::memcpy(fn, nf, p * sizeof(float));
            else std::memcpy(nf, fn, p * sizeof(float));
        }
}

template <typename F>
double median_ms(F&& once, int reps) {
    once();  // warm
    std::vector<double> t;
    for (int i = 0; i < reps; ++i) {
        const double t0 = now_s();
        once();
        t.push_back((now_s() - t0) * 1e3);
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

}  // namespace

int bench_conv_layout(const ConvLayoutBenchOptions& o) {
    cpu_set_blas_threads(1);
    auto d = make_cpu_device(0);
    const Stream s = d->compute_stream();
    std::printf(
        "conv forward + backward, NHWC (mirrored's layout) vs NCHW (columns [c*k*k, n*oh*ow]), batch %d,\n"
        "on %s, one BLAS thread; median of %d\n\n",
        o.batch, cpu_model_name().c_str(), o.reps);
    std::printf("%-22s %10s %10s %10s %10s %8s\n", "layer", "GFLOP", "NHWC ms", "NCHW ms", "NHWC GF/s", "NCHW/NHWC");
    json rows = json::array();
    for (const auto& shape : o.shapes) {
        Window2d g;
        g.n = o.batch;
        g.h = shape.h;
        g.w = shape.w;
        g.c = shape.c;
        g.kh = g.kw = shape.k;
        g.ph = g.pw = shape.k / 2;
        const int F = shape.f, K = g.c * g.kh * g.kw, M = g.n * g.oh() * g.ow();
        const size_t in = size_t(g.n) * g.h * g.w * g.c, out = size_t(M) * F, cols = size_t(M) * K;
        DeviceBuffer<float> x(*d, in), dx(*d, in), col(*d, cols), y(*d, out), dy(*d, out), w(*d, size_t(F) * K),
            dw(*d, size_t(F) * K), tmp(*d, out);
        for (auto* b : {&x, &dy, &w}) fill_floats(*d, s, b->size(), 0.01f, b->data());
        auto nhwc = [&] {
            im2col_nhwc(g, x.data(), col.data());
            gemm(*d, s, false, true, M, F, K, 1.0f, col.data(), K, w.data(), K, 0.0f, y.data(), F);
            gemm(*d, s, true, false, F, K, M, 1.0f, dy.data(), F, col.data(), K, 0.0f, dw.data(), K);
            gemm(*d, s, false, false, M, K, F, 1.0f, dy.data(), F, w.data(), K, 0.0f, col.data(), K);
            col2im_nhwc(g, col.data(), dx.data());
        };
        const size_t plane = size_t(g.oh()) * g.ow();
        auto nchw = [&] {
            im2col_nchw(g, x.data(), col.data());
            gemm(*d, s, false, false, F, M, K, 1.0f, w.data(), K, col.data(), M, 0.0f, tmp.data(), M);
            permute_fn_to_nf(g.n, F, plane, tmp.data(), y.data(), false);
            permute_fn_to_nf(g.n, F, plane, tmp.data(), dy.data(), true);
            gemm(*d, s, false, true, F, K, M, 1.0f, tmp.data(), M, col.data(), M, 0.0f, dw.data(), K);
            gemm(*d, s, true, false, K, M, F, 1.0f, w.data(), K, tmp.data(), M, 0.0f, col.data(), M);
            col2im_nchw(g, col.data(), dx.data());
        };
        const double a = median_ms(nhwc, o.reps), b = median_ms(nchw, o.reps);
        const double gflop = 3.0 * 2.0 * double(M) * F * K / 1e9;
        char name[64];
        std::snprintf(name, sizeof name, "%dx%dx%d k%d -> %d", g.h, g.w, g.c, shape.k, F);
        std::printf("%-22s %10.3f %10.2f %10.2f %10.1f %8.2fx\n", name, gflop, a, b, gflop / a * 1e3, b / a);
        rows.push_back({{"layer", name}, {"gflop", gflop}, {"nhwc_ms", a}, {"nchw_ms", b}, {"nchw_over_nhwc", b / a}});
    }
    write_json(o.json,
               {{"benchmark", "conv_layout"}, {"cpu", cpu_model_name()}, {"batch", o.batch}, {"results", rows}});
    return kExitOk;
}

}  // namespace mirrored
