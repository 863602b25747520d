// The flat-buffer passes' CUDA launchers (flat.h). Their kernels stay in kernels/cuda/cuda_kernels.cu,
// where the cuBLAS products also clear and scale their outputs with fill and scale.
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/op_math.h"
#include "kernels/ops/flat.h"

namespace mirrored::cuda {

namespace {

int fill_launch(const Device::NativeLaunch& l, size_t n, float value, float* x) {
    fill(stream_of(l), l.device, n, value, x);
    return 1;
}
int scale_launch(const Device::NativeLaunch& l, size_t n, float alpha, float* x) {
    scale(stream_of(l), l.device, n, alpha, x);
    return 1;
}
int axpy_launch(const Device::NativeLaunch& l, size_t n, float alpha, const float* x, float* y) {
    axpy(stream_of(l), l.device, n, alpha, x, y);
    return 1;
}
int step_values_launch(const Device::NativeLaunch& l, const StepValues& v, StepValues* dst) {
    set_step_values(stream_of(l), l.device, v, dst);
    return 1;
}
int sum_squares_launch(const Device::NativeLaunch& l, size_t n, const float* x, const float* loss_scale, float* out) {
    sum_squares(stream_of(l), l.device, n, x, loss_scale, out, l.scratch);
    return 2;
}
int init_launch(const Device::NativeLaunch& l, const InitArgs& a, size_t n, float* out) {
    init_params(stream_of(l), l.device, a, init_scale(a), n, out);
    return 1;
}
int checksum_launch(const Device::NativeLaunch& l, size_t n, const float* x, uint64_t* out) {
    checksum(stream_of(l), l.device, n, x, out);
    return 1;
}

const struct Register {
    Register() {
        flat_cuda = {fill_launch,        scale_launch, axpy_launch,    step_values_launch,
                     sum_squares_launch, init_launch,  checksum_launch};
    }
} registered;

}  // namespace

}  // namespace mirrored::cuda
