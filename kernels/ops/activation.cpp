#include "kernels/ops/activation.h"

#include <vector>

#include "kernels/cpu/act_loops.h"
#include "kernels/cpu/loop_clones.h"

namespace mirrored {

ActivationKernels activation_cuda;

void bias_activation(Device& d, Stream s, Activation act, int rows, int cols, const float* bias, void* z, void* out) {
    if (d.runs_cuda_kernels())
        return launch_cuda(d, s, activation_cuda.bias_act, "bias_act_forward", act, rows, cols, bias, z, out);
    run_on_host(d, s, "bias_act_forward", [=](const Device& h) {
        const DType t = h.value_dtype();
        for (int i = 0; i < rows; ++i) {
            float* zr = as_floats(z) + size_t(i) * size_t(cols);
            float* orow = as_floats(out) + size_t(i) * size_t(cols);
            if (orow == zr) cpu::bias_act_in_place(act, t, cols, bias, zr);  // ReLU: the output is the gradient's key
            else cpu::bias_act_apart(act, t, cols, bias, zr, orow);
        }
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
    run_on_host(d, s, "bias_grad", [=](const Device&) {
        thread_local std::vector<float> sums;  // the thread's scratch: grown once, then reused
        if (sums.size() < size_t(cols)) sums.resize(size_t(cols));
        cpu::column_sums(rows, cols, as_floats(dz), sums.data());
        for (int j = 0; j < cols; ++j) db[j] = accumulate ? db[j] + sums[size_t(j)] : sums[size_t(j)];
    });
}

}  // namespace mirrored
