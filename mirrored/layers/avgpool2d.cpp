// avgpool2d: the mean of each window, padding counted as zeros (torch.nn.AvgPool2d's default).
#include "mirrored/layers/pooling.h"

namespace mirrored {

namespace {

class AvgPool2d final : public Pool {
public:
    explicit AvgPool2d(const LayerSpec& s) : Pool(s, PoolKind::average) {}
    void declare(Builder& b) override {
        const int pad = spec_.same ? (spec_.kernel - 1) / 2 : spec_.padding;
        declare_window(b, spec_.kernel, spec_.kernel, spec_.stride, pad, false);
    }
};

}  // namespace

extern const LayerKind kAvgPool2dKind{"avgpool2d", read_pool, pool_fields, [](const LayerSpec& s) -> std::unique_ptr<Layer> {
                                          return std::make_unique<AvgPool2d>(s);
                                      }};

}  // namespace mirrored
