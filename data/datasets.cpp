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

std::string DataSource::path(const std::string& file) const {
    const std::string p = resolve_data_path(config, base_dir, file);
    std::error_code ec;  // a loop of links, a folder that cannot be searched: said, never thrown raw
    const bool there = std::filesystem::exists(p, ec);
    if (ec) throw DataError(p + ": cannot be read: " + ec.message());
    if (!there) {
        const std::string root = effective_data_root(config, base_dir);
        const DataFormat& format = data_formats().get(config.dataset, "data.dataset");
        throw DataError(
            p + ": no such file (data root " + root + ", from " +
            (std::getenv("MIRRORED_DATA_DIR") ? "MIRRORED_DATA_DIR" : "data.root") + ")" +
            (root == format.default_root && *format.missing_hint ? std::string("; ") + format.missing_hint : ""));
    }
    return p;
}

std::vector<std::pair<std::string, std::string>> data_inputs(const DataConfig& c, const std::string& base_dir) {
    const DataFormat& format = data_formats().get(c.dataset, "data.dataset");
    std::vector<std::pair<std::string, std::string>> out;
    for (const std::string& file : format.inputs(*data_format_options(c)))
        if (!file.empty()) out.push_back({"data of data." + c.dataset, resolve_data_path(c, base_dir, file)});
    return out;
}

extern const DataFormat kIdxFormat, kCifar10Format, kCsvFormat, kNpyFormat, kSyntheticFormat, kTokensFormat,
    kImageFolderFormat;

const Registry<DataFormat>& data_formats() {
    static const Registry<DataFormat> formats("dataset", {&kIdxFormat, &kCifar10Format, &kCsvFormat, &kNpyFormat,
                                                          &kSyntheticFormat, &kTokensFormat, &kImageFolderFormat});
    return formats;
}

MapFeatures read_map_features(SpecReader& r, const std::string& key) {
    const std::string m = r.choice(key, "auto", {"auto", "always", "never"});
    return m == "always" ? MapFeatures::always : m == "never" ? MapFeatures::never : MapFeatures::auto_size;
}

const char* map_features_name(MapFeatures mode) {
    return mode == MapFeatures::always ? "always" : mode == MapFeatures::never ? "never" : "auto";
}

OptionsPtr data_format_options(const DataConfig& c) {
    if (c.format) return c.format;
    FieldsReader none("data", {});
    return data_formats().get(c.dataset, "data.dataset").read(none, "data", c.targets);
}

DataConfig make_data_config(const std::string& format, const Fields& keys, bool targets) {
    const DataFormat& f = data_formats().get(format);
    FieldsReader r("data", keys);
    DataConfig c;
    c.dataset = format;
    c.root = f.default_root;
    c.targets = targets;
    c.format = f.read(r, "data", targets);
    r.finish();
    return c;
}

namespace {

// A test label the training data never has is an error naming the record; targets must be as wide.
void check_test_labels(const Datasets& d) {
    if (d.train.has_targets() || d.test.has_targets()) {
        if (d.test.target_size != d.train.target_size)
            throw DataError(d.test.labels_source + ": " + std::to_string(d.test.target_size) + " target column(s), " +
                            d.train.labels_source + " has " + std::to_string(d.train.target_size));
        return;
    }
    if (d.test.classes <= d.train.classes) return;
    if (d.test.source)  // read on demand: its labels were checked against its own classes when opened
        throw DataError(d.test.labels_source + ": " + std::to_string(d.test.classes) + " classes, the training data " +
                        d.train.labels_source + " has " + std::to_string(d.train.classes));
    size_t i = 0;
    while (d.test.labels[i] < d.train.classes) ++i;
    throw DataError(d.test.labels_source + ": label " + std::to_string(d.test.labels[i]) + " of record " +
                    std::to_string(i) + " is not among the classes of the training labels [0, " +
                    std::to_string(d.train.classes) + ") in " + d.train.labels_source);
}

}  // namespace

Datasets load_datasets(const DataConfig& c, const std::string& base_dir, uint64_t seed) {
    Datasets out =
        data_formats().get(c.dataset, "data.dataset").load(*data_format_options(c), DataSource{c, base_dir, seed});
    check_test_labels(out);
    out.test.classes = out.train.classes;
    if (c.normalize == DataConfig::Normalize::given && out.train.tokens)
        throw ConfigError("data.normalize: token ids are indexes, not values to normalise: remove the mean and std");
    if (c.normalize != DataConfig::Normalize::none && !out.train.tokens) {  // ids are not values
        out.normalization =
            c.normalize == DataConfig::Normalize::given ? c.normalization : compute_normalization(out.train);
        normalize(out.train, out.normalization);
        normalize(out.test, out.normalization);
    }
    return out;
}

}  // namespace mirrored
