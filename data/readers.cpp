// Dataset readers: IDX, CIFAR-10 binary, CSV, synthetic; plus normalisation.
#include <sys/mman.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <limits>
#include <cmath>
#include <cstring>
#include <fstream>
#include <new>
#include <sstream>
#include <system_error>
#include <thread>

#include "data/dataset.h"
#include "base/io.h"
#include "base/error.h"
#include "base/philox.h"

namespace mirrored {

namespace {

// The whole 2 MiB pages inside [p, p + bytes), or an empty range.
std::pair<void*, size_t> huge_page_range(const void* p, size_t bytes) {
    constexpr uintptr_t kHuge = uintptr_t(2) << 20;
    const uintptr_t start = reinterpret_cast<uintptr_t>(p);
    const uintptr_t lo = (start + kHuge - 1) & ~(kHuge - 1), hi = (start + bytes) & ~(kHuge - 1);
    if (hi <= lo) return {nullptr, 0};
    return {reinterpret_cast<void*>(lo), size_t(hi - lo)};
}

}  // namespace

// A batch gathers rows from all over a data set; with 4 KiB pages nearly every row costs a TLB
// miss and a page walk (Fashion-MNIST's 188 MB are 46,000 pages), so its features ask for 2 MiB
// pages. Best effort: without transparent huge pages the advice fails and nothing changes.
void reserve_features(std::vector<float>& features, size_t n) {
    if (features.capacity() >= n) return;
    features.reserve(n);
    // Before the new pages are first touched: they then fault in huge, not copied later.
    const auto [range, len] = huge_page_range(features.data(), n * sizeof(float));
    if (len) ::madvise(range, len, MADV_HUGEPAGE);
}

void resize_features(std::vector<float>& features, size_t n) {
    reserve_features(features, n);
    features.resize(n);
}

// For features that grew without resize_features (a CSV whose up-front sizing was refused, row
// by row): MADV_COLLAPSE (Linux 6.1)
// copies its pages into huge ones now - pages already huge are left as they are - and
// MADV_HUGEPAGE lets later faults and khugepaged do it where collapse is refused. The contents
// never change.
void prefer_huge_pages(std::vector<float>& features) {
#ifndef MADV_COLLAPSE
    constexpr int MADV_COLLAPSE = 25;  // Linux 6.1; older C libraries lack the name
#endif
    const auto [range, len] = huge_page_range(features.data(), features.size() * sizeof(float));
    if (!len) return;  // under one whole huge page
    ::madvise(range, len, MADV_HUGEPAGE);
    ::madvise(range, len, MADV_COLLAPSE);
}

size_t Dataset::feature_size() const {
    size_t n = 1;
    for (int d : shape) n *= static_cast<size_t>(d);
    return n;
}

// Four lanes of a multiply-xor mix, 32 bytes per round: independent lanes keep the multiplies
// from waiting on each other.
void Fingerprint::add(const void* data, size_t bytes) {
    constexpr uint64_t kMul = 0x9E3779B97F4A7C15ull;
    const auto* p = static_cast<const unsigned char*>(data);
    size_t i = 0;
    for (; i + 32 <= bytes; i += 32)
        for (int k = 0; k < 4; ++k) {
            uint64_t w;
            std::memcpy(&w, p + i + 8 * size_t(k), 8);
            lane_[k] = (lane_[k] ^ w) * kMul;
            lane_[k] ^= lane_[k] >> 31;
        }
    uint64_t tail = bytes;  // the length too, so that a shorter buffer differs
    for (; i < bytes; ++i) tail = (tail ^ p[i]) * 0x100000001B3ull;
    lane_[0] = (lane_[0] ^ tail) * kMul;
}

uint64_t Fingerprint::value() const {
    uint64_t h = 0;
    for (uint64_t v : lane_) h = (h ^ v) * 0x9E3779B97F4A7C15ull ^ ((h ^ v) >> 29);
    return h;
}

uint64_t normalized_fingerprint(uint64_t fingerprint, const std::vector<float>& mean, const std::vector<float>& scale) {
    Fingerprint f;
    f.add(&fingerprint, sizeof fingerprint);
    f.add(mean.data(), mean.size() * sizeof(float));
    f.add(scale.data(), scale.size() * sizeof(float));
    return f.value();
}

uint64_t fingerprint(const Dataset& d) {
    if (d.source) return d.source->fingerprint();
    Fingerprint f;
    const std::vector<int64_t> head{int64_t(d.classes), int64_t(d.shape.size())};
    f.add(head.data(), head.size() * sizeof(int64_t));
    f.add(d.shape.data(), d.shape.size() * sizeof(int));
    f.add(d.features.data(), d.features.size() * sizeof(float));
    f.add(d.labels.data(), d.labels.size() * sizeof(int32_t));
    if (d.has_targets()) {  // class-labelled data hashes as it always has (checkpoints record it)
        const int64_t size = d.target_size;
        f.add(&size, sizeof size);
        f.add(d.targets.data(), d.targets.size() * sizeof(float));
    }
    return f.value();
}

std::shared_ptr<const SampleSource> SampleSource::normalized(const Normalization&) const {
    throw DataError("this data set's samples cannot be normalised (set data.normalize: none)");
}

void SampleSource::read_timed(uint32_t idx, int64_t epoch, float* features, Stages& s) const {
    const auto t0 = std::chrono::steady_clock::now();
    read(idx, epoch, features, nullptr);
    s.read += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void read_sample(const Dataset& d, size_t i, int64_t epoch, float* features, int32_t* labels) {
    if (d.source) return d.source->read(uint32_t(i), epoch, features, labels);
    const size_t fs = d.feature_size(), ls = size_t(d.label_size);
    if (features) std::memcpy(features, d.features.data() + i * fs, fs * sizeof(float));
    if (labels) std::memcpy(labels, d.labels.data() + i * ls, ls * sizeof(int32_t));
}

const float* first_features(const Dataset& d, size_t n, std::vector<float>& scratch) {
    if (!d.source) return d.features.data();
    const size_t fs = d.feature_size();
    scratch.resize(n * fs);
    for (size_t i = 0; i < n; ++i) d.source->read(uint32_t(i), 0, scratch.data() + i * fs, nullptr);
    return scratch.data();
}

namespace {

// What a reader may hold in memory: what the machine has left (else a generous fixed bound).
uint64_t memory_bound() {
    const uint64_t avail = available_host_memory();
    return avail ? avail : (uint64_t(1) << 40);
}

// Runs a reader, turning I/O errors into data errors.
template <typename F>
auto as_data_error(F&& f) -> decltype(f()) {
    try {
        return f();
    } catch (const InputError& e) {
        throw DataError(e.what());
    }
}

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

constexpr uint64_t kMaxSamples = uint64_t(INT32_MAX);  // sample indices are 32-bit in the loader
constexpr uint64_t kMaxFeatures = uint64_t(1) << 26;   // per sample: widths are ints, with room

// Sizes a data set's features and labels for `samples` samples up front, so that a reader fills
// them in place - no regrowing and copying as it goes, and pages that fault in huge instead of
// being collapsed afterwards. Only a capacity hint: above the bound a reader's own reads enforce
// (their clear error comes first) or without the memory for it, the data grows as it comes:
// returns false then.
bool reserve_samples(Dataset& ds, uint64_t samples, size_t features) {
    if (samples > kMaxSamples || samples * features * sizeof(float) > memory_bound() / 2) return false;
    try {
        reserve_features(ds.features, size_t(samples) * features);
        ds.labels.reserve(size_t(samples));
        return true;
    } catch (const std::bad_alloc&) {
        return false;
    }
}

}  // namespace

std::vector<unsigned char> read_file(const std::string& path) {
    return as_data_error([&] {
        InputFile in(path);
        std::vector<unsigned char> out;
        in.read_rest(out, size_t(std::min<uint64_t>(memory_bound(), SIZE_MAX)), "the content");
        return out;
    });
}

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

constexpr size_t kCifarRecord = 1 + 3 * 32 * 32, kCifarRecordFloats = 3 * 32 * 32;  // bytes on disk, floats

void read_cifar10_batch(InputFile& in, Dataset& ds) {
    constexpr size_t kRecord = kCifarRecord, kPlane = 32 * 32;
    const std::string& path = in.path();
    std::vector<unsigned char> b;
    as_data_error([&] { in.read_rest(b, size_t(std::min<uint64_t>(memory_bound() / 4, SIZE_MAX)), "the batch file"); });
    if (b.empty()) throw DataError(path + ": empty file");
    if (b.size() % kRecord != 0)
        throw DataError(path + ": " + std::to_string(b.size()) + " bytes is not a whole number of " +
                        std::to_string(kRecord) + "-byte CIFAR-10 records (truncated or not CIFAR-10)");
    const size_t n = b.size() / kRecord, base = ds.labels.size();
    if (base + n > kMaxSamples) throw DataError(path + ": more than 2^31 - 1 records in all");
    resize_features(ds.features, (base + n) * 3 * kPlane);
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

Dataset read_cifar10(const std::vector<std::string>& paths) {
    Dataset ds;
    ds.name = paths.empty() ? "cifar10" : paths.front();
    ds.labels_source = ds.name;
    ds.shape = {32, 32, 3};
    ds.classes = 10;
    if (paths.empty()) throw DataError("cifar10: no batch files given");
    // The uncompressed files' records, counted from their sizes: the data set is sized once
    // instead of regrown file by file (each file is still checked as it is read).
    uint64_t records = 0;
    for (const auto& path : paths)
        as_data_error([&] {
            InputFile in(path);
            if (!in.compressed()) records += in.file_size() / kCifarRecord;
        });
    reserve_samples(ds, records, kCifarRecordFloats);
    for (const auto& path : paths) {
        as_data_error([&] {
            InputFile in(path);
            read_cifar10_batch(in, ds);
        });
    }
    return ds;
}

namespace {

std::string_view trim(std::string_view s) {
    while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
    while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
    return s;
}

// A field as spreadsheets quote it ("label", "0.5") without its quotes.
std::string_view unquote(std::string_view f) {
    return f.size() >= 2 && f.front() == '"' && f.back() == '"' ? f.substr(1, f.size() - 2) : f;
}

// The fields of a line into `out` (reused from line to line: no allocation per row).
void split(std::string_view line, char delim, std::vector<std::string_view>& out) {
    out.clear();
    size_t start = 0;
    for (;;) {
        const size_t pos = line.find(delim, start);
        out.push_back(
            unquote(trim(line.substr(start, pos == std::string_view::npos ? std::string_view::npos : pos - start))));
        if (pos == std::string_view::npos) break;
        start = pos + 1;
    }
}

// A number in float range; one too small for a float (1e-50) is 0, as a float cannot say better.
enum class Parsed { ok, not_a_number, too_large };
Parsed parse_number(std::string_view s, float& v) {
    if (s.empty()) return Parsed::not_a_number;
    if (s.front() == '+') s.remove_prefix(1);
    double d = 0;
    const auto r = std::from_chars(s.data(), s.data() + s.size(), d);
    if (r.ptr != s.data() + s.size() || (r.ec != std::errc() && r.ec != std::errc::result_out_of_range))
        return Parsed::not_a_number;
    if (r.ec == std::errc::result_out_of_range) {  // beyond a double: tiny (to 0) or huge, by its exponent
        const size_t e = s.find_first_of("eE");
        if (e != std::string_view::npos && e + 1 < s.size() && s[e + 1] == '-') {
            v = 0.0f;
            return Parsed::ok;
        }
        return Parsed::too_large;
    }
    if (!std::isfinite(d)) return Parsed::not_a_number;  // "nan", "inf"
    if (std::fabs(d) > double(std::numeric_limits<float>::max())) return Parsed::too_large;
    v = float(d);
    return Parsed::ok;
}
bool parse_float(std::string_view s, float& v) { return parse_number(s, v) == Parsed::ok; }

// Printable form of a field for an error message: control bytes escaped, long fields cut.
std::string shown(std::string_view f) {
    std::string out;
    for (unsigned char ch : f.substr(0, 40)) {
        if (ch < 0x20 || ch == 0x7f) {
            char e[8];
            std::snprintf(e, sizeof e, "\\x%02x", ch);
            out += e;
        } else {
            out += char(ch);
        }
    }
    return f.size() > 40 ? out + "..." : out;
}

bool all_numbers(const std::vector<std::string_view>& fields) {
    float v;
    return std::all_of(fields.begin(), fields.end(), [&](std::string_view f) { return parse_float(f, v); });
}

// One label column by index or header name.
size_t find_column(const std::string& want, const std::vector<std::string>& header, size_t columns,
                   const std::string& path) {
    if (want.empty()) throw DataError(path + ": a label column's name is empty");
    if (std::all_of(want.begin(), want.end(), ::isdigit)) {
        const size_t col = want.size() > 9 ? columns : std::stoul(want);
        if (col >= columns)
            throw DataError(path + ": label column index " + want + " is out of range (" + std::to_string(columns) +
                            " columns)");
        return col;
    }
    auto it = std::find(header.begin(), header.end(), want);
    if (it == header.end())
        throw DataError(path + ": no column named '" + want + "' in the header" +
                        (header.empty() ? " (the file has no header row)" : ""));
    return size_t(it - header.begin());
}

// The label columns: label_columns by index or header name; unset, the header's "label", else the
// last. Each once, and at least one column left for the features.
std::vector<size_t> find_label_columns(const std::vector<std::string>& header, size_t columns, const CsvOptions& opt,
                                       const std::string& path) {
    if (opt.label_columns.empty()) {
        auto it = std::find(header.begin(), header.end(), "label");
        return {it != header.end() ? size_t(it - header.begin()) : columns - 1};
    }
    std::vector<size_t> cols;
    for (const std::string& want : opt.label_columns) {
        const size_t c = find_column(want, header, columns, path);
        if (std::find(cols.begin(), cols.end(), c) != cols.end())
            throw DataError(path + ": label column '" + want + "' is named twice");
        cols.push_back(c);
    }
    if (cols.size() >= columns)
        throw DataError(path + ": every one of the " + std::to_string(columns) +
                        " columns is a label column: no features left");
    return cols;
}

// One data row's features and label (class index, or targets in label_cols' order) onto the
// dataset (line `line_no` of `path`, for errors).
void append_row(const std::vector<std::string_view>& fields, const std::vector<size_t>& label_cols, bool targets,
                const std::vector<std::string>& header, const std::string& path, size_t line_no, Dataset& ds) {
    const auto where = [&] { return path + ":" + std::to_string(line_no) + ": "; };
    const size_t first_target = ds.targets.size();
    if (targets) ds.targets.resize(first_target + label_cols.size());
    for (size_t c = 0; c < fields.size(); ++c) {
        float v;
        if (const Parsed p = parse_number(fields[c], v); p != Parsed::ok)
            throw DataError(
                where() + "column " + std::to_string(c + 1) + (header.empty() ? "" : " (" + shown(header[c]) + ")") +
                ": '" + shown(fields[c]) +
                (p == Parsed::too_large ? "' is beyond a 32-bit float's range (3.4e38)" : "' is not a finite number"));
        const auto label = std::find(label_cols.begin(), label_cols.end(), c);
        if (label == label_cols.end()) {
            ds.features.push_back(v);
        } else if (targets) {
            ds.targets[first_target + size_t(label - label_cols.begin())] = v;
        } else {
            if (v < 0 || v != std::floor(v))
                throw DataError(where() + "label '" + shown(fields[c]) + "' is not a non-negative integer");
            if (v >= float(1 << 20))  // check_labels' bound on classes
                throw DataError(where() + "label '" + shown(fields[c]) +
                                "' is out of range: class indexes go from 0 "
                                "to at most 1048575");
            ds.labels.push_back(int32_t(v));
        }
    }
}

}  // namespace

Dataset read_csv(InputFile& in, const CsvOptions& opt) {
    const std::string& path = in.path();
    std::vector<unsigned char> bytes;
    as_data_error(
        [&] { in.read_rest(bytes, size_t(std::min<uint64_t>(memory_bound() / 2, SIZE_MAX)), "the CSV file"); });
    std::string_view text(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    if (text.substr(0, 3) == "\xEF\xBB\xBF") text.remove_prefix(3);  // a UTF-8 byte-order mark (Excel writes one)
    Dataset ds;
    ds.name = path;
    ds.labels_source = path;
    std::vector<std::string> header;
    std::vector<size_t> label_cols;
    size_t columns = 0, line_no = 0, pos = 0;
    bool first = true, sized = false;
    std::vector<std::string_view> fields;
    auto where = [&](size_t line) { return path + ":" + std::to_string(line) + ": "; };
    // Lines end in \n or \r\n; files from old Mac programs end them in \r alone
    const char eol =
        text.find('\n') == std::string_view::npos && text.find('\r') != std::string_view::npos ? '\r' : '\n';
    while (pos < text.size()) {
        size_t end = text.find(eol, pos);
        if (end == std::string_view::npos) end = text.size();
        const size_t line_start = pos;
        const std::string_view line = trim(text.substr(pos, end - pos));
        pos = end + 1;
        ++line_no;
        if (line.empty()) continue;
        if (line.find('\0') != std::string_view::npos)
            throw DataError(where(line_no) + "a NUL byte: this is not a text CSV file");
        split(line, opt.delimiter, fields);
        if (first) {  // the first line fixes the columns, and may be a header
            first = false;
            columns = fields.size();
            if (columns < 2)
                throw DataError(where(line_no) + "expected at least 2 columns (features and a label), found " +
                                std::to_string(columns));
            if (columns - 1 > kMaxFeatures)
                throw DataError(where(line_no) + std::to_string(columns) + " columns is implausibly many");
            // at most one row per line from this one on
            const std::string_view rest = text.substr(line_start);
            sized = reserve_samples(ds, uint64_t(std::count(rest.begin(), rest.end(), eol)) + 1, columns - 1);
            const bool is_header = opt.header == CsvOptions::Header::yes ||
                                   (opt.header == CsvOptions::Header::auto_detect && !all_numbers(fields));
            if (is_header)
                for (auto f : fields) header.emplace_back(f);
            label_cols = find_label_columns(header, columns, opt, path);
            if (label_cols.size() > 1 && !opt.targets)
                throw DataError(path +
                                ": several label columns are float targets, but the loss takes one class index "
                                "per sample (model.loss: mse or binary_cross_entropy reads targets)");
            if (is_header) continue;
        }
        if (fields.size() != columns)
            throw DataError(where(line_no) + "expected " + std::to_string(columns) + " columns, found " +
                            std::to_string(fields.size()));
        if (ds.features.size() / (columns - label_cols.size()) >= kMaxSamples)
            throw DataError(where(line_no) + "more than 2^31 - 1 rows");
        append_row(fields, label_cols, opt.targets, header, path, line_no, ds);
    }
    if (ds.features.empty()) throw DataError(path + ": no data rows");
    if (!sized) prefer_huge_pages(ds.features);  // grown row by row in small pages
    ds.shape = {int(columns - label_cols.size())};
    if (opt.targets) ds.target_size = int(label_cols.size());
    else ds.classes = check_labels(ds.labels, 1 << 20, path);
    return ds;
}

Dataset read_csv(const std::string& path, const CsvOptions& options) {
    return as_data_error([&] {
        InputFile in(path);
        return read_csv(in, options);
    });
}

Dataset make_synthetic(const SyntheticOptions& o) {
    Dataset ds;
    ds.name = "synthetic";
    ds.labels_source = "synthetic data";
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
    resize_features(ds.features, o.samples * fs);
    ds.labels.resize(o.samples);
    auto make = [&](size_t begin, size_t end) {
        std::vector<double> score(size_t(o.classes));
        for (size_t s = begin; s < end; ++s) {
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
                score[size_t(c)] = acc;
                if (acc > score[size_t(best)]) best = c;
            }
            ds.labels[s] = best;
        }
    };
    // Samples in contiguous ranges, one per thread: a benchmark's data is ready in a fraction of
    // the time on a many-core GPU host, and the same bits whatever the thread count.
    const size_t hw = std::max(1u, std::thread::hardware_concurrency());
    const size_t threads =
        std::min<size_t>({o.threads > 0 ? size_t(o.threads) : hw, 64, std::max<size_t>(1, o.samples / 256)});
    const auto range = [&](size_t t) { make(o.samples * t / threads, o.samples * (t + 1) / threads); };
    std::vector<std::thread> pool;
    pool.reserve(threads);
    size_t started = 1;
    try {
        for (; started < threads; ++started) pool.emplace_back(range, started);
    } catch (const std::system_error&) {
        // The system refused a thread: this thread makes the rest, the same data, later.
    }
    for (size_t t = started; t < threads; ++t) range(t);
    range(0);
    for (auto& th : pool) th.join();
    return ds;
}

Normalization compute_normalization(const Dataset& train) {
    const int ch = train.channels();
    std::vector<double> sum(ch, 0.0), sq(ch, 0.0);
    double per = 0;                                             // values per channel
    if (train.source && train.source->channel_sums(sum, sq)) {  // every sample, summed when opened
        per = double(train.count() * train.feature_size() / size_t(ch));
    } else {
        std::vector<float> sampled;
        if (train.source) {
            const size_t count = train.count(), take = std::min<size_t>(count, 512), fs = train.feature_size();
            sampled.resize(take * fs);
            for (size_t i = 0; i < take; ++i) read_sample(train, i * count / take, 0, sampled.data() + i * fs, nullptr);
        }
        const std::vector<float>& features = train.source ? sampled : train.features;
        const size_t n = features.size();
        // One channel at a time, in index order, into locals: the same sums as one pass with a
        // modulo per element, without the division and the round trip through memory.
        for (int c = 0; c < ch; ++c) {
            double s = 0.0, q = 0.0;
            for (size_t i = size_t(c); i < n; i += size_t(ch)) {
                const double v = features[i];
                s += v;
                q += v * v;
            }
            sum[c] = s;
            sq[c] = q;
        }
        per = double(n / ch);
    }
    Normalization out;
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
        throw ConfigError("data.normalize", "mean and std need " + std::to_string(ch) +
                                                " values (one per channel), got " + std::to_string(n.mean.size()) +
                                                " and " + std::to_string(n.std.size()));
    std::vector<float> inv(ch);
    for (int c = 0; c < ch; ++c) {
        if (!(n.std[c] > 0)) throw ConfigError("data.normalize.std", "values must be positive");
        inv[c] = 1.0f / n.std[c];
    }
    if (ds.source) ds.source = ds.source->normalized(n);
    float* x = ds.features.data();
    const size_t count = ds.features.size();
    if (ch == 1) {  // the common case as one loop that vectorises
        const float mean = n.mean[0], scale = inv[0];
        for (size_t i = 0; i < count; ++i) x[i] = (x[i] - mean) * scale;
    } else {
        for (size_t at = 0; at + size_t(ch) <= count; at += size_t(ch))
            for (int c = 0; c < ch; ++c) x[at + size_t(c)] = (x[at + size_t(c)] - n.mean[c]) * inv[c];
    }
    ds.pad_value.resize(ch);
    for (int c = 0; c < ch; ++c) ds.pad_value[c] = (0.0f - n.mean[c]) * inv[c];
}

// ---- NumPy .npy -------------------------------------------------------------------------

namespace {

// A label as read (any integer a uint64 holds, or a fraction), without a conversion that could
// overflow: "18446744073709551615", "-3", "2.5".
std::string number_text(double v) {
    char b[64];
    std::snprintf(b, sizeof b, v == std::floor(v) ? "%.0f" : "%g", v);
    return b;
}

}  // namespace

namespace {

struct NpyArray {
    char kind = 0;  // b(ool), i(nt), u(int), f(loat)
    int itemsize = 0;
    bool big_endian = false;
    std::vector<uint64_t> shape;
    uint64_t count = 1;
    std::vector<unsigned char> bytes;
    double at(size_t i) const;                   // element i as a double
    double value(const unsigned char* p) const;  // the element at p (of this dtype) as a double
};

float half_to_float(uint16_t h) {
    const int sign = h >> 15, exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff;
    float v = exponent == 0    ? std::ldexp(float(mantissa), -24)
              : exponent == 31 ? (mantissa ? NAN : INFINITY)
                               : std::ldexp(float(mantissa | 0x400), exponent - 25);
    return sign ? -v : v;
}

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

bool map_features(const std::string& path, MapFeatures mode) {
    if (mode == MapFeatures::never) return false;
    unsigned char magic[2] = {0, 0};
    uint64_t size = 0;
    as_data_error([&] {
        InputFile in(path, /*inflate=*/false);
        size = in.file_size();
        in.read(magic, 2);
    });
    if (magic[0] == 0x1f && magic[1] == 0x8b) {
        if (mode == MapFeatures::always)
            throw DataError(path +
                            ": data.mmap: always maps uncompressed files; this one is gzip-compressed (gunzip it)");
        return false;
    }
    const uint64_t memory = machine_memory();
    return mode == MapFeatures::always || (memory && size > memory / 8);
}

Dataset read_npy(const std::string& features_path, const std::string& labels_path, bool targets) {
    return as_data_error([&] {
        InputFile features(features_path), labels(labels_path);
        return read_npy(features, labels, targets);
    });
}

}  // namespace mirrored
