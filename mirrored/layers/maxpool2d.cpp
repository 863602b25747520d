// maxpool2d: the maximum of each window (torch.nn.MaxPool2d; padding is -inf). Backward routes
// each window's gradient to its first maximum.
#include "mirrored/layers/pooling.h"

namespace mirrored {

namespace {

class MaxPool2d final : public WindowPool {
public:
    explicit MaxPool2d(const LayerSpec& s) : WindowPool(s, PoolKind::max) {}
};

}  // namespace

OptionsPtr read_pool(SpecReader& r, const std::string& p) {
    auto o = std::make_shared<PoolOptions>();
    o->window.kernel = int(r.integer(p + ".kernel_size", 2, 1, 64));
    o->window.stride = int(r.integer(p + ".stride", o->window.kernel, 1, 64));
    read_padding(r, p + ".padding", o->window);
    return o;
}

extern const LayerKind kMaxPool2dKind{"maxpool2d", read_pool, create_layer<MaxPool2d>};

}  // namespace mirrored
