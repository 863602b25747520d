// binary_cross_entropy: an independent sigmoid per output against a target in [0, 1], averaged over
// every output of every sample (torch.nn.BCEWithLogitsLoss): multi-label classification. Its
// accuracy is the share of outputs whose prediction (logit > 0) matches the target (> 0.5).
#include "kernels/ops/losses.h"
#include "mirrored/loss.h"

namespace mirrored {

namespace {

class BinaryCrossEntropy final : public Loss {
public:
    void apply(Device& d, Stream s, int rows, int outputs, const void* logits, const void* labels, float grad_scale,
               const float* loss_scale, void* dlogits, double* metrics) const override {
        target_loss(d, s, TargetLoss::bce, rows, outputs, logits, static_cast<const float*>(labels), grad_scale,
                    loss_scale, dlogits, metrics);
    }
};

}  // namespace

extern const LossKind kBinaryCrossEntropyKind{
    "binary_cross_entropy",
    LabelKind::targets,
    true,
    true,
    read_no_options,
    [](const Options&) -> std::unique_ptr<Loss> { return std::make_unique<BinaryCrossEntropy>(); }};

}  // namespace mirrored
