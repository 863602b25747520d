#include "mirrored/loss.h"

namespace mirrored {

extern const LossKind kSoftmaxCrossEntropyKind, kMseKind, kBinaryCrossEntropyKind;

const Registry<LossKind>& loss_kinds() {
    static const Registry<LossKind> kinds("loss", {&kSoftmaxCrossEntropyKind, &kMseKind, &kBinaryCrossEntropyKind});
    return kinds;
}

const LossKind& loss_kind(const LossConfig& c) { return loss_kinds().get(c.type, "model.loss"); }

std::unique_ptr<Loss> make_loss(const LossConfig& c) {
    const LossKind& kind = loss_kind(c);
    if (c.options) return kind.create(*c.options);
    FieldsReader none("model.loss", {});
    return kind.create(*kind.read(none, "model.loss"));
}

size_t label_bytes(const LossConfig& c, int outputs, int positions) {
    return size_t(positions) *
           (loss_kind(c).labels == LabelKind::classes ? sizeof(int32_t) : sizeof(float) * size_t(outputs));
}

}  // namespace mirrored
