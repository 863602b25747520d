#include "kernels/ops/conv.h"

#include "kernels/cpu/cnn_loops.h"
#include "kernels/cpu/jit_gemm.h"
#include "kernels/cpu/loop_clones.h"
#include "kernels/op_math.h"

namespace mirrored {

ConvKernels conv_cuda;

namespace {

// The JIT kernels run on CPU replicas only, which compute at once on their own thread.
bool has_jit_convolutions(const Device& d) { return d.type() == DeviceType::cpu && !d.asynchronous(); }

}  // namespace

void im2col(Device& d, Stream s, const Window2d& g, const void* x, void* col) {
    if (d.runs_cuda_kernels()) return launch_cuda(d, s, conv_cuda.im2col, "im2col", g, x, col);
    run_on_host(d, s, "im2col",
                [=](const Device&) { cpu::im2col(g, as_floats(x), as_floats(col), cpu::thread_scratch()); });
}

void col2im(Device& d, Stream s, const Window2d& g, const void* dcol, void* dx) {
    if (d.runs_cuda_kernels()) return launch_cuda(d, s, conv_cuda.col2im, "col2im", g, dcol, dx);
    run_on_host(d, s, "col2im", [=](const Device& h) {
        cpu::col2im(g, as_floats(dcol), as_floats(dx), cpu::thread_scratch());
        round_stored(as_floats(dx), size_t(g.n) * g.h * g.w * g.c, h.value_dtype());
    });
}

void pool_forward(Device& d, Stream s, PoolKind kind, const Window2d& g, const void* x, void* y) {
    if (d.runs_cuda_kernels()) return launch_cuda(d, s, conv_cuda.pool_forward, "pool_forward", kind, g, x, y);
    run_on_host(d, s, "pool_forward", [=](const Device& h) {
        cpu::pool_forward(kind, g, as_floats(x), as_floats(y));
        round_stored(as_floats(y), size_t(g.n) * g.oh() * g.ow() * g.c, h.value_dtype());
    });
}

void pool_backward(Device& d, Stream s, PoolKind kind, const Window2d& g, const void* x, const void* dy, void* dx) {
    if (d.runs_cuda_kernels()) return launch_cuda(d, s, conv_cuda.pool_backward, "pool_backward", kind, g, x, dy, dx);
    run_on_host(d, s, "pool_backward", [=](const Device& h) {
        cpu::pool_backward(kind, g, as_floats(x), as_floats(dy), as_floats(dx), cpu::thread_scratch());
        round_stored(as_floats(dx), size_t(g.n) * g.h * g.w * g.c, h.value_dtype());
    });
}

void nhwc_to_nchw(Device& d, Stream s, int n, int h, int w, int c, const void* x, void* y, bool inverse) {
    if (d.runs_cuda_kernels())
        return launch_cuda(d, s, conv_cuda.nhwc_to_nchw, "nhwc_to_nchw", n, h, w, c, x, y, inverse);
    run_on_host(d, s, "nhwc_to_nchw", [=](const Device&) {
        const float* in = as_floats(x);
        float* out = as_floats(y);
        const size_t hw = size_t(h) * w;
        for (int b = 0; b < n; ++b)
            for (size_t p = 0; p < hw; ++p)
                for (int ch = 0; ch < c; ++ch) {
                    const size_t nhwc = (size_t(b) * hw + p) * c + ch, nchw = (size_t(b) * c + ch) * hw + p;
                    if (inverse) out[nhwc] = in[nchw];
                    else out[nchw] = in[nhwc];
                }
    });
}

bool conv_forward(Device& d, Stream, const Window2d& g, const void* x, const float* wt, int filters, void* z,
                  GemmTypes types) {
    if (!has_jit_convolutions(d) || !jit_conv_forward(g, as_floats(x), wt, filters, as_floats(z))) return false;
    // as gemm: the product's output rounded to its storage type
    round_stored(as_floats(z), size_t(g.n) * g.oh() * g.ow() * size_t(filters), types.c);
    return true;
}

bool conv_weight_grad(Device& d, Stream, const Window2d& g, const void* x, const void* dz, int filters, float* dw) {
    return has_jit_convolutions(d) && jit_conv_weight_grad(g, as_floats(x), as_floats(dz), filters, dw);
}

bool conv_input_grad(Device& d, Stream, const Window2d& g, const void* dz, const float* w, int filters, void* dx) {
    return has_jit_convolutions(d) && d.value_dtype() == DType::f32 &&
           jit_conv_input_grad(g, as_floats(dz), w, filters, as_floats(dx));
}

}  // namespace mirrored
