// idx: MNIST / Fashion-MNIST files, an images file and a labels file per split, either of them
// gzip-compressed. The default is Fashion-MNIST where the package dataset-fashion-mnist puts it.
// `mmap`: uncompressed images memory-mapped and read sample by sample (data/formats/npy.cpp says
// when), bit-identical to reading them into memory.
#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include "base/error.h"
#include "data/datasets.h"
#include "data/formats/reading.h"

namespace mirrored {

namespace {

uint32_t be32(const unsigned char* p) {
    return (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | uint32_t(p[3]);
}

// Reads an IDX header from `in`: checks magic, element type and rank, and returns the dimensions
// and the payload size they promise (overflow-checked, and within the memory available once the
// bytes become floats).
// in_memory: the payload must fit in the memory available as floats (not so for a mapped file).
std::vector<uint32_t> read_idx_header(InputFile& in, int want_dims, const char* what, uint64_t& payload,
                                      bool in_memory = true) {
    const std::string& path = in.path();
    std::vector<unsigned char> b;
    b.resize(4);
    const size_t got = in.read(b.data(), 4);
    if (got < 4) throw DataError(path + ": " + std::to_string(got) + " bytes is too short for an IDX header");
    if (b[0] != 0 || b[1] != 0) {
        char m[64];
        std::snprintf(m, sizeof m, "0x%02x%02x%02x%02x", b[0], b[1], b[2], b[3]);
        throw DataError(path + ": not an IDX file (magic " + m + ", expected 0x0000 then type and rank)");
    }
    if (b[2] != 0x08) {
        char m[16];
        std::snprintf(m, sizeof m, "0x%02x", b[2]);
        throw DataError(path + ": unsupported IDX element type " + m + " (expected 0x08, unsigned bytes)");
    }
    if (b[3] != want_dims)
        throw DataError(path + ": IDX " + what + " file must have " + std::to_string(want_dims) +
                        " dimension(s), this one has " + std::to_string(b[3]));
    b.clear();
    try {
        in.read_exact(b, 4 * size_t(want_dims), "the IDX header");
    } catch (const InputError&) {
        throw DataError(path + ": truncated IDX header");
    }
    std::vector<uint32_t> dims;
    payload = 1;
    for (int i = 0; i < want_dims; ++i) {
        dims.push_back(be32(&b[4 * size_t(i)]));
        if (dims.back() == 0) throw DataError(path + ": IDX dimension " + std::to_string(i) + " is zero");
        if (dims.back() > uint32_t(INT32_MAX))
            throw DataError(path + ": IDX dimension " + std::to_string(i) + " is " + std::to_string(dims.back()) +
                            ", more than 2^31 - 1");
        uint64_t floats = 0;
        if (!checked_mul(payload, dims.back(), payload) || !checked_mul(payload, sizeof(float), floats) ||
            (in_memory && floats > memory_bound()))
            throw DataError(path + ": the IDX dimensions promise more data than fits in memory (" +
                            format_bytes(memory_bound()) + " available)");
    }
    return dims;
}

// Reads exactly the promised payload, then insists the file ends there.
std::vector<unsigned char> read_idx_payload(InputFile& in, uint64_t payload, uint32_t count, const char* what) {
    std::vector<unsigned char> data;
    try {
        in.read_exact(data, size_t(payload), std::to_string(count) + " " + what);
    } catch (const InputError& e) {
        if (data.size() >= payload) throw;  // complete, but something after it is wrong
        throw DataError(in.path() + ": truncated: the header promises " + std::to_string(count) + " " + what + " (" +
                        std::to_string(payload) + " bytes) but only " + std::to_string(data.size()) + " bytes follow");
    }
    if (!in.at_end())
        throw DataError(in.path() + ": unexpected bytes after the last of " + std::to_string(count) + " " + what);
    return data;
}

}  // namespace

Dataset read_idx(InputFile& images, InputFile& labels) {
    return as_data_error([&] {
        uint64_t image_bytes = 0, label_bytes = 0;
        const auto dims = read_idx_header(images, 3, "images", image_bytes);
        if (dims[0] > kMaxSamples) throw DataError(images.path() + ": more than 2^31 - 1 images");
        if (uint64_t(dims[1]) * dims[2] > kMaxFeatures)
            throw DataError(images.path() + ": images of " + std::to_string(dims[1]) + "x" + std::to_string(dims[2]) +
                            " pixels are implausibly large");
        const auto ldims = read_idx_header(labels, 1, "labels", label_bytes);
        if (ldims[0] != dims[0])
            throw DataError(labels.path() + ": " + std::to_string(ldims[0]) + " labels, but " + images.path() +
                            " has " + std::to_string(dims[0]) + " images");
        const auto px = read_idx_payload(images, image_bytes, dims[0], "images");
        const auto lb = read_idx_payload(labels, label_bytes, ldims[0], "labels");
        Dataset ds;
        ds.name = images.path();
        ds.labels_source = labels.path();
        ds.shape = {int(dims[1]), int(dims[2]), 1};
        resize_features(ds.features, px.size());
        for (size_t i = 0; i < px.size(); ++i) ds.features[i] = px[i] * (1.0f / 255.0f);
        ds.labels.assign(lb.begin(), lb.end());
        ds.classes = check_labels(ds.labels, 256, labels.path());
        return ds;
    });
}

Dataset read_idx(const std::string& images_path, const std::string& labels_path) {
    return as_data_error([&] {
        InputFile images(images_path), labels(labels_path);
        return read_idx(images, labels);
    });
}

Dataset read_idx_mapped(const std::string& images_path, const std::string& labels_path) {
    return as_data_error([&] {
        auto map = std::make_shared<const MappedFile>(images_path);
        InputFile header(images_path, map->data(), std::min<size_t>(map->size(), 16), /*inflate=*/false);
        uint64_t image_bytes = 0;
        const auto dims = read_idx_header(header, 3, "images", image_bytes, /*in_memory=*/false);
        if (dims[0] > kMaxSamples) throw DataError(images_path + ": more than 2^31 - 1 images");
        if (uint64_t(dims[1]) * dims[2] > kMaxFeatures)
            throw DataError(images_path + ": images of " + std::to_string(dims[1]) + "x" + std::to_string(dims[2]) +
                            " pixels are implausibly large");
        if (map->size() - 16 != image_bytes)
            throw DataError(images_path + ": " + std::to_string(map->size() - 16) +
                            " bytes of images, the header promises " + std::to_string(dims[0]) + " images (" +
                            std::to_string(image_bytes) + " bytes)");
        InputFile labels(labels_path);
        uint64_t label_bytes = 0;
        const auto ldims = read_idx_header(labels, 1, "labels", label_bytes);
        if (ldims[0] != dims[0])
            throw DataError(labels.path() + ": " + std::to_string(ldims[0]) + " labels, but " + images_path + " has " +
                            std::to_string(dims[0]) + " images");
        const auto lb = read_idx_payload(labels, label_bytes, ldims[0], "labels");
        Dataset ds;
        ds.name = images_path;
        ds.labels_source = labels.path();
        ds.shape = {int(dims[1]), int(dims[2]), 1};
        ds.labels.assign(lb.begin(), lb.end());
        ds.classes = check_labels(ds.labels, 256, labels.path());
        NpyArray meta;  // the images as the u8 array they are
        meta.kind = 'u';
        meta.itemsize = 1;
        meta.shape = {dims[0], dims[1], dims[2], 1};
        meta.count = image_bytes;
        attach_mapped(ds, map, meta, 16);
        return ds;
    });
}

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
