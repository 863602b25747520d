#include "kernels/ops/elementwise.h"

#include "kernels/cpu/cnn_loops.h"
#include "kernels/cpu/loop_clones.h"
#include "kernels/op_math.h"
#include "kernels/ops/activation.h"

namespace mirrored {

ElementwiseKernels elementwise_cuda;

void convert_values(Device& d, Stream s, size_t n, const void* x, DType xt, void* y, DType yt) {
    if (d.runs_cuda_kernels()) return launch_cuda(d, s, elementwise_cuda.convert, "convert", n, x, xt, y, yt);
    run_on_host(d, s, "convert", [=](const Device&) {
        for (size_t i = 0; i < n; ++i) as_floats(y)[i] = round_to(yt, as_floats(x)[i]);
    });
}

void add_values(Device& d, Stream s, size_t n, const void* x, void* y) {
    if (d.runs_cuda_kernels()) return launch_cuda(d, s, elementwise_cuda.add, "add", n, x, y);
    run_on_host(d, s, "add", [=](const Device& h) {
        const DType t = h.value_dtype();
        if (t == DType::f32)
            return cpu::add_join(n, as_floats(y), as_floats(x), false, as_floats(y));  // vectorised, the same sums
        for (size_t i = 0; i < n; ++i) as_floats(y)[i] = round_to(t, as_floats(y)[i] + as_floats(x)[i]);
    });
}

void add_act_values(Device& d, Stream s, Activation act, int rows, int cols, const void* a, const void* b, void* y) {
    const size_t n = size_t(rows) * size_t(cols);
    // a CPU replica in f32 joins in one vectorised pass; elsewhere the composition a GPU runs
    if (d.asynchronous() || d.value_dtype() != DType::f32 || (act != Activation::relu && act != Activation::none)) {
        if (y != a) d.copy_on_device(s, y, a, d.act_bytes(n));
        add_values(d, s, n, b, y);
        if (act != Activation::none) bias_activation(d, s, act, rows, cols, nullptr, y, y);
        return;
    }
    run_on_host(d, s, "add_act", [=](const Device&) {
        cpu::add_join(n, as_floats(a), as_floats(b), act == Activation::relu, as_floats(y));
    });
}

void pack_bf16_values(Device& d, Stream s, size_t n, const float* x, uint16_t* y) {
    if (d.runs_cuda_kernels())
        return launch_cuda(d, s, elementwise_cuda.convert, "pack_bf16", n, x, DType::f32, y, DType::bf16);
    run_on_host(d, s, "pack_bf16", [=](const Device&) {
        for (size_t i = 0; i < n; ++i) y[i] = bf16_bits(x[i]);
    });
}

void unpack_bf16_values(Device& d, Stream s, size_t n, const uint16_t* x, float* y) {
    if (d.runs_cuda_kernels())
        return launch_cuda(d, s, elementwise_cuda.convert, "unpack_bf16", n, x, DType::bf16, y, DType::f32);
    run_on_host(d, s, "unpack_bf16", [=](const Device&) {
        for (size_t i = 0; i < n; ++i) y[i] = bf16_value(x[i]);
    });
}

}  // namespace mirrored
