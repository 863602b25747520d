// npy: NumPy arrays, a features file and a labels file per split (np.save), either of them
// gzip-compressed, or arrays of an .npz archive (np.savez, np.savez_compressed) named as
// "<file>.npz:<array>": features (N, F), (N, H, W) or (N, H, W, C); labels (N,) of class indexes,
// or float targets (N,) or (N, K) when the loss reads targets.
// `mmap`: features of an uncompressed .npy file memory-mapped and read sample by sample, so that
// ones larger than memory train (always; auto: files over an eighth of the machine's memory, which
// as floats could fill half of it), bit-identical to reading them into memory.
#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <tuple>
#include <utility>

#include "base/error.h"
#include "base/io.h"
#include "data/datasets.h"
#include "data/npz.h"
#include "data/formats/reading.h"

namespace mirrored {

namespace {

float half_to_float(uint16_t h) {
    const int sign = h >> 15, exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff;
    float v = exponent == 0    ? std::ldexp(float(mantissa), -24)
              : exponent == 31 ? (mantissa ? NAN : INFINITY)
                               : std::ldexp(float(mantissa | 0x400), exponent - 25);
    return sign ? -v : v;
}

}  // namespace

double NpyArray::at(size_t i) const { return value(&bytes[i * size_t(itemsize)]); }

double NpyArray::value(const unsigned char* p) const {
    unsigned char b[8];
    std::memcpy(b, p, size_t(itemsize));
    if (big_endian) std::reverse(b, b + itemsize);
    auto get = [&](auto v) {
        std::memcpy(&v, b, sizeof v);
        return double(v);
    };
    switch (kind) {
        case 'b':
            return b[0] != 0;
        case 'i':
            return itemsize == 1   ? get(int8_t())
                   : itemsize == 2 ? get(int16_t())
                   : itemsize == 4 ? get(int32_t())
                                   : get(int64_t());
        case 'u':
            return itemsize == 1   ? get(uint8_t())
                   : itemsize == 2 ? get(uint16_t())
                   : itemsize == 4 ? get(uint32_t())
                                   : get(uint64_t());
        default: {
            if (itemsize == 2) {
                uint16_t h;
                std::memcpy(&h, b, 2);
                return half_to_float(h);
            }
            return itemsize == 4 ? get(float()) : get(double());
        }
    }
}

namespace {

// A label as read (any integer a uint64 holds, or a fraction), without a conversion that could
// overflow: "18446744073709551615", "-3", "2.5".
std::string number_text(double v) {
    char b[64];
    std::snprintf(b, sizeof b, v == std::floor(v) ? "%.0f" : "%g", v);
    return b;
}

// The header's Python dict literal, {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), },
// read by a parser of exactly that (never evaluated).
class NpyHeaderParser {
public:
    NpyHeaderParser(std::string_view text, const std::string& path) : s_(text), path_(path) {}
    void parse(NpyArray& a) {
        bool descr = false, order = false, shape = false;
        expect('{');
        while (!peek('}')) {
            const std::string key = quoted();
            expect(':');
            if (key == "descr") descr = true, read_descr(a);
            else if (key == "fortran_order") {
                order = true;
                if (word() != "False")
                    fail("is in Fortran order: save it in C order (numpy.ascontiguousarray) for mirrored to read");
            } else if (key == "shape") shape = true, read_shape(a);
            else fail("has an unknown header key '" + key + "'");
            if (!peek('}')) expect(',');
        }
        if (!descr || !order || !shape) fail("header lacks descr, fortran_order or shape");
    }

private:
    [[noreturn]] void fail(const std::string& what) const { throw DataError(path_ + ": " + what); }
    void space() {
        while (!s_.empty() && (s_.front() == ' ' || s_.front() == '\n')) s_.remove_prefix(1);
    }
    bool peek(char c) {
        space();
        return !s_.empty() && s_.front() == c;
    }
    void expect(char c) {
        if (!peek(c)) fail(std::string("malformed header: expected '") + c + "'");
        s_.remove_prefix(1);
    }
    std::string quoted() {
        space();
        if (s_.empty() || (s_.front() != '\'' && s_.front() != '"')) fail("malformed header: expected a quoted name");
        const char q = s_.front();
        const size_t end = s_.find(q, 1);
        if (end == std::string_view::npos || end > 64) fail("malformed header: an unterminated name");
        std::string v(s_.substr(1, end - 1));
        s_.remove_prefix(end + 1);
        return v;
    }
    std::string word() {
        space();
        size_t n = 0;
        while (n < s_.size() && n < 16 && std::isalnum(static_cast<unsigned char>(s_[n]))) ++n;
        std::string v(s_.substr(0, n));
        s_.remove_prefix(n);
        return v;
    }
    void read_descr(NpyArray& a) {
        if (peek('[')) fail("holds a structured array (fields): save one numeric array per file");
        const std::string d = quoted();
        if (d.size() >= 2 && (d[1] == 'O' || d.find('O') != std::string::npos))
            fail("holds Python objects (dtype object), which mirrored never unpickles: save a numeric array");
        if (d.size() != 3 || std::string("<>|=").find(d[0]) == std::string::npos ||
            std::string("biuf").find(d[1]) == std::string::npos || d[2] < '1' || d[2] > '8')
            fail("dtype '" + d + "' is not a bool, integer or float array");
        a.kind = d[1];
        a.itemsize = d[2] - '0';
        a.big_endian = d[0] == '>';
        const bool ok = a.kind == 'b'   ? a.itemsize == 1
                        : a.kind == 'f' ? (a.itemsize == 2 || a.itemsize == 4 || a.itemsize == 8)
                                        : (a.itemsize == 1 || a.itemsize == 2 || a.itemsize == 4 || a.itemsize == 8);
        if (!ok) fail("dtype '" + d + "' is not a bool, integer or float array");
    }
    void read_shape(NpyArray& a) {
        expect('(');
        while (!peek(')')) {
            space();
            size_t n = 0;
            while (n < s_.size() && std::isdigit(static_cast<unsigned char>(s_[n]))) ++n;
            if (n == 0) fail("malformed header: a dimension of the shape is not a number");
            if (n > 10)
                fail("a dimension of " + std::string(s_.substr(0, std::min<size_t>(n, 30))) + (n > 30 ? "..." : "") +
                     " is implausibly large");
            const uint64_t dim = std::stoull(std::string(s_.substr(0, n)));
            s_.remove_prefix(n);
            if (dim > kMaxSamples) fail("a dimension of " + std::to_string(dim) + " is implausibly large");
            if (a.shape.size() >= 8) fail("more than 8 dimensions");
            a.shape.push_back(dim);
            if (!checked_mul(a.count, dim, a.count)) fail("its shape overflows");
            if (!peek(')')) expect(',');
        }
        expect(')');
    }

    std::string_view s_;
    const std::string& path_;
};

// The header: dtype and shape; `header_bytes` is where the data starts.
NpyArray read_npy_header(InputFile& in, size_t& header_bytes) {
    const std::string& path = in.path();
    std::vector<unsigned char> head;
    in.read_exact(head, 10, "the .npy header");
    if (std::memcmp(head.data(), "\x93NUMPY", 6) != 0) throw DataError(path + ": not a NumPy .npy file (bad magic)");
    const int major = head[6];
    if (major < 1 || major > 3)
        throw DataError(path + ": .npy format version " + std::to_string(major) + " (1 to 3 are known)");
    uint64_t header_len = uint64_t(head[8]) | (uint64_t(head[9]) << 8);
    if (major >= 2) {
        in.read_exact(head, 2, "the .npy header");
        header_len |= (uint64_t(head[10]) << 16) | (uint64_t(head[11]) << 24);
    }
    if (header_len > (uint64_t(1) << 20))
        throw DataError(path + ": a .npy header of " + std::to_string(header_len) + " bytes");
    std::vector<unsigned char> text;
    in.read_exact(text, size_t(header_len), "the .npy header");
    NpyArray a;
    NpyHeaderParser(std::string_view(reinterpret_cast<const char*>(text.data()), text.size()), path).parse(a);
    header_bytes = head.size() + size_t(header_len);
    return a;
}

NpyArray read_npy_array(InputFile& in, const char* what) {
    const std::string& path = in.path();
    size_t header_bytes = 0;
    NpyArray a = read_npy_header(in, header_bytes);
    uint64_t bytes = 0, floats = 0;
    if (!checked_mul(a.count, uint64_t(a.itemsize), bytes) || !checked_mul(a.count, sizeof(float), floats) ||
        bytes + floats > memory_bound())
        throw DataError(path + ": " + what + " of " + std::to_string(a.count) +
                        " values do not fit in the memory available");
    in.read_exact(a.bytes, size_t(bytes), std::string("the ") + what + " its header promises");
    if (!in.at_end())
        throw DataError(path + ": more data than its header's shape holds (" + std::to_string(bytes) +
                        " bytes): the header does not describe this file");
    return a;
}

std::string shape_text(const std::vector<uint64_t>& shape) {
    std::string s = "(";
    for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + (shape.size() == 1 ? ",)" : ")");
}

}  // namespace

namespace {

// The features' shape checked and turned into the data set's; the samples counted.
uint64_t npy_feature_shape(const NpyArray& x, const std::string& path, Dataset& ds) {
    if (x.shape.size() < 2 || x.shape.size() > 4)
        throw DataError(path + ": features of shape " + shape_text(x.shape) +
                        ": expected (N, features), (N, height, width) or (N, height, width, channels)");
    const uint64_t n = x.shape[0], per = x.count / std::max<uint64_t>(n, 1);
    if (n == 0) throw DataError(path + ": no samples (shape " + shape_text(x.shape) + ")");
    if (per == 0 || per > kMaxFeatures)
        throw DataError(path + ": " + std::to_string(per) + " values per sample is implausible");
    if (n > UINT32_MAX) throw DataError(path + ": " + std::to_string(n) + " samples; at most 2^32 - 1");
    if (x.shape.size() == 2) ds.shape = {int(x.shape[1])};
    else ds.shape = {int(x.shape[1]), int(x.shape[2]), x.shape.size() == 4 ? int(x.shape[3]) : 1};
    return n;
}

// Why a value of the file is no float the data set can hold: not finite, or a finite double
// beyond float's range (said as such: "not finite" would be false of 1e300); empty when it is one.
std::string not_a_float(double v) {
    if (!std::isfinite(v)) return "is not a finite number";
    if (std::fabs(v) > double(std::numeric_limits<float>::max())) {
        char text[40];
        std::snprintf(text, sizeof text, "%.6g", v);
        return std::string("is ") + text + ", beyond a 32-bit float's range (3.4e38)";
    }
    return "";
}

// A feature value as the data set holds it: u8 pixels scaled to [0, 1]; refused when no float.
float npy_feature(const NpyArray& x, double v, const std::string& path, size_t i, uint64_t per) {
    if (const std::string why = not_a_float(v); !why.empty())
        throw DataError(path + ": value " + std::to_string(i % per) + " of sample " + std::to_string(i / per) + " " +
                        why);
    return x.kind == 'u' && x.itemsize == 1 ? float(v) * (1.0f / 255.0f) : float(v);
}

// The labels (class indexes, or with `targets` float targets) of n samples.
void read_npy_labels(InputFile& labels, uint64_t n, bool targets, Dataset& ds) {
    const NpyArray y = read_npy_array(labels, "labels");
    if (y.shape.empty() || y.shape[0] != n || y.shape.size() > 2 ||
        (!targets && y.shape.size() == 2 && y.shape[1] != 1))
        throw DataError(labels.path() + ": labels of shape " + shape_text(y.shape) + " for " + std::to_string(n) +
                        " samples: expected (" + std::to_string(n) + ",)" +
                        (targets ? " or (" + std::to_string(n) + ", targets)" : ""));
    ds.labels_source = labels.path();
    if (targets) {
        ds.target_size = y.shape.size() == 2 ? int(std::min<uint64_t>(y.shape[1], kMaxFeatures)) : 1;
        if (ds.target_size < 1) throw DataError(labels.path() + ": no targets per sample");
        ds.targets.resize(size_t(y.count));
        for (size_t i = 0; i < ds.targets.size(); ++i) {
            const double v = y.at(i);
            if (const std::string why = not_a_float(v); !why.empty())
                throw DataError(labels.path() + ": target " + std::to_string(i) + " " + why);
            ds.targets[i] = float(v);
        }
        return;
    }
    if (y.kind == 'f')
        throw DataError(labels.path() +
                        ": float labels, but the loss takes class indexes: save them as integers "
                        "(or use model.loss: mse or binary_cross_entropy for float targets)");
    ds.labels.resize(size_t(n));
    for (size_t i = 0; i < ds.labels.size(); ++i) {
        const double v = y.at(i);
        if (v < 0 || v >= double(1 << 20))
            throw DataError(labels.path() + ": label " + number_text(v) + " of sample " + std::to_string(i) +
                            " is out of range: class indexes go from 0 to at most 1048575");
        ds.labels[i] = int32_t(v);
    }
    ds.classes = check_labels(ds.labels, 1 << 20, labels.path());
}

// Features read from the mapped file sample by sample (converted, normalised once normalize()
// has run); labels in memory. Opening checks every value and hashes the file in one pass, and
// sums each channel in the order compute_normalization() does, so that the normalisation - and
// so every value a replica sees - is the same as with the file read into memory.
class MappedNpy final : public SampleSource {
public:
    MappedNpy(std::shared_ptr<const MappedFile> map, NpyArray meta, size_t offset, const Dataset& ds)
        : map_(std::move(map)), meta_(std::move(meta)), data_(map_->data() + offset), labels_(ds.labels) {
        count_ = meta_.shape[0];
        per_ = size_t(meta_.count / count_);
        channels_ = size_t(ds.channels());
        check_and_sum(ds);
    }

    size_t count() const override { return count_; }
    uint64_t fingerprint() const override {
        return mean_.empty() ? fingerprint_ : normalized_fingerprint(fingerprint_, mean_, inv_);
    }
    std::shared_ptr<const SampleSource> normalized(const Normalization& n) const override {
        auto copy = std::make_shared<MappedNpy>(*this);
        copy->mean_ = n.mean;
        copy->inv_.clear();
        for (float sd : n.std) copy->inv_.push_back(1.0f / sd);  // as normalize() computes it
        return copy;
    }
    bool channel_sums(std::vector<double>& sum, std::vector<double>& sq) const override {
        sum = sum_;
        sq = sq_;
        return true;
    }

    void read(uint32_t idx, int64_t, float* features, int32_t* labels) const override {
        if (labels && !labels_.empty()) *labels = labels_[idx];  // float targets stay in the data set
        if (!features) return;
        const unsigned char* p = data_ + size_t(idx) * per_ * size_t(meta_.itemsize);
        const bool pixels = meta_.kind == 'u' && meta_.itemsize == 1;
        for (size_t i = 0; i < per_; ++i) {
            const float v = float(meta_.value(p + i * size_t(meta_.itemsize)));  // checked finite when opened
            features[i] = pixels ? v * (1.0f / 255.0f) : v;
        }
        if (mean_.empty()) return;
        for (size_t i = 0; i < per_; ++i) {
            const size_t c = i % channels_;
            features[i] = (features[i] - mean_[c]) * inv_[c];
        }
    }

private:
    void check_and_sum(const Dataset& ds) {
        Fingerprint f;
        const int64_t head[4] = {ds.classes, int64_t(ds.shape.size()), int64_t(meta_.itemsize), meta_.kind};
        f.add(head, sizeof head);
        f.add(ds.shape.data(), ds.shape.size() * sizeof(int));
        sum_.assign(channels_, 0.0);
        sq_.assign(channels_, 0.0);
        const size_t bytes_per_sample = per_ * size_t(meta_.itemsize);
        std::vector<float> x(per_);
        for (size_t s = 0; s < count_; ++s) {
            const unsigned char* p = data_ + s * bytes_per_sample;
            for (size_t i = 0; i < per_; ++i) {
                x[i] =
                    npy_feature(meta_, meta_.value(p + i * size_t(meta_.itemsize)), map_->path(), s * per_ + i, per_);
                const double v = x[i];
                sum_[i % channels_] += v;
                sq_[i % channels_] += v * v;
            }
            f.add(p, bytes_per_sample);
        }
        f.add(labels_.data(), labels_.size() * sizeof(int32_t));
        f.add(ds.targets.data(), ds.targets.size() * sizeof(float));
        fingerprint_ = f.value();
    }

    std::shared_ptr<const MappedFile> map_;
    NpyArray meta_;  // dtype and shape; no bytes
    const unsigned char* data_;
    std::vector<int32_t> labels_;  // class indexes (empty with float targets)
    size_t count_ = 0, per_ = 0, channels_ = 1;
    std::vector<double> sum_, sq_;
    std::vector<float> mean_, inv_;
    uint64_t fingerprint_ = 0;
};

}  // namespace

Dataset read_npy(InputFile& features, InputFile& labels, bool targets) {
    return as_data_error([&] {
        const NpyArray x = read_npy_array(features, "features");
        Dataset ds;
        ds.name = features.path();
        const uint64_t n = npy_feature_shape(x, features.path(), ds);
        const uint64_t per = x.count / n;
        resize_features(ds.features, size_t(x.count));
        for (size_t i = 0; i < ds.features.size(); ++i)
            ds.features[i] = npy_feature(x, x.at(i), features.path(), i, per);
        read_npy_labels(labels, n, targets, ds);
        return ds;
    });
}

// The mapped array x (its data at `offset`) as ds's source: the source's one checking pass reads
// the file in order (advised so) and gives the pages back after. The source holds the classes
// from here on; float targets stay in ds, where the loader reads them.
void attach_mapped(Dataset& ds, const std::shared_ptr<const MappedFile>& map, const NpyArray& x, size_t offset) {
    map->advise_sequential(true);
    ds.source = std::make_shared<const MappedNpy>(map, x, offset, ds);
    map->drop_resident();
    map->advise_sequential(false);
    ds.labels.clear();
}

Dataset read_npy_mapped(const std::string& features_path, InputFile& labels, bool targets) {
    return as_data_error([&] {
        auto map = std::make_shared<const MappedFile>(features_path);
        const size_t head = std::min<size_t>(map->size(), (size_t(1) << 20) + 12);
        InputFile header(features_path, map->data(), head, /*inflate=*/false);
        size_t offset = 0;
        NpyArray x = read_npy_header(header, offset);
        uint64_t bytes = 0;
        if (!checked_mul(x.count, uint64_t(x.itemsize), bytes) || bytes != map->size() - offset)
            throw DataError(features_path + ": " + std::to_string(map->size() - offset) +
                            " bytes of data, its header's shape " + shape_text(x.shape) + " holds " +
                            (bytes ? std::to_string(bytes) : std::string("more")) +
                            ": the header does not describe this file");
        Dataset ds;
        ds.name = features_path;
        const uint64_t n = npy_feature_shape(x, features_path, ds);
        read_npy_labels(labels, n, targets, ds);
        attach_mapped(ds, map, x, offset);
        return ds;
    });
}

Dataset read_npy(const std::string& features_path, const std::string& labels_path, bool targets) {
    return as_data_error([&] {
        InputFile features(features_path), labels(labels_path);
        return read_npy(features, labels, targets);
    });
}

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
