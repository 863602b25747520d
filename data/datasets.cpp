#include "data/datasets.h"

#include <cstdint>
#include <cstdlib>
#include <filesystem>

#include "base/io.h"
#include "base/error.h"

namespace mirrored {

std::string effective_data_root(const DataConfig& c, const std::string& base_dir) {
    if (const char* env = std::getenv("MIRRORED_DATA_DIR"); env && *env) return env;
    std::filesystem::path root(c.root);
    if (root.is_relative() && !base_dir.empty()) root = std::filesystem::path(base_dir) / root;
    return root.lexically_normal().string();
}

std::string resolve_data_path(const DataConfig& c, const std::string& base_dir, const std::string& file) {
    std::filesystem::path p(file);
    if (p.is_absolute()) return p.string();
    return (std::filesystem::path(effective_data_root(c, base_dir)) / p).lexically_normal().string();
}

namespace {

// A synthetic dataset is made in memory from the config alone: refuse sizes that overflow or do not
// fit before allocating anything.
void check_synthetic_size(const DataConfig& c) {
    uint64_t features = 1;
    for (int d : c.input_shape)
        if (d <= 0 || !checked_mul(features, uint64_t(d), features) || features > (uint64_t(1) << 26))
            throw ConfigError("data.input_shape", "more than 2^26 features per sample is implausibly large");
    uint64_t bytes = 0, test = 0, teacher = 0;
    const uint64_t avail = available_host_memory();
    if (!checked_mul(c.train_samples, features * 4 + 4, bytes) || !checked_mul(c.test_samples, features * 4 + 4, test) ||
        !checked_mul(uint64_t(c.classes), features * 4, teacher) || !checked_add(bytes, test, bytes) ||
        !checked_add(bytes, teacher, bytes) || (avail && bytes > avail))
        throw ConfigError("data.train_samples", std::to_string(c.train_samples) + " + " + std::to_string(c.test_samples) +
                                                    " samples of " + std::to_string(features) + " features need " +
                                                    (bytes ? format_bytes(bytes) : std::string("more memory than exists")) +
                                                    ", " + format_bytes(avail) + " are available");
}

// `f` resolved against the data root; a missing file is named with where the root came from.
std::string existing_data_path(const DataConfig& c, const std::string& base_dir, const std::string& f) {
    const std::string p = resolve_data_path(c, base_dir, f);
    if (!std::filesystem::exists(p)) {
        const std::string root = effective_data_root(c, base_dir);
        throw DataError(p + ": no such file (data root " + root + ", from " +
                        (std::getenv("MIRRORED_DATA_DIR") ? "MIRRORED_DATA_DIR" : "data.root") + ")" +
                        (c.dataset == "idx" && root == "/usr/share/datasets/fashion-mnist"
                             ? "; the package dataset-fashion-mnist installs these files (scripts/install_deps.sh)"
                             : ""));
    }
    return p;
}

// The training and test splits as data.dataset names them, not yet normalised.
Datasets read_splits(const DataConfig& c, const std::string& base_dir, uint64_t seed) {
    auto path = [&](const std::string& f) { return existing_data_path(c, base_dir, f); };
    auto paths = [&](const std::vector<std::string>& fs) {
        std::vector<std::string> v;
        for (const auto& f : fs) v.push_back(path(f));
        return v;
    };
    Datasets out;
    if (c.dataset == "idx") {
        // resolved in order, so the first missing file is the one named
        const std::string ti = path(c.train.images), tl = path(c.train.labels);
        const std::string vi = path(c.test.images), vl = path(c.test.labels);
        out.train = read_idx(ti, tl);
        out.test = read_idx(vi, vl);
        if (out.test.shape != out.train.shape) throw DataError(vi + ": image size differs from the training images");
    } else if (c.dataset == "cifar10") {
        out.train = read_cifar10(paths(c.train.files));
        out.test = read_cifar10(paths(c.test.files));
    } else if (c.dataset == "csv") {
        out.train = read_csv(path(c.train.file), c.csv);
        out.test = read_csv(path(c.test.file), c.csv);
        if (out.test.shape != out.train.shape)
            throw DataError(path(c.test.file) + ": " + std::to_string(out.test.shape[0]) +
                            " feature columns, the training file has " + std::to_string(out.train.shape[0]));
    } else if (c.dataset == "synthetic") {
        check_synthetic_size(c);
        SyntheticOptions o;
        o.shape = c.input_shape;
        o.classes = c.classes;
        o.seed = seed;
        o.samples = c.train_samples;
        out.train = make_synthetic(o);
        o.samples = c.test_samples;
        o.split = 1;
        out.test = make_synthetic(o);
    } else {
        throw ConfigError("data.dataset", "unknown dataset '" + c.dataset + "' (known: idx, cifar10, csv, synthetic)");
    }
    return out;
}

// A test label the training data never has is an error naming the record.
void check_test_classes(const Datasets& d) {
    if (d.test.classes <= d.train.classes) return;
    size_t i = 0;
    while (d.test.labels[i] < d.train.classes) ++i;
    throw DataError(d.test.labels_source + ": label " + std::to_string(d.test.labels[i]) + " of record " +
                    std::to_string(i) + " is not among the classes of the training labels [0, " +
                    std::to_string(d.train.classes) + ") in " + d.train.labels_source);
}

}  // namespace

Datasets load_datasets(const DataConfig& c, const std::string& base_dir, uint64_t seed) {
    Datasets out = read_splits(c, base_dir, seed);
    check_test_classes(out);
    out.test.classes = out.train.classes;
    if (c.normalize != DataConfig::Normalize::none) {
        out.normalization = c.normalize == DataConfig::Normalize::given ? c.normalization
                                                                         : compute_normalization(out.train);
        normalize(out.train, out.normalization);
        normalize(out.test, out.normalization);
    }
    return out;
}

}  // namespace mirrored
