// The gated MLP activation of Llama's MLP (SwiGLU): from a row [gate | up] of 2w values,
// out = silu(gate) * up, silu(g) = g sigmoid(g) - Hugging Face's act_fn(gate_proj(x)) * up_proj(x)
// with both projections as one product. In f32, rounded once to the storage type. The CPU loops
// (swiglu.cpp, the reference) and the CUDA kernels (swiglu.cu).
#pragma once

#include "kernels/op_math.h"

namespace mirrored {

// rows of gate_up [rows, 2w] -> out [rows, w].
void swiglu_forward(Device& d, Stream s, int rows, int w, const void* gate_up, void* out);
// dgate_up [rows, 2w] (written) from dout [rows, w]:
//   dgate = dout up sigmoid(g) (1 + g (1 - sigmoid(g))),  dup = dout silu(g).
void swiglu_backward(Device& d, Stream s, int rows, int w, const void* gate_up, const void* dout, void* dgate_up);

// The sigmoid on exp_poly: the same bits on every backend, no overflow for any g.
MIRRORED_HD float swiglu_sigmoid(float g) { return 1.0f / (1.0f + exp_poly(-g)); }

// The CUDA launchers, set by swiglu.cu where the CUDA backend is built; each returns the kernels
// it launched.
struct SwigluKernels {
    int (*forward)(const Device::NativeLaunch& l, int rows, int w, const void* gate_up, void* out) = nullptr;
    int (*backward)(const Device::NativeLaunch& l, int rows, int w, const void* gate_up, const void* dout,
                    void* dgate_up) = nullptr;
};
extern SwigluKernels swiglu_cuda;

}  // namespace mirrored
