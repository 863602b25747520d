// mse: the mean squared error over every output of every sample (torch.nn.MSELoss), for
// regression against float targets; no accuracy.
#include "kernels/ops/losses.h"
#include "mirrored/loss.h"

namespace mirrored {

namespace {

class MeanSquaredError final : public Loss {
public:
    void apply(Device& d, Stream s, int rows, int outputs, const void* logits, const void* labels, float grad_scale,
               const float* loss_scale, void* dlogits, double* metrics) const override {
        target_loss(d, s, TargetLoss::mse, rows, outputs, logits, static_cast<const float*>(labels), grad_scale,
                    loss_scale, dlogits, metrics);
    }
};

}  // namespace

extern const LossKind kMseKind{
    "mse",           LabelKind::targets,
    false,           false,
    read_no_options, [](const Options&) -> std::unique_ptr<Loss> { return std::make_unique<MeanSquaredError>(); }};

}  // namespace mirrored
