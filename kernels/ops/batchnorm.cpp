#include "kernels/ops/batchnorm.h"

#include "kernels/cpu/cnn_loops.h"
#include "kernels/cpu/loop_clones.h"
#include "kernels/op_math.h"
#include "kernels/ops/activation.h"

namespace mirrored {

BatchnormKernels batchnorm_cuda;

void channel_sums(Device& d, Stream s, int rows, int c, const void* x, const float* shift, bool squares, float* out) {
    if (d.runs_cuda_kernels())
        return launch_cuda(d, s, batchnorm_cuda.channel_sums, "channel_sums", rows, c, x, shift, squares, out);
    run_on_host(d, s, "channel_sums", [=](const Device&) {
        cpu::channel_sums(rows, c, as_floats(x), shift, squares, out, cpu::thread_scratch());
    });
}

void bn_finalize(Device& d, Stream s, const BnStats& a, const float* sum, const float* sqsum, float* mean,
                 float* invstd, float* run_mean, float* run_var) {
    if (d.runs_cuda_kernels())
        return launch_cuda(d, s, batchnorm_cuda.finalize, "bn_finalize", a, sum, sqsum, mean, invstd, run_mean,
                           run_var);
    run_on_host(d, s, "bn_finalize", [=](const Device&) {
        for (int ch = 0; ch < a.channels; ++ch) bn_finalize_channel(a, ch, sum, sqsum, mean, invstd, run_mean, run_var);
    });
}

void rsqrt_eps(Device& d, Stream s, int c, const float* var, float eps, float* invstd) {
    if (d.runs_cuda_kernels()) return launch_cuda(d, s, batchnorm_cuda.rsqrt_eps, "rsqrt_eps", c, var, eps, invstd);
    run_on_host(d, s, "rsqrt_eps", [=](const Device&) {
        for (int ch = 0; ch < c; ++ch) invstd[ch] = bn_invstd(var[ch], eps);
    });
}

void channel_affine(Device& d, Stream s, Activation act, int rows, int c, const void* x, const float* mean,
                    const float* invstd, const float* gamma, const float* beta, void* y) {
    if (d.runs_cuda_kernels()) {
        launch_cuda(d, s, batchnorm_cuda.affine, "channel_affine", rows, c, x, mean, invstd, gamma, beta, y);
    } else {
        // one pass on a CPU replica where nothing is rounded (f32) and the activation is ReLU: the
        // same arithmetic as the two (kernels/cpu is built without contraction); a simulated GPU
        // launches the two, as CUDA does, so that its launch count prices a GPU's
        const bool one_pass = !d.asynchronous() && act == Activation::relu && d.value_dtype() == DType::f32;
        run_on_host(d, s, "channel_affine", [=](const Device& h) {
            if (one_pass) {
                cpu::channel_affine_relu(rows, c, as_floats(x), mean, invstd, gamma, beta, as_floats(y));
            } else {
                cpu::channel_affine(rows, c, as_floats(x), mean, invstd, gamma, beta, as_floats(y));
                round_stored(as_floats(y), size_t(rows) * c, h.value_dtype());
            }
        });
        if (one_pass) return;
    }
    if (act != Activation::none) bias_activation(d, s, act, rows, c, nullptr, y, y);
}

void bn_backward_sums(Device& d, Stream s, int rows, int c, const void* dy, const void* x, const float* mean,
                      const float* invstd, float* out) {
    if (d.runs_cuda_kernels())
        return launch_cuda(d, s, batchnorm_cuda.backward_sums, "bn_backward_sums", rows, c, dy, x, mean, invstd, out);
    run_on_host(d, s, "bn_backward_sums", [=](const Device&) {
        cpu::bn_backward_sums(rows, c, as_floats(dy), as_floats(x), mean, invstd, out, cpu::thread_scratch());
    });
}

void bn_backward_dx(Device& d, Stream s, int rows, int c, const void* dy, const void* x, const float* mean,
                    const float* invstd, const float* gamma, const float* sums, double count, void* dx) {
    if (d.runs_cuda_kernels())
        return launch_cuda(d, s, batchnorm_cuda.backward_dx, "bn_backward_dx", rows, c, dy, x, mean, invstd, gamma,
                           sums, count, dx);
    run_on_host(d, s, "bn_backward_dx", [=](const Device& h) {
        cpu::bn_backward_dx(rows, c, as_floats(dy), as_floats(x), mean, invstd, gamma, sums, float(1.0 / count),
                            as_floats(dx));
        round_stored(as_floats(dx), size_t(rows) * c, h.value_dtype());
    });
}

void ema_update(Device& d, Stream s, size_t n, float momentum, const float* batch, float* running) {
    if (d.runs_cuda_kernels())
        return launch_cuda(d, s, batchnorm_cuda.ema_update, "ema_update", n, momentum, batch, running);
    run_on_host(d, s, "ema_update", [=](const Device&) {
        for (size_t i = 0; i < n; ++i) running[i] = ema(running[i], batch[i], momentum);
    });
}

}  // namespace mirrored
