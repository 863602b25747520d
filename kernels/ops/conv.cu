// Convolution and pooling's CUDA kernels (conv.h): one thread per output value; the backward passes
// gather, each input summing the windows that read it in a fixed order (no atomics).
#include <cmath>
#include <cstdint>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/kernel_util.cuh"
#include "kernels/ops/conv.h"

namespace mirrored::cuda {

namespace {

template <typename T>
__global__ void im2col_kernel(Window2d g, const T* x, T* col) {
    const int oh = g.oh(), ow = g.ow(), kk = g.kh * g.kw;
    const size_t K = size_t(g.c) * kk, total = size_t(g.n) * oh * ow * K;
    GRID_LOOP(i, total) {
        const size_t m = i / K;
        const int k = int(i % K), c = g.pixel_major ? k % g.c : k / kk, p = g.pixel_major ? k / g.c : k % kk;
        const int ky = p / g.kw, kx = p % g.kw;
        const int ox = int(m % ow), oy = int((m / ow) % oh), n = int(m / (size_t(ow) * oh));
        const int iy = oy * g.sh + ky - g.ph, ix = ox * g.sw + kx - g.pw;
        const bool inside = iy >= 0 && iy < g.h && ix >= 0 && ix < g.w;
        st(col, i, inside ? ld(x, ((size_t(n) * g.h + iy) * g.w + ix) * g.c + c) : 0.0f);
    }
}

int im2col(const Device::NativeLaunch& l, const Window2d& g, const void* x, void* col) {
    const size_t total = size_t(g.n) * g.oh() * g.ow() * g.c * g.kh * g.kw;
    if (total == 0) return 0;
    DISPATCH(l.act, im2col_kernel<<<grid_for(total), kThreads, 0, stream_of(l)>>>(g, as<T>(x), as<T>(col)));
    CUDA_LAUNCH_CHECK(l.device);
    return 1;
}

// The adjoint of im2col as a gather: each input element sums the column entries that read it,
// windows in a fixed order (no atomics).
template <typename T>
__global__ void col2im_kernel(Window2d g, const T* dcol, T* dx) {
    const int oh = g.oh(), ow = g.ow(), kk = g.kh * g.kw;
    const size_t K = size_t(g.c) * kk, total = size_t(g.n) * g.h * g.w * g.c;
    GRID_LOOP(i, total) {
        const int c = int(i % g.c), ix = int((i / g.c) % g.w), iy = int((i / (size_t(g.c) * g.w)) % g.h);
        const int n = int(i / (size_t(g.c) * g.w * g.h));
        float sum = 0.0f;
        g.for_each_window(iy, ix, [&](int oy, int ox, int ky, int kx) {
            const size_t k = g.pixel_major ? size_t(ky * g.kw + kx) * g.c + c : size_t(c) * kk + ky * g.kw + kx;
            sum += ld(dcol, ((size_t(n) * oh + oy) * ow + ox) * K + k);
        });
        st(dx, i, sum);
    }
}

int col2im(const Device::NativeLaunch& l, const Window2d& g, const void* dcol, void* dx) {
    const size_t total = size_t(g.n) * g.h * g.w * g.c;
    if (total == 0) return 0;
    DISPATCH(l.act, col2im_kernel<<<grid_for(total), kThreads, 0, stream_of(l)>>>(g, as<T>(dcol), as<T>(dx)));
    CUDA_LAUNCH_CHECK(l.device);
    return 1;
}

// The first maximum of window (oy, ox) for channel c: its flat input index, or SIZE_MAX if the
// window lies entirely in the padding.
template <typename T>
__device__ size_t window_argmax(const Window2d& g, const T* x, int n, int oy, int ox, int c) {
    size_t best = SIZE_MAX;
    float best_v = -INFINITY;
    g.for_each_input(oy, ox, [&](int iy, int ix, int, int) {
        const size_t e = ((size_t(n) * g.h + iy) * g.w + ix) * g.c + c;
        const float v = ld(x, e);
        if (best == SIZE_MAX || v > best_v) {
            best = e;
            best_v = v;
        }
    });
    return best;
}

template <typename T>
__global__ void pool_forward_kernel(PoolKind kind, Window2d g, const T* x, T* y) {
    const int oh = g.oh(), ow = g.ow();
    const float inv = 1.0f / float(g.kh * g.kw);
    GRID_LOOP(i, size_t(g.n) * oh * ow * g.c) {
        const int c = int(i % g.c), ox = int((i / g.c) % ow), oy = int((i / (size_t(g.c) * ow)) % oh);
        const int n = int(i / (size_t(g.c) * ow * oh));
        if (kind == PoolKind::max) {
            const size_t e = window_argmax(g, x, n, oy, ox, c);
            st(y, i, e == SIZE_MAX ? -INFINITY : ld(x, e));
            continue;
        }
        float acc = 0.0f;
        g.for_each_input(
            oy, ox, [&](int iy, int ix, int, int) { acc += ld(x, ((size_t(n) * g.h + iy) * g.w + ix) * g.c + c); });
        st(y, i, acc * inv);
    }
}

int pool_forward(const Device::NativeLaunch& l, PoolKind kind, const Window2d& g, const void* x, void* y) {
    const size_t total = size_t(g.n) * g.oh() * g.ow() * g.c;
    if (total == 0) return 0;
    DISPATCH(l.act, pool_forward_kernel<<<grid_for(total), kThreads, 0, stream_of(l)>>>(kind, g, as<T>(x), as<T>(y)));
    CUDA_LAUNCH_CHECK(l.device);
    return 1;
}

// Gather: each input element sums dy over the windows that cover it (max: only where it is the
// window's first maximum), windows in a fixed order.
template <typename T>
__global__ void pool_backward_kernel(PoolKind kind, Window2d g, const T* x, const T* dy, T* dx) {
    const int oh = g.oh(), ow = g.ow();
    const float inv = 1.0f / float(g.kh * g.kw);
    GRID_LOOP(i, size_t(g.n) * g.h * g.w * g.c) {
        const int c = int(i % g.c), ix = int((i / g.c) % g.w), iy = int((i / (size_t(g.c) * g.w)) % g.h);
        const int n = int(i / (size_t(g.c) * g.w * g.h));
        float sum = 0.0f;
        g.for_each_window(iy, ix, [&](int oy, int ox, int, int) {
            const float d = ld(dy, ((size_t(n) * oh + oy) * ow + ox) * g.c + c);
            if (kind == PoolKind::average) sum += d * inv;
            else if (window_argmax(g, x, n, oy, ox, c) == i) sum += d;
        });
        st(dx, i, sum);
    }
}

int pool_backward(const Device::NativeLaunch& l, PoolKind kind, const Window2d& g, const void* x, const void* dy,
                  void* dx) {
    const size_t total = size_t(g.n) * g.h * g.w * g.c;
    if (total == 0) return 0;
    DISPATCH(l.act, pool_backward_kernel<<<grid_for(total), kThreads, 0, stream_of(l)>>>(kind, g, as<T>(x), as<T>(dy),
                                                                                         as<T>(dx)));
    CUDA_LAUNCH_CHECK(l.device);
    return 1;
}

template <typename T>
__global__ void nhwc_to_nchw_kernel(int n, int h, int w, int c, const T* x, T* y, bool inverse) {
    const size_t hw = size_t(h) * w;
    GRID_LOOP(i, size_t(n) * hw * c) {  // i runs over NCHW positions
        const size_t p = i % hw, ch = (i / hw) % c, b = i / (hw * c);
        const size_t nhwc = (b * hw + p) * c + ch;
        if (inverse) st(y, nhwc, ld(x, i));
        else st(y, i, ld(x, nhwc));
    }
}

int nhwc_to_nchw(const Device::NativeLaunch& l, int n, int h, int w, int c, const void* x, void* y, bool inverse) {
    const size_t total = size_t(n) * h * w * c;
    if (total == 0) return 0;
    DISPATCH(l.act, nhwc_to_nchw_kernel<<<grid_for(total), kThreads, 0, stream_of(l)>>>(n, h, w, c, as<T>(x), as<T>(y),
                                                                                        inverse));
    CUDA_LAUNCH_CHECK(l.device);
    return 1;
}

const struct Register {
    Register() { conv_cuda = {im2col, col2im, pool_forward, pool_backward, nhwc_to_nchw}; }
} registered;

}  // namespace

}  // namespace mirrored::cuda
