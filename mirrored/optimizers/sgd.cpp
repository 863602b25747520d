// sgd: stochastic gradient descent with optional momentum and Nesterov momentum, weight decay
// added to the gradient (torch.optim.SGD); state: momentum_buffer when momentum > 0.
#include "kernels/ops/optimizer.h"
#include "mirrored/optimizer.h"
#include "mirrored/util.h"

namespace mirrored {

namespace {

struct SgdOptions final : OptionsOf<SgdOptions> {
    double momentum = 0.9;
    bool nesterov = false;
    Fields fields() const override {
        return {{"momentum", decimal_text(momentum)}, {"nesterov", nesterov ? "true" : "false"}};
    }
    bool operator==(const SgdOptions&) const = default;
};

class Sgd final : public Optimizer {
public:
    Sgd(Device& dev, const OptimizerConfig& cfg, size_t n, const OwnedRanges& owned)
        : Optimizer(dev, cfg, n, owned), o_(options_as<SgdOptions>(cfg_.options)) {
        if (o_.momentum != 0.0) m_ = zeroed_state();
    }

    std::vector<std::pair<std::string, DeviceBuffer<float>*>> state() override {
        if (o_.momentum == 0.0) return {};
        return {{"momentum_buffer", &m_}};
    }

protected:
    void update_range(Device& on, Stream s, float* params, const float* grads, size_t begin, size_t end, int64_t,
                      float lr, float weight_decay, const float* grad_stats, const float* loss_scale,
                      bool skip_nonfinite, const StepValues* values) override {
        sgd_update(on, s, end - begin, params + begin, grads, momentum(begin),
                   args(lr, weight_decay, grad_stats, loss_scale, skip_nonfinite, values));
    }
    void update_summed_range(Device& on, Stream s, float* params, float* const* grads, int count, int into,
                             size_t begin, size_t end, int64_t, float lr, float weight_decay,
                             const StepValues* values) override {
        summed_sgd_update(on, s, grads, count, into, begin, end - begin, params + begin, momentum(begin),
                          args(lr, weight_decay, nullptr, nullptr, false, values));
    }

private:
    float* momentum(size_t begin) { return o_.momentum != 0.0 ? state_at(m_, begin) : nullptr; }
    SgdArgs args(float lr, float weight_decay, const float* grad_stats, const float* loss_scale, bool skip_nonfinite,
                 const StepValues* values) const {
        SgdArgs a;
        a.lr = lr;
        a.momentum = float(o_.momentum);
        a.nesterov = o_.nesterov;
        a.weight_decay = weight_decay;
        return with_step_inputs(a, grad_stats, loss_scale, skip_nonfinite, values);
    }

    const SgdOptions& o_;
    DeviceBuffer<float> m_;
};

OptionsPtr read(SpecReader& r, const std::string& p) {
    auto o = std::make_shared<SgdOptions>();
    o->momentum = r.number(p + ".momentum", 0.9, 0.0, 0.9999);
    o->nesterov = r.boolean(p + ".nesterov", false);
    if (o->nesterov && o->momentum == 0) r.fail(p + ".nesterov", "needs optimizer.momentum > 0");
    return o;
}

}  // namespace

extern const OptimizerKind kSgdKind{
    "sgd",
    0.05,
    read,
    [](const Options& o) { return options_as<SgdOptions>(o).momentum != 0.0 ? 1 : 0; },
    [](const Options& o) { return std::string(options_as<SgdOptions>(o).momentum != 0.0 ? "sgd+momentum" : "sgd"); },
    [](Device& dev, const OptimizerConfig& cfg, size_t n, const OwnedRanges& owned) -> std::unique_ptr<Optimizer> {
        return std::make_unique<Sgd>(dev, cfg, n, owned);
    }};

}  // namespace mirrored
