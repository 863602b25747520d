// global_avgpool: the mean over each channel's whole image, [h, w, c] -> [c]
// (torch.nn.AdaptiveAvgPool2d(1) followed by flatten).
#include "mirrored/layers/pooling.h"

namespace mirrored {

namespace {

class GlobalAvgPool final : public Pool {
public:
    explicit GlobalAvgPool(const LayerSpec& s) : Pool(s, PoolKind::average) {}
    void declare(Builder& b) override { declare_window(b, in_.h, in_.w, 1, 0, true); }
    std::string detail() const override { return ""; }
};

}  // namespace

extern const LayerKind kGlobalAvgPoolKind{"global_avgpool", read_no_options, create_layer<GlobalAvgPool>};

}  // namespace mirrored
