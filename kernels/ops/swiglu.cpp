#include "kernels/ops/swiglu.h"

#include "kernels/cpu/loop_clones.h"

namespace mirrored {

SwigluKernels swiglu_cuda;

namespace cpu {

CPU_LOOP_CLONES void swiglu_forward_row(DType dt, int w, const float* __restrict gu, float* __restrict out) {
    with_storage_type(
        dt, [&](auto T) __attribute__((always_inline)) {
            for (int j = 0; j < w; ++j) {
                const float g = gu[j];
                out[j] = round_to(T, g * swiglu_sigmoid(g) * gu[w + j]);
            }
        });
}

CPU_LOOP_CLONES void swiglu_backward_row(DType dt, int w, const float* __restrict gu, const float* __restrict dout,
                                         float* __restrict dgu) {
    with_storage_type(
        dt, [&](auto T) __attribute__((always_inline)) {
            for (int j = 0; j < w; ++j) {
                const float g = gu[j], u = gu[w + j], sg = swiglu_sigmoid(g);
                dgu[j] = round_to(T, dout[j] * u * (sg * (1.0f + g * (1.0f - sg))));
                dgu[w + j] = round_to(T, dout[j] * (g * sg));
            }
        });
}

}  // namespace cpu

void swiglu_forward(Device& d, Stream s, int rows, int w, const void* gate_up, void* out) {
    if (d.runs_cuda_kernels()) return launch_cuda(d, s, swiglu_cuda.forward, "swiglu_forward", rows, w, gate_up, out);
    run_on_host(d, s, "swiglu_forward", [=](const Device& h) {
        for (int r = 0; r < rows; ++r)
            cpu::swiglu_forward_row(h.value_dtype(), w, as_floats(gate_up) + size_t(r) * 2 * w,
                                    as_floats(out) + size_t(r) * w);
    });
}

void swiglu_backward(Device& d, Stream s, int rows, int w, const void* gate_up, const void* dout, void* dgate_up) {
    if (d.runs_cuda_kernels())
        return launch_cuda(d, s, swiglu_cuda.backward, "swiglu_backward", rows, w, gate_up, dout, dgate_up);
    run_on_host(d, s, "swiglu_backward", [=](const Device& h) {
        for (int r = 0; r < rows; ++r)
            cpu::swiglu_backward_row(h.value_dtype(), w, as_floats(gate_up) + size_t(r) * 2 * w,
                                     as_floats(dout) + size_t(r) * w, as_floats(dgate_up) + size_t(r) * 2 * w);
    });
}

}  // namespace mirrored
