// adamw: Adam with decoupled weight decay (torch.optim.AdamW), bias-corrected moments; state:
// exp_avg and exp_avg_sq.
#include "kernels/op_math.h"
#include "kernels/ops/optimizer.h"
#include "mirrored/optimizer.h"
#include "mirrored/util.h"

namespace mirrored {

namespace {

struct AdamWOptions final : OptionsOf<AdamWOptions> {
    double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
    Fields fields() const override {
        return {{"betas", "[" + decimal_text(beta1) + ", " + decimal_text(beta2) + "]"}, {"eps", decimal_text(eps)}};
    }
    bool operator==(const AdamWOptions&) const = default;
};

class AdamW final : public Optimizer {
public:
    AdamW(Device& dev, const OptimizerConfig& cfg, size_t n, const OwnedRanges& owned)
        : Optimizer(dev, cfg, n, owned), o_(options_as<AdamWOptions>(cfg_.options)) {
        m_ = zeroed_state();
        v_ = zeroed_state();
    }

    StepValues step_values(int64_t step, float lr) const override {
        StepValues v = Optimizer::step_values(step, lr);
        const AdamWCorrections c = adamw_corrections(args(step, lr, 0.0f, nullptr, nullptr, false, nullptr));
        v.adamw_bc1 = c.bc1;
        v.adamw_bc2_sqrt = c.bc2_sqrt;
        return v;
    }
    std::vector<std::pair<std::string, DeviceBuffer<float>*>> state() override {
        return {{"exp_avg", &m_}, {"exp_avg_sq", &v_}};
    }

protected:
    void update_range(Device& on, Stream s, float* params, const float* grads, size_t begin, size_t end, int64_t step,
                      float lr, float weight_decay, const float* grad_stats, const float* loss_scale,
                      bool skip_nonfinite, const StepValues* values) override {
        adamw_update(on, s, end - begin, params + begin, grads, state_at(m_, begin), state_at(v_, begin),
                     args(step, lr, weight_decay, grad_stats, loss_scale, skip_nonfinite, values));
    }
    void update_summed_range(Device& on, Stream s, float* params, float* const* grads, int count, int into,
                             size_t begin, size_t end, int64_t step, float lr, float weight_decay,
                             const StepValues* values) override {
        summed_adamw_update(on, s, grads, count, into, begin, end - begin, params + begin, state_at(m_, begin),
                            state_at(v_, begin), args(step, lr, weight_decay, nullptr, nullptr, false, values));
    }

private:
    AdamWArgs args(int64_t step, float lr, float weight_decay, const float* grad_stats, const float* loss_scale,
                   bool skip_nonfinite, const StepValues* values) const {
        AdamWArgs a;
        a.lr = lr;
        a.beta1 = float(o_.beta1);
        a.beta2 = float(o_.beta2);
        a.eps = float(o_.eps);
        a.weight_decay = weight_decay;
        a.step = step + 1;
        return with_step_inputs(a, grad_stats, loss_scale, skip_nonfinite, values);
    }

    const AdamWOptions& o_;
    DeviceBuffer<float> m_, v_;
};

OptionsPtr read(SpecReader& r, const std::string& p) {
    auto o = std::make_shared<AdamWOptions>();
    const std::vector<double> betas = r.number_list(p + ".betas");
    if (!betas.empty()) {
        if (betas.size() != 2 || betas[0] < 0 || betas[0] >= 1 || betas[1] < 0 || betas[1] >= 1)
            r.fail(p + ".betas", "expected two numbers in [0, 1), e.g. [0.9, 0.999]");
        o->beta1 = betas[0];
        o->beta2 = betas[1];
    }
    o->eps = r.number_above(p + ".eps", 1e-8, 0.0, 1.0);
    return o;
}

}  // namespace

extern const OptimizerKind kAdamWKind{
    "adamw",
    1e-3,
    read,
    [](const Options&) { return 2; },
    [](const Options&) { return std::string("adamw"); },
    [](Device& dev, const OptimizerConfig& cfg, size_t n, const OwnedRanges& owned) -> std::unique_ptr<Optimizer> {
        return std::make_unique<AdamW>(dev, cfg, n, owned);
    }};

}  // namespace mirrored
