#include "kernels/cpu/cnn_loops.h"

#include <algorithm>
#include <limits>
#include <type_traits>

#include "kernels/cpu/loop_clones.h"
#include "kernels/cpu/scratch.h"
#include "kernels/op_math.h"

namespace mirrored::cpu {

namespace {

template <typename T>
void grow(std::vector<T>& v, size_t n) {
    grow_scratch(v, n);
}

float* pixel(float* base, const Window2d& g, int n, int iy, int ix) {
    return base + ((size_t(n) * g.h + iy) * g.w + ix) * g.c;
}
const float* pixel(const float* base, const Window2d& g, int n, int iy, int ix) {
    return base + ((size_t(n) * g.h + iy) * g.w + ix) * g.c;
}

// Calls f(k, iy, ix, inside) for window (oy, ox)'s positions in (ky, kx) order, k = ky * kw + kx.
template <typename F>
void for_each_position(const Window2d& g, int oy, int ox, F&& f) {
    for (int ky = 0; ky < g.kh; ++ky) {
        const int iy = oy * g.sh + ky - g.ph;
        for (int kx = 0; kx < g.kw; ++kx) {
            const int ix = ox * g.sw + kx - g.pw;
            f(ky * g.kw + kx, iy, ix, iy >= 0 && iy < g.h && ix >= 0 && ix < g.w);
        }
    }
}

// A column row, [c][k], from each window position's pixel: written in order, read from kk
// channel runs. KK > 0 fixes the window size at compile time (3 x 3 windows), so the positions'
// pointers stay in registers.
template <int KK>
void gather_row(int c, int kk_runtime, const float* const* __restrict window, float* __restrict row) {
    const int kk = KK > 0 ? KK : kk_runtime;
    for (int ch = 0; ch < c; ++ch)
        for (int k = 0; k < kk; ++k) row[size_t(ch) * kk + k] = window[k][ch];
}

template <int KK>
void scatter_row(int c, int kk_runtime, float* const* __restrict window, const float* __restrict row) {
    const int kk = KK > 0 ? KK : kk_runtime;
    for (int ch = 0; ch < c; ++ch)
        for (int k = 0; k < kk; ++k) window[k][ch] += row[size_t(ch) * kk + k];
}

// Per-pixel steps of the pooling passes, inlined into each width's clone of the pass.
#define CNN_INLINE inline __attribute__((always_inline))

// Pixel-major columns. A window's positions kx = 0..kw-1 on input row iy lie side by side in
// NHWC memory, so a column row is kh runs of up to kw * c floats (zeros where the window leaves
// the image). The runs are copied by inline vector loops: GCC would otherwise call memmove for
// each, and for runs of a few hundred bytes the calls cost more than the copying.
#if defined(__GNUC__) && !defined(__clang__)
#define CNN_NO_MEMCPY_CALLS __attribute__((optimize("no-tree-loop-distribute-patterns")))
#else
#define CNN_NO_MEMCPY_CALLS  // clang (the fuzz build) has no such pass to turn off
#endif

// The window row's positions [lo, hi) that fall inside the image's columns.
struct InsideRun {
    int lo, hi;
};
CNN_INLINE InsideRun inside_run(const Window2d& g, int ox) {
    const int ix0 = ox * g.sw - g.pw;
    return {std::max(0, -ix0), std::min(g.kw, g.w - ix0)};
}

CPU_LOOP_CLONES CNN_NO_MEMCPY_CALLS void im2col_pixel_major(const Window2d& g, const float* __restrict x,
                                                            float* __restrict col) {
    const int oh = g.oh(), ow = g.ow();
    const size_t c = size_t(g.c), run = size_t(g.kw) * c, K = run * size_t(g.kh);
    for (int n = 0; n < g.n; ++n)
        for (int oy = 0; oy < oh; ++oy)
            for (int ox = 0; ox < ow; ++ox) {
                float* __restrict row = col + ((size_t(n) * oh + oy) * ow + ox) * K;
                const InsideRun r = inside_run(g, ox);
                for (int ky = 0; ky < g.kh; ++ky) {
                    float* __restrict dst = row + size_t(ky) * run;
                    const int iy = oy * g.sh + ky - g.ph;
                    if (iy < 0 || iy >= g.h || r.lo >= r.hi) {
                        for (size_t i = 0; i < run; ++i) dst[i] = 0.0f;
                        continue;
                    }
                    const float* __restrict src = pixel(x, g, n, iy, ox * g.sw - g.pw + r.lo);
                    const size_t before = size_t(r.lo) * c, inside = size_t(r.hi - r.lo) * c;
                    for (size_t i = 0; i < before; ++i) dst[i] = 0.0f;
                    for (size_t i = 0; i < inside; ++i) dst[before + i] = src[i];
                    for (size_t i = before + inside; i < run; ++i) dst[i] = 0.0f;
                }
            }
}

// The adjoint: windows in order, each adding its inside runs once (the per-element order of
// the definition; padding positions add nowhere).
CPU_LOOP_CLONES CNN_NO_MEMCPY_CALLS void col2im_pixel_major(const Window2d& g, const float* __restrict dcol,
                                                            float* __restrict dx) {
    const int oh = g.oh(), ow = g.ow();
    const size_t c = size_t(g.c), run = size_t(g.kw) * c, K = run * size_t(g.kh);
    for (int n = 0; n < g.n; ++n)
        for (int oy = 0; oy < oh; ++oy)
            for (int ox = 0; ox < ow; ++ox) {
                const float* __restrict row = dcol + ((size_t(n) * oh + oy) * ow + ox) * K;
                const InsideRun r = inside_run(g, ox);
                if (r.lo >= r.hi) continue;
                const size_t before = size_t(r.lo) * c, inside = size_t(r.hi - r.lo) * c;
                for (int ky = 0; ky < g.kh; ++ky) {
                    const int iy = oy * g.sh + ky - g.ph;
                    if (iy < 0 || iy >= g.h) continue;
                    float* __restrict dst = pixel(dx, g, n, iy, ox * g.sw - g.pw + r.lo);
                    const float* __restrict src = row + size_t(ky) * run + before;
                    for (size_t i = 0; i < inside; ++i) dst[i] += src[i];
                }
            }
}

CNN_INLINE void max_into(int c, const float* __restrict src, float* __restrict acc) {
    for (int ch = 0; ch < c; ++ch) acc[ch] = src[ch] > acc[ch] ? src[ch] : acc[ch];
}

CNN_INLINE void add_into(int c, const float* __restrict src, float* __restrict acc) {
    for (int ch = 0; ch < c; ++ch) acc[ch] += src[ch];
}

CNN_INLINE void add_scaled_into(int c, const float* __restrict d, float scale, float* __restrict acc) {
    for (int ch = 0; ch < c; ++ch) acc[ch] += d[ch] * scale;
}

// The running first maximum: a later position replaces it only when strictly greater.
CNN_INLINE void track_max(int c, int k, const float* __restrict src, float* __restrict best, int* __restrict at) {
    for (int ch = 0; ch < c; ++ch) {
        const bool greater = src[ch] > best[ch];
        best[ch] = greater ? src[ch] : best[ch];
        at[ch] = greater ? k : at[ch];
    }
}

CNN_INLINE void add_where(int c, int k, const int* __restrict at, const float* __restrict d, float* __restrict dx) {
    for (int ch = 0; ch < c; ++ch) dx[ch] = at[ch] == k ? dx[ch] + d[ch] : dx[ch];
}

// Windows that tile the image (each pixel in exactly one): the gradient is stored, not added to
// a cleared buffer - 0 + d, which is d but for the sign of a zero.
CNN_INLINE void store_where(int c, int k, const int* __restrict at, const float* __restrict d, float* __restrict dx) {
    for (int ch = 0; ch < c; ++ch) dx[ch] = at[ch] == k ? 0.0f + d[ch] : 0.0f;
}

CNN_INLINE void store_scaled(int c, const float* __restrict d, float scale, float* __restrict dx) {
    for (int ch = 0; ch < c; ++ch) dx[ch] = 0.0f + d[ch] * scale;
}

CPU_LOOP_CLONES void pool_forward_loop(bool max, const Window2d& g, const float* x, float* y) {
    const int oh = g.oh(), ow = g.ow(), c = g.c;
    const float inv = 1.0f / float(g.kh * g.kw);
    for (int n = 0; n < g.n; ++n)
        for (int oy = 0; oy < oh; ++oy)
            for (int ox = 0; ox < ow; ++ox) {
                float* out = y + ((size_t(n) * oh + oy) * ow + ox) * c;
                const float init = max ? -std::numeric_limits<float>::infinity() : 0.0f;
                for (int ch = 0; ch < c; ++ch) out[ch] = init;
                g.for_each_input(oy, ox, [&](int iy, int ix, int, int) {
                    if (max) max_into(c, pixel(x, g, n, iy, ix), out);
                    else add_into(c, pixel(x, g, n, iy, ix), out);
                });
                if (!max)
                    for (int ch = 0; ch < c; ++ch) out[ch] *= inv;
            }
}

// dx must be cleared first unless the windows tile the image.
CPU_LOOP_CLONES void pool_backward_loop(bool max, bool tiles, const Window2d& g, const float* x, const float* dy,
                                        float* dx, float* best, int* at) {
    const int oh = g.oh(), ow = g.ow(), c = g.c;
    const float inv = 1.0f / float(g.kh * g.kw);
    for (int n = 0; n < g.n; ++n)
        for (int oy = 0; oy < oh; ++oy)
            for (int ox = 0; ox < ow; ++ox) {
                const float* d = dy + ((size_t(n) * oh + oy) * ow + ox) * c;
                if (!max) {
                    g.for_each_input(oy, ox, [&](int iy, int ix, int, int) {
                        if (tiles) store_scaled(c, d, inv, pixel(dx, g, n, iy, ix));
                        else add_scaled_into(c, d, inv, pixel(dx, g, n, iy, ix));
                    });
                    continue;
                }
                int k = 0;  // the window's positions inside the image, in order
                g.for_each_input(oy, ox, [&](int iy, int ix, int, int) {
                    const float* src = pixel(x, g, n, iy, ix);
                    if (k == 0) {
                        for (int ch = 0; ch < c; ++ch) {
                            best[ch] = src[ch];
                            at[ch] = 0;
                        }
                    } else {
                        track_max(c, k, src, best, at);
                    }
                    ++k;
                });
                k = 0;
                g.for_each_input(oy, ox, [&](int iy, int ix, int, int) {
                    if (tiles) store_where(c, k++, at, d, pixel(dx, g, n, iy, ix));
                    else add_where(c, k++, at, d, pixel(dx, g, n, iy, ix));
                });
            }
}

// Batchnorm's per-channel passes. For the usual widths of a CNN (16, 32 and 64 channels) a row's
// width is a compile-time constant: the channels' sums stay in registers over all the rows (as
// overlapping chains of additions) and the factors of the element-wise passes are made once, where
// a loop of run-time length along each row spent more on loading and storing them than on the
// arithmetic. GCC vectorises these constant-length loops, float to double conversions included.
// Each channel still adds its terms row by row, so the results are the bits of the plain loops.
template <int W>
using RowWidth = std::integral_constant<int, W>;

// fn(RowWidth<c>) for c of 16, 32 or 64; false (nothing called) for another width.
template <typename Fn>
CNN_INLINE bool with_row_width(int c, Fn&& fn) {
    switch (c) {
        case 16:
            fn(RowWidth<16>{});
            return true;
        case 32:
            fn(RowWidth<32>{});
            return true;
        case 64:
            fn(RowWidth<64>{});
            return true;
        default:
            return false;
    }
}

template <bool Shift, bool Squares>
CPU_LOOP_CLONES void channel_sums_loop(int rows, int c, const float* __restrict x, const float* __restrict shift,
                                       double* __restrict acc) {
    const auto term = [&](float xv, int ch) __attribute__((always_inline)) {
        const double v = Shift ? double(xv) - double(shift[ch]) : double(xv);
        return Squares ? v * v : v;
    };
    const bool fixed = with_row_width(
        c, [&](auto W) __attribute__((always_inline)) {
            double a[W] = {};
            for (int r = 0; r < rows; ++r)
                for (int ch = 0; ch < W; ++ch) a[ch] += term(x[size_t(r) * W + ch], ch);
            for (int ch = 0; ch < W; ++ch) acc[ch] = a[ch];
        });
    if (fixed) return;
    for (int ch = 0; ch < c; ++ch) acc[ch] = 0.0;
    for (int r = 0; r < rows; ++r)
        for (int ch = 0; ch < c; ++ch) acc[ch] += term(x[size_t(r) * c + ch], ch);
}

CPU_LOOP_CLONES void bn_sums_loop(int rows, int c, const float* __restrict dy, const float* __restrict x,
                                  const float* __restrict mean, const float* __restrict invstd, double* __restrict s0,
                                  double* __restrict s1) {
    // one row's terms: s0 += dy, s1 += dy * xhat
    const auto add = [&](const float* __restrict dr, const float* __restrict xr, int ch, double& a, double& b)
        __attribute__((always_inline)) {
        a += dr[ch];
        b += double(dr[ch]) * ((xr[ch] - mean[ch]) * invstd[ch]);
    };
    const bool fixed = with_row_width(
        c, [&](auto W) __attribute__((always_inline)) {
            double a[W] = {}, b[W] = {};
            for (int r = 0; r < rows; ++r)
                for (int ch = 0; ch < W; ++ch) add(dy + size_t(r) * W, x + size_t(r) * W, ch, a[ch], b[ch]);
            for (int ch = 0; ch < W; ++ch) {
                s0[ch] = a[ch];
                s1[ch] = b[ch];
            }
        });
    if (fixed) return;
    for (int ch = 0; ch < c; ++ch) s0[ch] = s1[ch] = 0.0;
    for (int r = 0; r < rows; ++r)
        for (int ch = 0; ch < c; ++ch) add(dy + size_t(r) * c, x + size_t(r) * c, ch, s0[ch], s1[ch]);
}

// 2x2 windows at stride 2 that tile the image (no padding, no remainder): the CNNs' max pool.
// The general loops walk each window through a callback and per-channel scratch, which for a
// few channels costs more than the comparisons; these compare the four pixels of a window
// channel by channel with the general loops' rule and order (the first maximum in (ky, kx)
// order: a later position must be greater), so the results are the same bits.
bool tiled_2x2(const Window2d& g) {
    return g.kh == 2 && g.kw == 2 && g.sh == 2 && g.sw == 2 && g.ph == 0 && g.pw == 0 && g.h % 2 == 0 && g.w % 2 == 0;
}

// One window's four pixels a b / d e, channel by channel, in one pass (max_into four times over
// the output ran this pool's forward 1.7x slower).
CNN_INLINE void max_of_4(int c, const float* __restrict a, const float* __restrict b, const float* __restrict d,
                         const float* __restrict e, float* __restrict out) {
    for (int ch = 0; ch < c; ++ch) {  // as max_into from -inf
        float m = -std::numeric_limits<float>::infinity();
        m = a[ch] > m ? a[ch] : m;
        m = b[ch] > m ? b[ch] : m;
        m = d[ch] > m ? d[ch] : m;
        out[ch] = e[ch] > m ? e[ch] : m;
    }
}
CNN_INLINE void route_to_max_of_4(int c, const float* __restrict a, const float* __restrict b,
                                  const float* __restrict d, const float* __restrict e, const float* __restrict grad,
                                  float* __restrict da, float* __restrict db, float* __restrict dd,
                                  float* __restrict de) {
    for (int ch = 0; ch < c; ++ch) {    // as track_max, then store_where
        const bool t1 = b[ch] > a[ch];  // a later position takes over from the best so far
        const float m1 = t1 ? b[ch] : a[ch];
        const bool t2 = d[ch] > m1;
        const bool t3 = e[ch] > (t2 ? d[ch] : m1);
        // the gradient goes to the last take-over (selects only: GCC vectorises them)
        float r = 0.0f + grad[ch];
        de[ch] = t3 ? r : 0.0f;
        r = t3 ? 0.0f : r;
        dd[ch] = t2 ? r : 0.0f;
        r = t2 ? 0.0f : r;
        db[ch] = t1 ? r : 0.0f;
        da[ch] = t1 ? 0.0f : r;
    }
}

CPU_LOOP_CLONES void max_pool_2x2_forward(const Window2d& g, const float* x, float* y) {
    const int oh = g.oh(), ow = g.ow(), c = g.c;
    for (int n = 0; n < g.n; ++n)
        for (int oy = 0; oy < oh; ++oy)
            for (int ox = 0; ox < ow; ++ox) {
                const float* top = pixel(x, g, n, 2 * oy, 2 * ox);
                const float* bottom = pixel(x, g, n, 2 * oy + 1, 2 * ox);
                max_of_4(c, top, top + c, bottom, bottom + c, y + ((size_t(n) * oh + oy) * ow + ox) * c);
            }
}

CPU_LOOP_CLONES void max_pool_2x2_backward(const Window2d& g, const float* x, const float* dy, float* dx) {
    const int oh = g.oh(), ow = g.ow(), c = g.c;
    for (int n = 0; n < g.n; ++n)
        for (int oy = 0; oy < oh; ++oy)
            for (int ox = 0; ox < ow; ++ox) {
                const float* top = pixel(x, g, n, 2 * oy, 2 * ox);
                const float* bottom = pixel(x, g, n, 2 * oy + 1, 2 * ox);
                float* dtop = pixel(dx, g, n, 2 * oy, 2 * ox);
                float* dbottom = pixel(dx, g, n, 2 * oy + 1, 2 * ox);
                route_to_max_of_4(c, top, top + c, bottom, bottom + c, dy + ((size_t(n) * oh + oy) * ow + ox) * c, dtop,
                                  dtop + c, dbottom, dbottom + c);
            }
}

}  // namespace

void CnnScratch::reserve_channels(int c) {
    const size_t n = size_t(std::max(c, 1));
    grow(zeros, n);  // value-initialised: zeros
    grow(sink, n);
    grow(best_value, n);
    grow(best_position, n);
    grow(sum0, n);
    grow(sum1, n);
}

void CnnScratch::reserve(const Window2d& g) {
    reserve_channels(g.c);
    grow(window, size_t(g.kh) * g.kw);
    grow(window_out, size_t(g.kh) * g.kw);
}

void im2col(const Window2d& g, const float* x, float* col, CnnScratch& s) {
    if (g.pixel_major) return im2col_pixel_major(g, x, col);
    s.reserve(g);
    const int oh = g.oh(), ow = g.ow(), kk = g.kh * g.kw;
    const size_t K = size_t(g.c) * kk;
    const float** window = s.window.data();
    for (int n = 0; n < g.n; ++n)
        for (int oy = 0; oy < oh; ++oy)
            for (int ox = 0; ox < ow; ++ox) {
                for_each_position(g, oy, ox, [&](int k, int iy, int ix, bool inside) {
                    window[k] = inside ? pixel(x, g, n, iy, ix) : s.zeros.data();
                });
                float* row = col + ((size_t(n) * oh + oy) * ow + ox) * K;
                if (kk == 9) gather_row<9>(g.c, kk, window, row);
                else gather_row<0>(g.c, kk, window, row);
            }
}

void col2im(const Window2d& g, const float* dcol, float* dx, CnnScratch& s) {
    std::fill(dx, dx + size_t(g.n) * g.h * g.w * g.c, 0.0f);
    if (g.pixel_major) return col2im_pixel_major(g, dcol, dx);
    s.reserve(g);
    const int oh = g.oh(), ow = g.ow(), kk = g.kh * g.kw;
    const size_t K = size_t(g.c) * kk;
    float** window = s.window_out.data();
    for (int n = 0; n < g.n; ++n)
        for (int oy = 0; oy < oh; ++oy)
            for (int ox = 0; ox < ow; ++ox) {
                // A window holds each input pixel once, so each element gets one addition per
                // window, windows in order: the per-element definition's order.
                for_each_position(g, oy, ox, [&](int k, int iy, int ix, bool inside) {
                    window[k] = inside ? pixel(dx, g, n, iy, ix) : s.sink.data();
                });
                const float* row = dcol + ((size_t(n) * oh + oy) * ow + ox) * K;
                if (kk == 9) scatter_row<9>(g.c, kk, window, row);
                else scatter_row<0>(g.c, kk, window, row);
            }
}

void pool_forward(PoolKind kind, const Window2d& g, const float* x, float* y) {
    if (kind == PoolKind::max && tiled_2x2(g)) return max_pool_2x2_forward(g, x, y);
    pool_forward_loop(kind == PoolKind::max, g, x, y);
}

void pool_backward(PoolKind kind, const Window2d& g, const float* x, const float* dy, float* dx, CnnScratch& s) {
    s.reserve(g);
    const bool tiles =
        g.sh == g.kh && g.sw == g.kw && g.ph == 0 && g.pw == 0 && g.oh() * g.kh == g.h && g.ow() * g.kw == g.w;
    if (kind == PoolKind::max && tiled_2x2(g)) return max_pool_2x2_backward(g, x, dy, dx);
    if (!tiles) std::fill(dx, dx + size_t(g.n) * g.h * g.w * g.c, 0.0f);
    pool_backward_loop(kind == PoolKind::max, tiles, g, x, dy, dx, s.best_value.data(), s.best_position.data());
}

void channel_sums(int rows, int c, const float* x, const float* shift, bool squares, float* out, CnnScratch& s) {
    s.reserve_channels(c);
    double* acc = s.sum0.data();
    if (shift) {
        if (squares) channel_sums_loop<true, true>(rows, c, x, shift, acc);
        else channel_sums_loop<true, false>(rows, c, x, shift, acc);
    } else {
        if (squares) channel_sums_loop<false, true>(rows, c, x, shift, acc);
        else channel_sums_loop<false, false>(rows, c, x, shift, acc);
    }
    for (int ch = 0; ch < c; ++ch) out[ch] = float(acc[ch]);
}

// y may be x (in place): a row is read whole before it is written.
template <bool kRelu>
CNN_INLINE void affine_rows(int rows, int c, const float* x, const float* __restrict mean,
                            const float* __restrict invstd, const float* __restrict gamma, const float* __restrict beta,
                            float* y) {
    const auto value = [&](float v, int ch) __attribute__((always_inline)) {
        const float a = gamma[ch] * ((v - mean[ch]) * invstd[ch]) + beta[ch];
        return kRelu ? act_forward(Activation::relu, a) : a;
    };
    const bool fixed = with_row_width(
        c, [&](auto W) __attribute__((always_inline)) {
            for (int r = 0; r < rows; ++r) {
                float v[W];
                for (int ch = 0; ch < W; ++ch) v[ch] = x[size_t(r) * W + ch];
                float* yr = y + size_t(r) * W;
                for (int ch = 0; ch < W; ++ch) yr[ch] = value(v[ch], ch);
            }
        });
    if (fixed) return;
    for (int r = 0; r < rows; ++r) {
        const float* xr = x + size_t(r) * c;
        float* yr = y + size_t(r) * c;
        for (int ch = 0; ch < c; ++ch) yr[ch] = value(xr[ch], ch);
    }
}

CPU_LOOP_CLONES void channel_affine(int rows, int c, const float* x, const float* mean, const float* invstd,
                                    const float* gamma, const float* beta, float* y) {
    affine_rows<false>(rows, c, x, mean, invstd, gamma, beta, y);
}

CPU_LOOP_CLONES void channel_affine_relu(int rows, int c, const float* x, const float* mean, const float* invstd,
                                         const float* gamma, const float* beta, float* y) {
    affine_rows<true>(rows, c, x, mean, invstd, gamma, beta, y);
}

// Separate loops for y == a and y apart from both: a loop that might alias is vectorised behind
// a run-time overlap check.
template <bool kRelu>
CNN_INLINE void add_elements(size_t n, const float* __restrict a, const float* __restrict b, float* __restrict y) {
    for (size_t i = 0; i < n; ++i) {
        const float v = a[i] + b[i];
        y[i] = kRelu ? act_forward(Activation::relu, v) : v;
    }
}
template <bool kRelu>
CNN_INLINE void add_elements_into(size_t n, const float* __restrict b, float* __restrict y) {
    for (size_t i = 0; i < n; ++i) {
        const float v = y[i] + b[i];
        y[i] = kRelu ? act_forward(Activation::relu, v) : v;
    }
}

CPU_LOOP_CLONES void add_join(size_t n, const float* a, const float* b, bool relu, float* y) {
    if (y == a) relu ? add_elements_into<true>(n, b, y) : add_elements_into<false>(n, b, y);
    else relu ? add_elements<true>(n, a, b, y) : add_elements<false>(n, a, b, y);
}

void bn_backward_sums(int rows, int c, const float* dy, const float* x, const float* mean, const float* invstd,
                      float* out, CnnScratch& s) {
    s.reserve_channels(c);
    bn_sums_loop(rows, c, dy, x, mean, invstd, s.sum0.data(), s.sum1.data());
    for (int ch = 0; ch < c; ++ch) {
        out[ch] = float(s.sum0[size_t(ch)]);
        out[c + ch] = float(s.sum1[size_t(ch)]);
    }
}

// dx may be dy (in place): element-wise, and a row is read whole before it is written; x is
// never dx (the layer keeps its input for backward).
CPU_LOOP_CLONES void bn_backward_dx(int rows, int c, const float* dy, const float* x, const float* __restrict mean,
                                    const float* __restrict invstd, const float* __restrict gamma,
                                    const float* __restrict sums, float inv_count, float* dx) {
    // gamma * invstd * (dy - sums[ch] * inv_count - xhat * (sums[c + ch] * inv_count)), with the
    // products in brackets made once per channel: the same operations in the same order
    const auto value = [&](float d, float xv, int ch, float scale, float s0, float s1) __attribute__((always_inline)) {
        const float xhat = (xv - mean[ch]) * invstd[ch];
        return scale * (d - s0 - xhat * s1);
    };
    const bool fixed = with_row_width(
        c, [&](auto W) __attribute__((always_inline)) {
            float scale[W], s0[W], s1[W];
            for (int ch = 0; ch < W; ++ch) {
                scale[ch] = gamma[ch] * invstd[ch];
                s0[ch] = sums[ch] * inv_count;
                s1[ch] = sums[W + ch] * inv_count;
            }
            for (int r = 0; r < rows; ++r) {
                const float* __restrict xr = x + size_t(r) * W;
                float d[W];
                for (int ch = 0; ch < W; ++ch) d[ch] = dy[size_t(r) * W + ch];
                float* out = dx + size_t(r) * W;
                for (int ch = 0; ch < W; ++ch) out[ch] = value(d[ch], xr[ch], ch, scale[ch], s0[ch], s1[ch]);
            }
        });
    if (fixed) return;
    for (int r = 0; r < rows; ++r) {
        const float* dr = dy + size_t(r) * c;
        const float* xr = x + size_t(r) * c;
        float* out = dx + size_t(r) * c;
        for (int ch = 0; ch < c; ++ch)
            out[ch] = value(dr[ch], xr[ch], ch, gamma[ch] * invstd[ch], sums[ch] * inv_count, sums[c + ch] * inv_count);
    }
}

}  // namespace mirrored::cpu
