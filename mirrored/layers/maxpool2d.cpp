// maxpool2d: the maximum of each window (torch.nn.MaxPool2d; padding is -inf). Backward routes
// each window's gradient to its first maximum.
#include "mirrored/layers/pooling.h"

namespace mirrored {

namespace {

class MaxPool2d final : public Pool {
public:
    explicit MaxPool2d(const LayerSpec& s) : Pool(s, PoolKind::max) {}
    void declare(Builder& b) override {
        const int pad = spec_.same ? (spec_.kernel - 1) / 2 : spec_.padding;
        declare_window(b, spec_.kernel, spec_.kernel, spec_.stride, pad, false);
    }
};

}  // namespace

void read_pool(SpecReader& r, const std::string& p, LayerSpec& s) {
    s.kernel = int(r.integer(p + ".kernel_size", 2, 1, 64));
    s.stride = int(r.integer(p + ".stride", s.kernel, 1, 64));
    read_padding(r, p + ".padding", s);
}

std::vector<std::pair<std::string, std::string>> pool_fields(const LayerSpec& s) {
    return {{"kernel_size", std::to_string(s.kernel)}, {"stride", std::to_string(s.stride)}, {"padding", padding_text(s)}};
}

extern const LayerKind kMaxPool2dKind{"maxpool2d", read_pool, pool_fields, [](const LayerSpec& s) -> std::unique_ptr<Layer> {
                                          return std::make_unique<MaxPool2d>(s);
                                      }};

}  // namespace mirrored
