// npy: NumPy arrays, a features file and a labels file per split (np.save), either of them
// gzip-compressed: features (N, F), (N, H, W) or (N, H, W, C); labels (N,) of class indexes, or
// float targets (N,) or (N, K) when the loss reads targets.
#include <tuple>

#include "data/datasets.h"

namespace mirrored {

namespace {

struct NpyOptions final : OptionsOf<NpyOptions> {
    std::string train_features, train_labels, test_features, test_labels;
    Fields fields() const override {
        return {{"train.features", train_features},
                {"train.labels", train_labels},
                {"test.features", test_features},
                {"test.labels", test_labels}};
    }
    bool operator==(const NpyOptions&) const = default;
};

OptionsPtr read(SpecReader& r, const std::string& p, bool) {
    auto o = std::make_shared<NpyOptions>();
    for (auto [split, features, labels] : {std::tuple{".train", &o->train_features, &o->train_labels},
                                           std::tuple{".test", &o->test_features, &o->test_labels}}) {
        r.expect_map(p + split);
        for (auto [key, file] : {std::pair{".features", features}, std::pair{".labels", labels}}) {
            *file = r.text(p + split + key, "");
            if (file->empty()) r.fail(p + split + key, "required for dataset npy: a .npy file's path");
        }
    }
    return o;
}

Datasets load(const Options& options, const DataSource& src) {
    const auto& o = options_as<NpyOptions>(options);
    const bool targets = src.config.targets;
    const std::string tx = src.path(o.train_features), ty = src.path(o.train_labels);
    const std::string vx = src.path(o.test_features), vy = src.path(o.test_labels);
    Datasets out;
    out.train = read_npy(tx, ty, targets);
    out.test = read_npy(vx, vy, targets);
    if (out.test.shape != out.train.shape)
        throw DataError(vx + ": the samples' shape differs from the training features' (" + tx + ")");
    if (out.test.target_size != out.train.target_size)
        throw DataError(vy + ": " + std::to_string(out.test.target_size) +
                        " target(s) per sample, the training labels have " + std::to_string(out.train.target_size));
    return out;
}

}  // namespace

extern const DataFormat kNpyFormat{"npy", ".", "", read, load};

}  // namespace mirrored
