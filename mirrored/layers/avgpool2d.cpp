// avgpool2d: the mean of each window, padding counted as zeros (torch.nn.AvgPool2d's default).
#include "mirrored/layers/pooling.h"

namespace mirrored {

namespace {

class AvgPool2d final : public WindowPool {
public:
    explicit AvgPool2d(const LayerSpec& s) : WindowPool(s, PoolKind::average) {}
};

}  // namespace

extern const LayerKind kAvgPool2dKind{"avgpool2d", read_pool, create_layer<AvgPool2d>};

}  // namespace mirrored
