// batchnorm: per-channel normalisation by the batch's statistics in training and the running
// statistics in evaluation, then gamma * x + beta and an optional activation (torch.nn.BatchNorm2d
// for images, BatchNorm1d for vectors; the same parameter and buffer names).
//
// Statistics are per replica by default, as MirroredStrategy computes them; sync: true sums them
// over every replica (two small all-reduces in forward, one in backward), so that N replicas
// equal one replica on the global batch. The running statistics are mirrored state: each replica
// adds its batch statistics, weighted 1 / (replicas x micro-batches), to the state region of the
// gradient buffer; the gradient all-reduce sums them and every replica applies the same
// exponential average after the step (mirrored/training_step.cpp).
#include "kernels/ops/batchnorm.h"
#include "kernels/ops/flat.h"
#include "base/error.h"
#include "mirrored/layers/activations.h"
#include "mirrored/layers/layer.h"
#include "mirrored/util.h"
#include "kernels/ops/activation.h"

namespace mirrored {

namespace {

struct BatchNormOptions final : OptionsOf<BatchNormOptions> {
    float momentum = 0.1f, epsilon = 1e-5f;
    bool sync = false;  // statistics over the global batch
    Activation activation = Activation::none;
    Fields fields() const override {
        return {{"momentum", decimal_text(momentum)},
                {"epsilon", decimal_text(epsilon)},
                {"sync", sync ? "true" : "false"},
                {"activation", activation_name(activation)}};
    }
    bool operator==(const BatchNormOptions&) const = default;
};

class BatchNorm final : public Layer {
public:
    explicit BatchNorm(const LayerSpec& s) : Layer(s), o_(spec_.get<BatchNormOptions>()) {}

    void declare(Builder& b) override {
        const int c = in_.c;
        InitArgs ones;
        ones.kind = InitKind::ones;
        gamma_ = b.param(name_ + ".weight", {c}, ones);
        beta_ = b.param(name_ + ".bias", {c}, InitArgs{});
        if (b.frozen(gamma_) || b.frozen(beta_)) fail("model.freeze: batchnorm's tensors cannot be frozen");
        run_mean_ = b.state(name_ + ".running_mean", {c}, 0.0f, o_.momentum);
        run_var_ = b.state(name_ + ".running_var", {c}, 1.0f, o_.momentum);
        slot_ = b.new_slot();
        out_buf_ = b.act_buffer(slot_, in_.size());
        // GELU's derivative needs the pre-activation; ReLU's reads the output (as dense layers do)
        if (keeps_preactivation(o_.activation)) z_buf_ = b.act_buffer(slot_, in_.size());
        mean_ = b.f32_buffer(slot_, 0, size_t(c));
        invstd_ = b.f32_buffer(slot_, 0, size_t(c));
        sum_ = b.f32_buffer(slot_, 0, size_t(c));
        sums_ = b.f32_buffer(slot_, 0, 2 * size_t(c));
        if (o_.sync) b.stats(2 * size_t(c));
    }
    // One value per channel has variance 0: the layer outputs its bias whatever the input
    // (PyTorch refuses it too). Counted per replica, or over the job when synchronised.
    void check_batch(int rows, int global_rows) const override {
        const int64_t per_image = int64_t(in_.h) * in_.w;
        const int64_t values = (o_.sync ? int64_t(global_rows) : int64_t(rows)) * per_image;
        if (rows == 0 || values >= 2) return;
        // values < 2 leaves one sample of one pixel: rows (or global_rows) is 1
        fail("batch statistics over 1 value per channel: " + std::string(o_.sync ? "the whole job" : "a replica") +
             " trains on 1 sample at a time, so the variance is 0 and the layer learns nothing: raise "
             "train.global_batch_size or use fewer replicas or accumulation steps" +
             (o_.sync ? "" : ", or set sync: true to count the statistics over every replica"));
    }
    void place(const std::vector<TensorRef>& refs) override {
        gamma_off_ = refs[size_t(gamma_)].offset;
        beta_off_ = refs[size_t(beta_)].offset;
        run_mean_off_ = refs[size_t(run_mean_)].offset;
        run_var_off_ = refs[size_t(run_var_)].offset;
    }

    const void* forward(Pass& p, const void* x) const override {
        const int c = in_.c, rows = p.rows * in_.h * in_.w;
        Device& d = *p.dev;
        p.acts->input(slot_) = x;
        float* mean = p.acts->f32(slot_, mean_);
        float* invstd = p.acts->f32(slot_, invstd_);
        if (p.training) batch_statistics(p, x, rows, mean, invstd);
        else rsqrt_eps(d, p.stream, c, p.params + run_var_off_, o_.epsilon, invstd);
        const float* m = p.training ? mean : p.params + run_mean_off_;
        void* y = p.acts->act(slot_, out_buf_);
        const float *gamma = p.params + gamma_off_, *beta = p.params + beta_off_;
        if (z_buf_ < 0) {
            channel_affine(d, p.stream, o_.activation, rows, c, x, m, invstd, gamma, beta, y);
            return y;
        }
        void* z = p.acts->act(slot_, z_buf_);
        channel_affine(d, p.stream, Activation::none, rows, c, x, m, invstd, gamma, beta, z);
        bias_activation(d, p.stream, o_.activation, rows, c, nullptr, z, y);
        return y;
    }

    void backward(Pass& p, void* dy, void* dx) const override {
        const int c = in_.c, rows = p.rows * in_.h * in_.w;
        Device& d = *p.dev;
        if (o_.activation != Activation::none)
            activation_backward(d, p.stream, o_.activation, size_t(rows) * c,
                                p.acts->act(slot_, z_buf_ >= 0 ? z_buf_ : out_buf_), dy, dy);
        const float* mean = p.acts->f32(slot_, mean_);
        const float* invstd = p.acts->f32(slot_, invstd_);
        float* sums = p.acts->f32(slot_, sums_);
        bn_backward_sums(d, p.stream, rows, c, dy, p.acts->input(slot_), mean, invstd, sums);
        // this replica's dgamma = sum dy * xhat, dbeta = sum dy: the gradient all-reduce adds the rest
        float* dgamma = p.grad(gamma_off_);
        float* dbeta = p.grad(beta_off_);
        if (p.accumulate) {
            axpy_floats(d, p.stream, size_t(c), 1.0f, sums + c, dgamma);
            axpy_floats(d, p.stream, size_t(c), 1.0f, sums, dbeta);
        } else {
            d.copy_on_device(p.stream, dgamma, sums + c, size_t(c) * sizeof(float));
            d.copy_on_device(p.stream, dbeta, sums, size_t(c) * sizeof(float));
        }
        if (!dx) return;
        double count = double(rows);
        if (o_.sync) {  // the input gradient needs the sums over the global batch
            d.copy_on_device(p.stream, p.sync->buffer(), sums, 2 * size_t(c) * sizeof(float));
            p.sync->all_reduce(2 * size_t(c));
            sums = p.sync->buffer();
            count = double(p.global_rows) * in_.h * in_.w;
        }
        bn_backward_dx(d, p.stream, rows, c, dy, p.acts->input(slot_), mean, invstd, p.params + gamma_off_, sums, count,
                       dx);
    }

    bool has_params() const override { return true; }
    std::string detail() const override { return std::string(o_.sync ? "sync " : "") + activation_name(o_.activation); }

private:
    // Two passes (mean, then squares about it): exact enough in f32 whatever the data's offset.
    void batch_statistics(Pass& p, const void* x, int rows, float* mean, float* invstd) const {
        const int c = in_.c;
        Device& d = *p.dev;
        float* sum = p.acts->f32(slot_, sum_);
        float* sq = p.acts->f32(slot_, sums_);
        BnStats a{c, double(rows), o_.epsilon, p.stats_weight};
        if (o_.sync) {
            a.count = double(p.global_rows) * in_.h * in_.w;
            float* buf = p.sync->buffer();
            channel_sums(d, p.stream, rows, c, x, nullptr, false, buf);
            p.sync->all_reduce(size_t(c));
            d.copy_on_device(p.stream, sum, buf, size_t(c) * sizeof(float));
            bn_finalize(d, p.stream, a, sum, nullptr, mean, nullptr, nullptr, nullptr);
            channel_sums(d, p.stream, rows, c, x, mean, true, buf);
            p.sync->all_reduce(size_t(c));
            sq = buf;
        } else {
            if (rows == 0) return;  // an empty shard: no statistics, nothing added to the running ones
            channel_sums(d, p.stream, rows, c, x, nullptr, false, sum);
            bn_finalize(d, p.stream, a, sum, nullptr, mean, nullptr, nullptr, nullptr);
            channel_sums(d, p.stream, rows, c, x, mean, true, sq);
        }
        // recomputed (train.recompute: blocks): counted into the running statistics once
        bn_finalize(d, p.stream, a, sum, sq, mean, invstd, p.recomputing ? nullptr : p.grad(run_mean_off_),
                    p.recomputing ? nullptr : p.grad(run_var_off_));
    }

    const BatchNormOptions& o_;
    int gamma_ = -1, beta_ = -1, run_mean_ = -1, run_var_ = -1;
    size_t gamma_off_ = 0, beta_off_ = 0, run_mean_off_ = 0, run_var_off_ = 0;
    int slot_ = -1, out_buf_ = -1, z_buf_ = -1, mean_ = -1, invstd_ = -1, sum_ = -1, sums_ = -1;
};

OptionsPtr read(SpecReader& r, const std::string& p) {
    auto o = std::make_shared<BatchNormOptions>();
    o->momentum = float(r.number(p + ".momentum", 0.1, 0.0, 1.0));
    o->epsilon = float(r.number(p + ".epsilon", 1e-5, 1e-12, 1.0));
    o->sync = r.boolean(p + ".sync", false);
    o->activation = read_activation(r, p + ".activation");
    return o;
}

}  // namespace

extern const LayerKind kBatchNormKind{"batchnorm", read, create_layer<BatchNorm>};

}  // namespace mirrored
