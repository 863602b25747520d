// RoPE's CUDA kernel (rope.h): one thread per (row, head, pair), the frequencies from the host (the
// CPU's, so that both rotate by the same angles), the angle's cos and sin by sincosf (accurate, not
// the fast intrinsic: the angles reach thousands of radians).
#include "kernels/cuda/kernel_util.cuh"
#include "kernels/ops/rope.h"

namespace mirrored::cuda {

namespace {

template <typename T>
__global__ void rope_kernel(int64_t pairs, RopeShape r, RopeFrequencies f, float sign, T* x) {
    const int half_d = r.head_dim / 2;
    GRID_LOOP(k, size_t(pairs)) {
        const int e = int(k % half_d);
        const int64_t hk = int64_t(k / half_d);
        const int h = int(hk % r.heads);
        const int64_t row = hk / r.heads;
        const float angle = float(r.first_position + int(row % r.t)) * f.f[e];
        float sn, cs;
        sincosf(angle, &sn, &cs);
        sn *= sign;
        const size_t a = size_t(row) * r.row_width + size_t(h) * r.head_dim + e, b = a + half_d;
        const float u = ld(x, a), v = ld(x, b);
        st(x, a, u * cs - v * sn);
        st(x, b, v * cs + u * sn);
    }
}

int rotate(const Device::NativeLaunch& l, const RopeShape& r, const RopeFrequencies& f, bool inverse, void* x) {
    const int64_t pairs = int64_t(r.samples) * r.t * r.heads * (r.head_dim / 2);
    if (pairs <= 0) return 0;
    const cudaStream_t s = stream_of(l);
    DISPATCH(l.act,
             rope_kernel<<<grid_for(size_t(pairs)), kThreads, 0, s>>>(pairs, r, f, inverse ? -1.0f : 1.0f, as<T>(x)));
    CUDA_LAUNCH_CHECK(l.device);
    return 1;
}

const struct Register {
    Register() { rope_cuda = {rotate}; }
} registered;

}  // namespace

}  // namespace mirrored::cuda
