// A data set in memory or mapped: its features' pages, fingerprint, sample reads and
// normalisation, and what every format reader shares (data/formats/reading.h).
#include <sys/mman.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <chrono>
#include <cmath>
#include <cstring>
#include <new>

#include "data/dataset.h"
#include "data/formats/reading.h"
#include "base/io.h"
#include "base/error.h"

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

// What a reader may hold in memory: what the machine has left (else a generous fixed bound).
uint64_t memory_bound() {
    const uint64_t avail = available_host_memory();
    return avail ? avail : (uint64_t(1) << 40);
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

std::vector<unsigned char> read_file(const std::string& path) {
    return as_data_error([&] {
        InputFile in(path);
        std::vector<unsigned char> out;
        in.read_rest(out, size_t(std::min<uint64_t>(memory_bound(), SIZE_MAX)), "the content");
        return out;
    });
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

}  // namespace mirrored
