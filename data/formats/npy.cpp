// npy: NumPy arrays, a features file and a labels file per split (np.save), either of them
// gzip-compressed, or arrays of an .npz archive (np.savez, np.savez_compressed) named as
// "<file>.npz:<array>": features (N, F), (N, H, W) or (N, H, W, C); labels (N,) of class indexes,
// or float targets (N,) or (N, K) when the loss reads targets.
// `mmap`: features of an uncompressed .npy file memory-mapped and read sample by sample, so that
// ones larger than memory train (always; auto: files over an eighth of the machine's memory, which
// as floats could fill half of it), bit-identical to reading them into memory.
#include <memory>
#include <tuple>
#include <utility>

#include "base/error.h"
#include "base/io.h"
#include "data/datasets.h"
#include "data/npz.h"

namespace mirrored {

namespace {

struct NpyOptions final : OptionsOf<NpyOptions> {
    std::string train_features, train_labels, test_features, test_labels;
    MapFeatures mmap = MapFeatures::auto_size;
    Fields fields() const override {
        return {{"train.features", train_features},
                {"train.labels", train_labels},
                {"test.features", test_features},
                {"test.labels", test_labels},
                {"mmap", map_features_name(mmap)}};
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
            if (file->empty())
                r.fail(p + split + key, "required for dataset npy: a .npy file's path, or <file>.npz:<array>");
        }
    }
    o->mmap = read_map_features(r, p + ".mmap");
    return o;
}

// "<file>.npz:<array>" -> the file and the array; a plain path -> itself and "".
std::pair<std::string, std::string> split_member(const std::string& spec) {
    const size_t at = spec.rfind(".npz:");
    if (at == std::string::npos) return {spec, ""};
    return {spec.substr(0, at + 4), spec.substr(at + 5)};
}

// One array: a .npy file, or an array of an .npz archive read into `bytes` (which `in` reads).
std::unique_ptr<InputFile> open_array(const DataSource& src, const std::string& spec,
                                      std::vector<unsigned char>& bytes) {
    const auto [file, array] = split_member(spec);
    const std::string path = src.path(file);
    const bool npz = path.size() > 4 && path.compare(path.size() - 4, 4, ".npz") == 0;
    if (npz && array.empty()) {
        std::string names;
        for (const std::string& a : npz_arrays(path)) names += (names.empty() ? "" : ", ") + a;
        throw DataError(path + ": an .npz archive: name the array, as " + file +
                        ":<array> (it holds: " + (names.empty() ? "nothing" : names) + ")");
    }
    if (!npz) return std::make_unique<InputFile>(path);
    bytes = read_npz_member(path, array);
    return std::make_unique<InputFile>(path + ":" + array, bytes.data(), bytes.size(), /*inflate=*/false);
}

// Whether a split's features are mapped: an uncompressed .npy file, when asked or large.
bool mapped(const DataSource& src, const std::string& spec, MapFeatures mode) {
    if (mode == MapFeatures::never) return false;
    const auto [file, array] = split_member(spec);
    const std::string path = src.path(file);
    const bool npz = !array.empty() || (path.size() > 4 && path.compare(path.size() - 4, 4, ".npz") == 0);
    if (npz && mode == MapFeatures::always)
        throw DataError(path +
                        ": data.mmap: always maps uncompressed .npy files; this is an .npz archive's array "
                        "(read into memory)");
    return !npz && map_features(path, mode);
}

Dataset read_split(const DataSource& src, const std::string& features, const std::string& labels, bool targets,
                   MapFeatures mmap) {
    std::vector<unsigned char> xb, yb;
    try {
        if (mapped(src, features, mmap)) {
            auto y = open_array(src, labels, yb);
            return read_npy_mapped(src.path(features), *y, targets);
        }
        auto x = open_array(src, features, xb);
        auto y = open_array(src, labels, yb);
        return read_npy(*x, *y, targets);
    } catch (const InputError& e) {
        throw DataError(e.what());
    }
}

Datasets load(const Options& options, const DataSource& src) {
    const auto& o = options_as<NpyOptions>(options);
    const bool targets = src.config.targets;
    Datasets out;
    out.train = read_split(src, o.train_features, o.train_labels, targets, o.mmap);
    out.test = read_split(src, o.test_features, o.test_labels, targets, o.mmap);
    const std::string& tx = out.train.name;
    const std::string& vx = out.test.name;
    const std::string& vy = out.test.labels_source;
    if (out.test.shape != out.train.shape)
        throw DataError(vx + ": the samples' shape differs from the training features' (" + tx + ")");
    if (out.test.target_size != out.train.target_size)
        throw DataError(vy + ": " + std::to_string(out.test.target_size) +
                        " target(s) per sample, the training labels have " + std::to_string(out.train.target_size));
    return out;
}

// The .npy files, or the .npz archives holding the arrays.
std::vector<std::string> inputs(const Options& opts) {
    const auto& o = options_as<NpyOptions>(opts);
    std::vector<std::string> files;
    for (const std::string* spec : {&o.train_features, &o.train_labels, &o.test_features, &o.test_labels})
        files.push_back(split_member(*spec).first);
    return files;
}

}  // namespace

extern const DataFormat kNpyFormat{"npy", ".", "", read, load, inputs};

}  // namespace mirrored
