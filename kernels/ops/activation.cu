// The activation family's CUDA launchers (activation.h). Their kernels stay in
// kernels/cuda/cuda_kernels.cu, where the fused products fall back to them.
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/ops/activation.h"

namespace mirrored::cuda {

namespace {

int bias_act_launch(const Device::NativeLaunch& l, Activation act, int rows, int cols, const float* bias, void* z,
                    void* out) {
    bias_act_forward(stream_of(l), l.device, l.act, act, rows, cols, bias, z, out);
    return 1;
}
int backward_launch(const Device::NativeLaunch& l, Activation act, size_t n, const void* z, const void* dout,
                    void* dz) {
    act_backward(stream_of(l), l.device, l.act, act, n, z, dout, dz);
    return 1;
}
int bias_grad_launch(const Device::NativeLaunch& l, int rows, int cols, const void* dz, float* db, bool accumulate) {
    return bias_grad(stream_of(l), l.device, l.act, rows, cols, dz, db, accumulate, l.scratch);
}

const struct Register {
    Register() { activation_cuda = {bias_act_launch, backward_launch, bias_grad_launch}; }
} registered;

}  // namespace

}  // namespace mirrored::cuda
