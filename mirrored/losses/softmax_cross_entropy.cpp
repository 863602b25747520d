// softmax_cross_entropy: -log softmax(z)[label] per sample, averaged (torch.nn.CrossEntropyLoss);
// accuracy is the argmax's.
#include "kernels/ops/losses.h"
#include "mirrored/loss.h"

namespace mirrored {

namespace {

class SoftmaxCrossEntropy final : public Loss {
public:
    void apply(Device& d, Stream s, int rows, int outputs, const void* logits, const void* labels, float grad_scale,
               const float* loss_scale, void* dlogits, double* metrics) const override {
        softmax_xent(d, s, rows, outputs, logits, static_cast<const int32_t*>(labels), grad_scale, loss_scale, dlogits,
                     metrics);
    }
};

}  // namespace

extern const LossKind kSoftmaxCrossEntropyKind{
    "softmax_cross_entropy",
    LabelKind::classes,
    true,
    false,
    read_no_options,
    [](const Options&) -> std::unique_ptr<Loss> { return std::make_unique<SoftmaxCrossEntropy>(); }};

}  // namespace mirrored
