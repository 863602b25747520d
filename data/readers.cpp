// Dataset readers: IDX, CIFAR-10 binary, CSV, synthetic; plus normalisation.
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>

#include "data/dataset.h"
#include "kernels/error.h"
#include "kernels/philox.h"

namespace mirrored {

size_t Dataset::feature_size() const {
    size_t n = 1;
    for (int d : shape) n *= static_cast<size_t>(d);
    return n;
}

std::vector<unsigned char> read_file(const std::string& path) {
    gzFile f = gzopen(path.c_str(), "rb");
    if (!f) throw DataError(path + ": cannot open: " + std::strerror(errno ? errno : ENOENT));
    gzbuffer(f, 1 << 20);
    std::vector<unsigned char> out;
    unsigned char buf[1 << 16];
    for (;;) {
        const int n = gzread(f, buf, sizeof buf);
        if (n < 0) {
            int code = 0;
            const std::string msg = gzerror(f, &code);
            gzclose_r(f);
            throw DataError(path + ": read failed: " + (code == Z_ERRNO ? std::strerror(errno) : msg));
        }
        if (n == 0) break;
        out.insert(out.end(), buf, buf + n);
    }
    int code = 0;
    const std::string msg = gzerror(f, &code);
    const int close_rc = gzclose_r(f);
    if (code != Z_OK || close_rc == Z_BUF_ERROR)
        throw DataError(path + ": corrupt or truncated compressed data (" +
                        (code != Z_OK ? msg : std::string("unexpected end of file")) + ")");
    return out;
}

namespace {

uint32_t be32(const unsigned char* p) {
    return (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | uint32_t(p[3]);
}

// Parses an IDX header; returns the dimensions and checks the payload length exactly.
std::vector<uint32_t> idx_dims(const std::vector<unsigned char>& b, const std::string& path,
                               int want_dims, const char* what) {
    if (b.size() < 4) throw DataError(path + ": " + std::to_string(b.size()) + " bytes is too short for an IDX header");
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
    const size_t header = 4 + 4 * size_t(b[3]);
    if (b.size() < header) throw DataError(path + ": truncated IDX header");
    std::vector<uint32_t> dims;
    uint64_t expect = 1;
    for (int i = 0; i < b[3]; ++i) {
        dims.push_back(be32(&b[4 + 4 * i]));
        if (dims.back() == 0) throw DataError(path + ": IDX dimension " + std::to_string(i) + " is zero");
        expect *= dims.back();
        if (expect > (uint64_t(1) << 40)) throw DataError(path + ": IDX dimensions are implausibly large");
    }
    const uint64_t have = b.size() - header;
    if (have < expect)
        throw DataError(path + ": truncated: the header promises " + std::to_string(dims[0]) + " " + what +
                        " (" + std::to_string(expect) + " bytes) but only " + std::to_string(have) + " bytes follow");
    if (have > expect)
        throw DataError(path + ": " + std::to_string(have - expect) + " unexpected bytes after the last of " +
                        std::to_string(dims[0]) + " " + what);
    return dims;
}

int check_labels(const std::vector<int32_t>& labels, int limit, const std::string& path) {
    int mx = -1;
    for (size_t i = 0; i < labels.size(); ++i) {
        if (labels[i] < 0 || labels[i] >= limit)
            throw DataError(path + ": label " + std::to_string(labels[i]) + " of record " + std::to_string(i) +
                            " is outside [0, " + std::to_string(limit) + ")");
        mx = std::max(mx, labels[i]);
    }
    return mx + 1;
}

}  // namespace

Dataset read_idx(const std::string& images_path, const std::string& labels_path) {
    const auto ib = read_file(images_path);
    const auto dims = idx_dims(ib, images_path, 3, "images");
    const auto lb = read_file(labels_path);
    const auto ldims = idx_dims(lb, labels_path, 1, "labels");
    if (ldims[0] != dims[0])
        throw DataError(labels_path + ": " + std::to_string(ldims[0]) + " labels, but " + images_path + " has " +
                        std::to_string(dims[0]) + " images");
    Dataset ds;
    ds.name = images_path;
    ds.shape = {int(dims[1]), int(dims[2]), 1};
    const size_t n = dims[0], fs = size_t(dims[1]) * dims[2];
    ds.features.resize(n * fs);
    const unsigned char* px = ib.data() + 16;
    for (size_t i = 0; i < n * fs; ++i) ds.features[i] = px[i] * (1.0f / 255.0f);
    ds.labels.assign(lb.begin() + 8, lb.end());
    ds.classes = check_labels(ds.labels, 256, labels_path);
    return ds;
}

Dataset read_cifar10(const std::vector<std::string>& paths) {
    constexpr size_t kRecord = 1 + 3 * 32 * 32, kPlane = 32 * 32;
    Dataset ds;
    ds.name = paths.empty() ? "cifar10" : paths.front();
    ds.shape = {32, 32, 3};
    ds.classes = 10;
    if (paths.empty()) throw DataError("cifar10: no batch files given");
    for (const auto& path : paths) {
        const auto b = read_file(path);
        if (b.empty()) throw DataError(path + ": empty file");
        if (b.size() % kRecord != 0)
            throw DataError(path + ": " + std::to_string(b.size()) + " bytes is not a whole number of " +
                            std::to_string(kRecord) + "-byte CIFAR-10 records (truncated or not CIFAR-10)");
        const size_t n = b.size() / kRecord, base = ds.labels.size();
        ds.features.resize((base + n) * 3 * kPlane);
        for (size_t i = 0; i < n; ++i) {
            const unsigned char* r = &b[i * kRecord];
            if (r[0] > 9)
                throw DataError(path + ": label " + std::to_string(r[0]) + " of record " + std::to_string(i) +
                                " is outside [0, 10)");
            ds.labels.push_back(r[0]);
            float* out = &ds.features[(base + i) * 3 * kPlane];
            for (size_t p = 0; p < kPlane; ++p)  // CHW planes -> HWC
                for (size_t c = 0; c < 3; ++c) out[p * 3 + c] = r[1 + c * kPlane + p] * (1.0f / 255.0f);
        }
    }
    return ds;
}

namespace {

std::string_view trim(std::string_view s) {
    while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
    while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
    return s;
}

std::vector<std::string_view> split(std::string_view line, char delim) {
    std::vector<std::string_view> out;
    size_t start = 0;
    for (;;) {
        const size_t pos = line.find(delim, start);
        out.push_back(trim(line.substr(start, pos == std::string_view::npos ? std::string_view::npos : pos - start)));
        if (pos == std::string_view::npos) break;
        start = pos + 1;
    }
    return out;
}

bool parse_float(std::string_view s, float& v) {
    if (s.empty()) return false;
    if (s.front() == '+') s.remove_prefix(1);
    const auto r = std::from_chars(s.data(), s.data() + s.size(), v);
    return r.ec == std::errc() && r.ptr == s.data() + s.size() && std::isfinite(v);
}

}  // namespace

Dataset read_csv(const std::string& path, const CsvOptions& opt) {
    const auto bytes = read_file(path);
    const std::string_view text(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    Dataset ds;
    ds.name = path;
    std::vector<std::string> header;
    size_t columns = 0, label_col = 0, line_no = 0, pos = 0;
    bool first = true;
    auto where = [&](size_t line) { return path + ":" + std::to_string(line) + ": "; };
    while (pos < text.size()) {
        size_t end = text.find('\n', pos);
        if (end == std::string_view::npos) end = text.size();
        const std::string_view line = trim(text.substr(pos, end - pos));
        pos = end + 1;
        ++line_no;
        if (line.empty()) continue;
        const auto fields = split(line, opt.delimiter);
        if (first) {
            first = false;
            columns = fields.size();
            if (columns < 2) throw DataError(where(line_no) + "expected at least 2 columns (features and a label), found " + std::to_string(columns));
            bool numeric = true;
            for (auto f : fields) {
                float v;
                numeric = numeric && parse_float(f, v);
            }
            const bool is_header = opt.header == CsvOptions::Header::yes ||
                                   (opt.header == CsvOptions::Header::auto_detect && !numeric);
            if (is_header)
                for (auto f : fields) header.emplace_back(f);
            // which column holds the label
            const std::string& want = opt.label_column;
            if (want.empty()) {
                auto it = std::find(header.begin(), header.end(), "label");
                label_col = it != header.end() ? size_t(it - header.begin()) : columns - 1;
            } else if (std::all_of(want.begin(), want.end(), ::isdigit)) {
                label_col = std::stoul(want);
                if (label_col >= columns)
                    throw DataError(path + ": label column index " + want + " is out of range (" + std::to_string(columns) + " columns)");
            } else {
                auto it = std::find(header.begin(), header.end(), want);
                if (it == header.end())
                    throw DataError(path + ": no column named '" + want + "' in the header" +
                                    (header.empty() ? " (the file has no header row)" : ""));
                label_col = size_t(it - header.begin());
            }
            if (is_header) continue;
        }
        if (fields.size() != columns)
            throw DataError(where(line_no) + "expected " + std::to_string(columns) + " columns, found " + std::to_string(fields.size()));
        for (size_t c = 0; c < columns; ++c) {
            float v;
            if (!parse_float(fields[c], v))
                throw DataError(where(line_no) + "column " + std::to_string(c + 1) +
                                (header.empty() ? "" : " (" + header[c] + ")") + ": '" + std::string(fields[c]) +
                                "' is not a finite number");
            if (c == label_col) {
                if (v < 0 || v != std::floor(v) || v > 1e6)
                    throw DataError(where(line_no) + "label '" + std::string(fields[c]) + "' is not a non-negative integer");
                ds.labels.push_back(int32_t(v));
            } else {
                ds.features.push_back(v);
            }
        }
    }
    if (ds.labels.empty()) throw DataError(path + ": no data rows");
    ds.shape = {int(columns - 1)};
    ds.classes = check_labels(ds.labels, 1 << 20, path);
    return ds;
}

Dataset make_synthetic(const SyntheticOptions& o) {
    Dataset ds;
    ds.name = "synthetic";
    ds.shape = o.shape;
    ds.classes = o.classes;
    if (o.classes < 2) throw DataError("synthetic: classes must be at least 2");
    const size_t fs = ds.feature_size();
    // The teacher depends on the seed alone, so train and test splits share the rule.
    std::vector<float> teacher(size_t(o.classes) * fs);
    for (size_t i = 0; i < teacher.size(); ++i) {
        const Philox4 r = philox(o.seed, i, kStreamSynthetic, 0xFFFFFFFFu);
        teacher[i] = normal_from(r.v[0], r.v[1]);
    }
    ds.features.resize(o.samples * fs);
    ds.labels.resize(o.samples);
    std::vector<double> score(o.classes);
    for (size_t s = 0; s < o.samples; ++s) {
        float* x = &ds.features[s * fs];
        for (size_t j = 0; j < fs; ++j) {
            const Philox4 r = philox(o.seed, s * fs + j, kStreamSynthetic, o.split);
            x[j] = normal_from(r.v[0], r.v[1]);
        }
        int best = 0;
        for (int c = 0; c < o.classes; ++c) {
            double acc = 0;
            const float* w = &teacher[size_t(c) * fs];
            for (size_t j = 0; j < fs; ++j) acc += double(w[j]) * x[j];
            score[c] = acc;
            if (acc > score[best]) best = c;
        }
        ds.labels[s] = best;
    }
    return ds;
}

Normalization compute_normalization(const Dataset& train) {
    const int ch = train.channels();
    std::vector<double> sum(ch, 0.0), sq(ch, 0.0);
    const size_t n = train.features.size();
    for (size_t i = 0; i < n; ++i) {
        const double v = train.features[i];
        sum[i % ch] += v;
        sq[i % ch] += v * v;
    }
    Normalization out;
    const double per = double(n / ch);
    for (int c = 0; c < ch; ++c) {
        const double mean = sum[c] / per;
        const double var = std::max(sq[c] / per - mean * mean, 0.0);
        out.mean.push_back(float(mean));
        out.std.push_back(float(std::sqrt(var) > 1e-8 ? std::sqrt(var) : 1.0));  // constant channel: leave scale
    }
    return out;
}

void normalize(Dataset& ds, const Normalization& n) {
    const int ch = ds.channels();
    if (int(n.mean.size()) != ch || int(n.std.size()) != ch)
        throw ConfigError("data.normalize: mean and std need " + std::to_string(ch) + " values (one per channel), got " +
                          std::to_string(n.mean.size()) + " and " + std::to_string(n.std.size()));
    std::vector<float> inv(ch);
    for (int c = 0; c < ch; ++c) {
        if (!(n.std[c] > 0)) throw ConfigError("data.normalize.std: values must be positive");
        inv[c] = 1.0f / n.std[c];
    }
    for (size_t i = 0; i < ds.features.size(); ++i) {
        const int c = int(i % ch);
        ds.features[i] = (ds.features[i] - n.mean[c]) * inv[c];
    }
    ds.pad_value.resize(ch);
    for (int c = 0; c < ch; ++c) ds.pad_value[c] = (0.0f - n.mean[c]) * inv[c];
}

}  // namespace mirrored
