#include "data/image_cache.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <thread>

#include "base/error.h"
#include "base/output.h"
#include "data/dataset.h"
#include "data/image_transform.h"

namespace mirrored {

namespace {

constexpr char kMagic[8] = {'M', 'I', 'R', 'D', 'E', 'C', 'O', 'D'};
constexpr uint32_t kVersion = 1;
constexpr size_t kHeaderBytes = 64, kEntryBytes = 16, kAlign = 64;

// The cache file could not be written (a full disk): stops the build, whatever data.on_bad_file says.
struct CacheWriteError : DataError {
    using DataError::DataError;
};

struct Header {
    uint32_t version = 0, channels = 0, side = 0;
    uint64_t key = 0, count = 0, data_offset = 0, file_bytes = 0;
};

template <typename T>
void put(unsigned char* at, T v) {
    std::memcpy(at, &v, sizeof v);
}
template <typename T>
T get(const unsigned char* at) {
    T v;
    std::memcpy(&v, at, sizeof v);
    return v;
}

void encode_header(const Header& h, unsigned char (&out)[kHeaderBytes]) {
    std::memset(out, 0, kHeaderBytes);
    std::memcpy(out, kMagic, sizeof kMagic);
    put(out + 8, h.version);
    put(out + 12, h.channels);
    put(out + 16, h.side);
    put(out + 24, h.key);
    put(out + 32, h.count);
    put(out + 40, h.data_offset);
    put(out + 48, h.file_bytes);
}

Header decode_header(const unsigned char* in) {
    Header h;
    h.version = get<uint32_t>(in + 8);
    h.channels = get<uint32_t>(in + 12);
    h.side = get<uint32_t>(in + 16);
    h.key = get<uint64_t>(in + 24);
    h.count = get<uint64_t>(in + 32);
    h.data_offset = get<uint64_t>(in + 40);
    h.file_bytes = get<uint64_t>(in + 48);
    return h;
}

uint64_t cache_key(const std::vector<CacheSource>& sources, int side, int channels) {
    Fingerprint f;
    const int64_t head[4] = {kVersion, side, channels, int64_t(sources.size())};
    f.add(head, sizeof head);
    for (const CacheSource& s : sources) {
        f.add(s.path.data(), s.path.size() + 1);  // with its terminator: "ab","c" is not "a","bc"
        const int64_t v[4] = {int64_t(s.bytes), s.mtime_ns, s.width, s.height};
        f.add(v, sizeof v);
    }
    return f.value();
}

uint64_t data_offset(size_t count) {
    const uint64_t index_end = kHeaderBytes + uint64_t(count) * kEntryBytes;
    return (index_end + kAlign - 1) / kAlign * kAlign;
}

// Refuses a path that holds anything but a cache: it is not this program's to replace.
void check_replaceable(const std::string& path) {
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0) return;  // nothing there
    const std::string keep =
        ": exists and is not a decode cache written by mirrored; nothing was replaced: move it, or set "
        "data.cache_dir to keep the cache elsewhere";
    if (!S_ISREG(st.st_mode)) throw DataError(path + keep);
    char magic[sizeof kMagic] = {};
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    const bool ours = fd >= 0 && ::pread(fd, magic, sizeof magic, 0) == ssize_t(sizeof magic) &&
                      std::memcmp(magic, kMagic, sizeof kMagic) == 0;
    if (fd >= 0) ::close(fd);
    if (!ours) throw DataError(path + keep);
}

void pwrite_all(int fd, const unsigned char* p, size_t n, uint64_t offset, const std::string& path) {
    while (n > 0) {
        const ssize_t w = ::pwrite(fd, p, n, off_t(offset));
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0)
            throw CacheWriteError(path + ": cannot write the decode cache (" + std::strerror(w < 0 ? errno : EIO) +
                                  "); set data.cache_dir to keep it elsewhere, or data.cache: none");
        p += w;
        n -= size_t(w);
        offset += uint64_t(w);
    }
}

}  // namespace

void cached_size(int width, int height, int side, int* out_w, int* out_h) {
    *out_w = width;
    *out_h = height;
    if (side <= 0 || std::min(width, height) <= side) return;
    if (width <= height) {
        *out_w = side;
        *out_h = std::max(1, int(std::lround(double(height) * side / width)));
    } else {
        *out_h = side;
        *out_w = std::max(1, int(std::lround(double(width) * side / height)));
    }
}

PixelView DecodedImageCache::image(size_t i) const {
    const Entry& e = entries_[i];
    return {int(e.width), int(e.height), channels_, file_->data() + e.offset};
}

std::shared_ptr<const DecodedImageCache> DecodedImageCache::map(const Options& o, uint64_t key,
                                                                const std::vector<Entry>& layout) {
    const size_t count = layout.size();
    std::unique_ptr<MappedFile> file;
    try {
        file = std::make_unique<MappedFile>(o.path);
    } catch (const InputError&) {
        return nullptr;  // missing or unreadable: built (again)
    }
    const unsigned char* p = file->data();
    const uint64_t size = file->size();
    if (size < kHeaderBytes || std::memcmp(p, kMagic, sizeof kMagic) != 0) return nullptr;
    const Header h = decode_header(p);
    if (h.version != kVersion || h.channels != uint32_t(o.channels) || h.side != uint32_t(o.side) || h.key != key ||
        h.count != count || h.data_offset != data_offset(count) || h.file_bytes != size || h.data_offset > size)
        return nullptr;
    auto cache = std::shared_ptr<DecodedImageCache>(new DecodedImageCache());
    cache->channels_ = o.channels;
    cache->entries_.resize(count);
    for (size_t i = 0; i < count; ++i) {
        const unsigned char* at = p + kHeaderBytes + i * kEntryBytes;
        Entry& e = cache->entries_[i];
        e.offset = get<uint64_t>(at);
        e.width = get<uint32_t>(at + 8);
        e.height = get<uint32_t>(at + 12);
        // where the build put it, or 0 x 0 for an image it could not decode: an entry edited to
        // another size (1 x 1 pixels) is not this cache's
        const bool bad = e.width == 0 && e.height == 0;
        if (!bad && (e.offset != layout[i].offset || e.width != layout[i].width || e.height != layout[i].height))
            return nullptr;
        uint64_t bytes = 0, end = 0;
        if (!checked_mul(uint64_t(e.width) * e.height, uint64_t(o.channels), bytes) ||
            !checked_add(e.offset, bytes, end) || e.offset < h.data_offset || end > size || e.width > (1u << 20) ||
            e.height > (1u << 20))
            return nullptr;
    }
    cache->file_ = std::move(file);
    cache->file_->advise_sequential(false);  // samples are read in shuffled order
    return cache;
}

std::shared_ptr<const DecodedImageCache> DecodedImageCache::open(const Options& o,
                                                                 const std::vector<CacheSource>& sources,
                                                                 const Decode& decode, bool* built) {
    if (o.channels != 1 && o.channels != 3) throw DataError(o.path + ": a decode cache of 1 or 3 channels");
    const uint64_t key = cache_key(sources, o.side, o.channels);
    check_replaceable(o.path);
    remove_stale_temporaries(o.path);  // a build killed before: its partial copy is only waste
    if (built) *built = false;
    // Where each image goes: its index entry and its pixels at an offset fixed before any decode.
    std::vector<Entry> entries(sources.size());
    uint64_t end = data_offset(sources.size());
    for (size_t i = 0; i < sources.size(); ++i) {
        int w = 0, h = 0;
        cached_size(sources[i].width, sources[i].height, o.side, &w, &h);
        uint64_t bytes = 0;
        if (w <= 0 || h <= 0 || !checked_mul(uint64_t(w) * uint64_t(h), uint64_t(o.channels), bytes) ||
            !checked_add(end, bytes, end))
            throw DataError(sources[i].path + ": an image size the decode cache cannot hold");
        entries[i] = {end - bytes, uint32_t(w), uint32_t(h)};
    }
    if (auto cache = map(o, key, entries)) return cache;
    const uint64_t total = end;
    const auto t0 = std::chrono::steady_clock::now();
    std::fprintf(stderr, "data: decoding %zu images once into %s (data.cache: decoded, shorter side %d)\n",
                 sources.size(), o.path.c_str(), o.side);
    const auto fill = [&](int fd, const std::string& tmp) {
        std::vector<std::string> problem(sources.size());
        std::string write_error;
        std::mutex write_mutex;
        try {
            if (::ftruncate(fd, off_t(total)) != 0)
                throw DataError(o.path + ": cannot size the decode cache to " + format_bytes(total) + " (" +
                                std::strerror(errno) + "); set data.cache_dir to keep it elsewhere");
            std::atomic<size_t> next{0};
            std::atomic<bool> stop{false};
            auto work = [&] {
                Pixels pixels;
                std::vector<float> resized, scratch;
                std::vector<unsigned char> out;
                PixelMap identity;
                identity.scale.assign(size_t(o.channels), 1.0f);
                identity.shift.assign(size_t(o.channels), 0.0f);
                for (size_t i = next++; i < sources.size() && !stop; i = next++) {
                    const CacheSource& s = sources[i];
                    Entry& e = entries[i];
                    try {
                        const int shrink = jpeg_shrink_for(s.width, s.height, int(e.width), int(e.height));
                        decode(i, shrink, pixels);
                        const double scale = decoded_scale(pixels, s.width, s.height, s.path);
                        const size_t bytes = size_t(e.width) * e.height * size_t(o.channels);
                        if (int(e.width) == pixels.width && int(e.height) == pixels.height) {
                            pwrite_all(fd, pixels.data.data(), bytes, e.offset, o.path);
                            continue;
                        }
                        resized.resize(bytes);
                        resample(pixels, {0, 0, s.width * scale, s.height * scale}, false, int(e.width), int(e.height),
                                 identity, resized.data(), scratch);
                        out.resize(bytes);
                        for (size_t k = 0; k < bytes; ++k)
                            out[k] = static_cast<unsigned char>(std::clamp(std::lround(resized[k]), 0L, 255L));
                        pwrite_all(fd, out.data(), bytes, e.offset, o.path);
                    } catch (const CacheWriteError& err) {
                        std::lock_guard<std::mutex> lock(write_mutex);
                        if (write_error.empty()) write_error = err.what();
                        stop = true;
                    } catch (const DataError& err) {
                        problem[i] = err.what();
                        e.width = e.height = 0;  // read as a bad file
                        if (!o.skip_bad) stop = true;
                    }
                }
            };
            const size_t n = std::min<size_t>(std::max(1u, std::thread::hardware_concurrency()), 16);
            std::vector<std::thread> threads;
            for (size_t t = 1; t < n && t < sources.size(); ++t) threads.emplace_back(work);
            work();
            for (auto& t : threads) t.join();
            if (!write_error.empty()) throw DataError(write_error);
            if (!o.skip_bad)
                for (const std::string& p : problem)
                    if (!p.empty()) throw DataError(p + "; data.on_bad_file: skip leaves bad files out");
            std::vector<unsigned char> head(size_t(data_offset(sources.size())), 0);
            Header h;
            h.version = kVersion;
            h.channels = uint32_t(o.channels);
            h.side = uint32_t(o.side);
            h.key = key;
            h.count = sources.size();
            h.data_offset = data_offset(sources.size());
            h.file_bytes = total;
            unsigned char header[kHeaderBytes];
            encode_header(h, header);
            std::memcpy(head.data(), header, kHeaderBytes);
            for (size_t i = 0; i < entries.size(); ++i) {
                unsigned char* at = head.data() + kHeaderBytes + i * kEntryBytes;
                put(at, entries[i].offset);
                put(at + 8, entries[i].width);
                put(at + 12, entries[i].height);
            }
            pwrite_all(fd, head.data(), head.size(), 0, o.path);
        } catch (...) {
            ::close(fd);
            ::unlink(tmp.c_str());
            throw;
        }
    };
    try {
        write_file_atomic(o.path, fill);
    } catch (const CheckpointError& e) {  // the temporary or the rename: a data error, as the rest
        throw DataError(std::string(e.what()) + "; set data.cache_dir to keep the decode cache elsewhere");
    }
    auto cache = map(o, key, entries);
    if (!cache) throw DataError(o.path + ": the decode cache just written cannot be read back");
    if (built) *built = true;
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::fprintf(stderr, "data: %s: %s, %zu images in %.1f s\n", o.path.c_str(), format_bytes(total).c_str(),
                 sources.size(), s);
    return cache;
}

}  // namespace mirrored
