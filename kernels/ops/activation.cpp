#include "kernels/ops/activation.h"

#include <vector>

#include "kernels/cpu/act_loops.h"
#include "kernels/cpu/loop_clones.h"

namespace mirrored {

ActivationKernels activation_cuda;

namespace cpu {

void bias_activation(DType t, Activation act, int rows, int cols, const float* bias, float* z, float* out) {
    for (int i = 0; i < rows; ++i) {
        float* zr = z + size_t(i) * size_t(cols);
        float* orow = out + size_t(i) * size_t(cols);
        if (orow == zr) bias_act_in_place(act, t, cols, bias, zr);  // ReLU: the output is the gradient's key
        else bias_act_apart(act, t, cols, bias, zr, orow);
    }
}

void bias_gradient(int rows, int cols, const float* dz, float* db, bool accumulate) {
    thread_local std::vector<float> sums;  // the thread's scratch: grown once, then reused
    if (sums.size() < size_t(cols)) sums.resize(size_t(cols));
    column_sums(rows, cols, dz, sums.data());
    for (int j = 0; j < cols; ++j) db[j] = accumulate ? db[j] + sums[size_t(j)] : sums[size_t(j)];
}

}  // namespace cpu

void bias_activation(Device& d, Stream s, Activation act, int rows, int cols, const float* bias, void* z, void* out) {
    if (d.runs_cuda_kernels())
        return launch_cuda(d, s, activation_cuda.bias_act, "bias_act_forward", act, rows, cols, bias, z, out);
    run_on_host(d, s, "bias_act_forward", [=](const Device& h) {
        cpu::bias_activation(h.value_dtype(), act, rows, cols, bias, as_floats(z), as_floats(out));
    });
}

void activation_backward(Device& d, Stream s, Activation act, size_t n, const void* z, const void* dout, void* dz) {
    if (d.runs_cuda_kernels()) return launch_cuda(d, s, activation_cuda.backward, "act_backward", act, n, z, dout, dz);
    run_on_host(d, s, "act_backward", [=](const Device& h) {
        const float* zf = as_floats(z);
        const float* g = as_floats(dout);
        float* out = as_floats(dz);
        if (out == g) cpu::act_backward_in_place(act, h.value_dtype(), n, zf, out);  // the usual call
        else cpu::act_backward_apart(act, h.value_dtype(), n, zf, g, out);
    });
}

void bias_gradient(Device& d, Stream s, int rows, int cols, const void* dz, float* db, bool accumulate) {
    if (d.runs_cuda_kernels())
        return launch_cuda(d, s, activation_cuda.bias_grad, "bias_grad", rows, cols, dz, db, accumulate);
    run_on_host(d, s, "bias_grad",
                [=](const Device&) { cpu::bias_gradient(rows, cols, as_floats(dz), db, accumulate); });
}

}  // namespace mirrored
