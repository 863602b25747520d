// The CPU backend's convolution, pooling and batchnorm passes over NHWC activations, written to
// run along a pixel's channels (contiguous), where they vectorise, and built for each vector
// width (loop_clones.h). Each computes exactly what the plain per-element definition does - the
// same operations on each element in the same order - so results are bit-identical to it; the
// definitions are in kernels/device.h and tested in tests/test_ops_cnn.cpp. f32 values: rounding
// to a 16-bit storage type is the caller's.
#pragma once

#include <cstddef>
#include <vector>

#include "kernels/device.h"

namespace mirrored::cpu {

// Scratch the passes use, grown once (no allocation per step).
struct CnnScratch {
    std::vector<const float*> window;  // im2col: each window position's source pixel
    std::vector<float*> window_out;    // col2im: each window position's destination pixel
    std::vector<float> zeros, sink;    // a padding pixel read (zeros) or written (discarded)
    std::vector<float> best_value;     // max-pool backward: each channel's maximum so far
    std::vector<int> best_position;    // and its window position
    std::vector<double> sum0, sum1;    // batchnorm: per-channel sums
    void reserve(const Window2d& g);   // for a window's channels and positions
    void reserve_channels(int c);
};

// The scratch of the thread running a pass (a CPU replica's, a simulated GPU's stream thread): a
// pass uses it only while it runs, so every op family on the thread shares one.
inline CnnScratch& thread_scratch() {
    thread_local CnnScratch s;
    return s;
}

void im2col(const Window2d& g, const float* x, float* col, CnnScratch& s);
// dx = 0, then each column entry added into the input it was read from, windows in order.
void col2im(const Window2d& g, const float* dcol, float* dx, CnnScratch& s);
void pool_forward(PoolKind kind, const Window2d& g, const float* x, float* y);
// dx = 0, then each window's gradient: average spread over the window, max to its first maximum.
void pool_backward(PoolKind kind, const Window2d& g, const float* x, const float* dy, float* dx, CnnScratch& s);

// out[ch] = sum over rows of (x - shift[ch]) or its square, in f64 (shift may be null).
void channel_sums(int rows, int c, const float* x, const float* shift, bool squares, float* out, CnnScratch& s);
void channel_affine(int rows, int c, const float* x, const float* mean, const float* invstd, const float* gamma,
                    const float* beta, float* y);
// The same, then max(., 0) in the same pass.
void channel_affine_relu(int rows, int c, const float* x, const float* mean, const float* invstd, const float* gamma,
                         const float* beta, float* y);
// y = a + b, then max(., 0) with relu, in one pass; y may be a, not b.
void add_join(size_t n, const float* a, const float* b, bool relu, float* y);
// out[0, c) = sum of dy, out[c, 2c) = sum of dy * xhat, in f64.
void bn_backward_sums(int rows, int c, const float* dy, const float* x, const float* mean, const float* invstd,
                      float* out, CnnScratch& s);
void bn_backward_dx(int rows, int c, const float* dy, const float* x, const float* mean, const float* invstd,
                    const float* gamma, const float* sums, float inv_count, float* dx);

}  // namespace mirrored::cpu
