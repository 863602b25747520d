// idx: MNIST / Fashion-MNIST files, an images file and a labels file per split, either of them
// gzip-compressed. The default is Fashion-MNIST where the package dataset-fashion-mnist puts it.
// `mmap`: uncompressed images memory-mapped and read sample by sample (data/formats/npy.cpp says
// when), bit-identical to reading them into memory.
#include "base/error.h"
#include "data/datasets.h"

namespace mirrored {

namespace {

struct IdxOptions final : OptionsOf<IdxOptions> {
    std::string train_images = "train-images-idx3-ubyte.gz", train_labels = "train-labels-idx1-ubyte.gz";
    std::string test_images = "t10k-images-idx3-ubyte.gz", test_labels = "t10k-labels-idx1-ubyte.gz";
    MapFeatures mmap = MapFeatures::auto_size;
    Fields fields() const override {
        return {{"train.images", train_images},
                {"train.labels", train_labels},
                {"test.images", test_images},
                {"test.labels", test_labels},
                {"mmap", map_features_name(mmap)}};
    }
    bool operator==(const IdxOptions&) const = default;
};

OptionsPtr read(SpecReader& r, const std::string& p, bool) {
    auto o = std::make_shared<IdxOptions>();
    r.expect_map(p + ".train");
    o->train_images = r.nonempty_text(p + ".train.images", o->train_images);
    o->train_labels = r.nonempty_text(p + ".train.labels", o->train_labels);
    r.expect_map(p + ".test");
    o->test_images = r.nonempty_text(p + ".test.images", o->test_images);
    o->test_labels = r.nonempty_text(p + ".test.labels", o->test_labels);
    o->mmap = read_map_features(r, p + ".mmap");
    return o;
}

Datasets load(const Options& options, const DataSource& src) {
    const auto& o = options_as<IdxOptions>(options);
    // resolved in order, so the first missing file is the one named
    const std::string ti = src.path(o.train_images), tl = src.path(o.train_labels);
    const std::string vi = src.path(o.test_images), vl = src.path(o.test_labels);
    Datasets out;
    out.train = map_features(ti, o.mmap) ? read_idx_mapped(ti, tl) : read_idx(ti, tl);
    out.test = map_features(vi, o.mmap) ? read_idx_mapped(vi, vl) : read_idx(vi, vl);
    if (out.test.shape != out.train.shape) throw DataError(vi + ": image size differs from the training images");
    return out;
}

std::vector<std::string> inputs(const Options& opts) {
    const auto& o = options_as<IdxOptions>(opts);
    return {o.train_images, o.train_labels, o.test_images, o.test_labels};
}

}  // namespace

extern const DataFormat kIdxFormat{"idx",
                                   "/usr/share/datasets/fashion-mnist",
                                   "the package dataset-fashion-mnist installs these files (scripts/install_deps.sh)",
                                   read,
                                   load,
                                   inputs};

}  // namespace mirrored
