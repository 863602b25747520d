// Convolution and pooling over NHWC images (Window2d, kernels/device.h): im2col's columns and
// their adjoint col2im, max and average pooling and their backward, the NHWC <-> NCHW transpose,
// and, on CPU replicas with the JIT kernels, convolutions straight from the images. The CPU loops
// (conv.cpp over kernels/cpu/cnn_loops.h, the reference) and the CUDA kernels (conv.cu: gathers
// in a fixed window order, no atomics) side by side. A stored result is rounded to the storage
// type.
#pragma once

#include "kernels/device.h"

namespace mirrored {

// col[n*oh*ow, c*kh*kw] from x[n,h,w,c]; the column index runs over (channel, ky, kx), the order
// of PyTorch's conv weight [out, in, kh, kw], or with g.pixel_major over (ky, kx, channel);
// padding reads zeros.
void im2col(Device& d, Stream s, const Window2d& g, const void* x, void* col);
// The adjoint: dx[n,h,w,c] = the sum of every column entry that read it (fixed order).
void col2im(Device& d, Stream s, const Window2d& g, const void* dcol, void* dx);
// y[n,oh,ow,c] over the windows of g. Max: padding is -inf and the first maximum of a window
// takes its gradient. Average: padding counts as zeros in the mean (PyTorch's default).
void pool_forward(Device& d, Stream s, PoolKind kind, const Window2d& g, const void* x, void* y);
void pool_backward(Device& d, Stream s, PoolKind kind, const Window2d& g, const void* x, const void* dy, void* dx);
// [n,h,w,c] <-> [n,c,h,w]: flatten in PyTorch's order, so exported dense weights fit.
void nhwc_to_nchw(Device& d, Stream s, int n, int h, int w, int c, const void* x, void* y, bool inverse);

// A convolution's forward product straight from the images, where the device has a kernel for
// it (CPU replicas with the JIT GEMMs): z[n*oh*ow, filters] = pixel-major im2col(x) times
// wt[kh, kw, c, filters], without the columns. false, nothing done, where it has none; types as
// gemm's.
bool conv_forward(Device& d, Stream s, const Window2d& g, const void* x, const float* wt, int filters, void* z,
                  GemmTypes types);
// Its gradients the same way (false, nothing done, where the device has no kernel):
// dw[filters, kh, kw, c] = dz^T . pixel-major im2col(x), overwritten, in f32; and
// dx = col2im(dz . w[filters, kh, kw, c]) - f32 only: the emulated 16-bit types round the
// columns' gradient before col2im adds it up, as a GPU stores it, which this sum skips.
bool conv_weight_grad(Device& d, Stream s, const Window2d& g, const void* x, const void* dz, int filters, float* dw);
bool conv_input_grad(Device& d, Stream s, const Window2d& g, const void* dz, const float* w, int filters, void* dx);

// The CUDA launchers, set by conv.cu where the CUDA backend is built; each returns the kernels it
// launched.
struct ConvKernels {
    int (*im2col)(const Device::NativeLaunch& l, const Window2d& g, const void* x, void* col) = nullptr;
    int (*col2im)(const Device::NativeLaunch& l, const Window2d& g, const void* dcol, void* dx) = nullptr;
    int (*pool_forward)(const Device::NativeLaunch& l, PoolKind kind, const Window2d& g, const void* x,
                        void* y) = nullptr;
    int (*pool_backward)(const Device::NativeLaunch& l, PoolKind kind, const Window2d& g, const void* x, const void* dy,
                         void* dx) = nullptr;
    int (*nhwc_to_nchw)(const Device::NativeLaunch& l, int n, int h, int w, int c, const void* x, void* y,
                        bool inverse) = nullptr;
};
extern ConvKernels conv_cuda;

}  // namespace mirrored
