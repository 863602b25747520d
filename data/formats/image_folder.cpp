// image_folder: JPEG and PNG images laid out as torchvision's ImageFolder reads them -
// <root>/<split>/<class>/**/<file>, classes numbered in name order, files in path order - or named
// by a list file (`path,label` lines, paths relative to the list's folder). The test split's
// classes are matched to the training split's by name.
//
// Opening a split lists its files and reads each one's header (in parallel, the first 64 KiB):
// an unreadable file, a file that is no JPEG or PNG, a corrupt header or one over data.max_pixels
// is found before training starts, and stops it (data.on_bad_file: error) or is left out and
// counted (skip), up to data.max_bad_fraction of the split. Decoding happens in the loader
// threads, sample by sample: training samples are torchvision's RandomResizedCrop (data.scale,
// data.ratio) and a horizontal flip drawn from (seed, epoch, index); test samples are the shorter
// side resized to data.resize and a centre crop. A JPEG is decoded shrunk in its DCT when the
// crop allows (data/image_codec.h); the crop, resize, flip and normalisation are one pass
// (data/image_transform.h). A file that fails to decode then (its data corrupt past the header,
// or changed since) stops the run or, with skip, becomes zeros (the mean image, once normalised)
// and is counted (SampleSource::bad_reads, reported in summary.json). With data.cache: decoded
// every image is decoded once, when the split is opened, into a memory-mapped file beside it
// (data/image_cache.h), and samples are cut from the cached pixels instead.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "base/error.h"
#include "data/datasets.h"
#include "data/image_cache.h"
#include "data/image_codec.h"
#include "data/image_transform.h"

namespace mirrored {

namespace {

namespace fs = std::filesystem;

std::string number_text(double v) {
    char buf[32];
    auto r = std::to_chars(buf, buf + sizeof buf, v);
    return std::string(buf, r.ptr);
}

struct ImageFolderOptions final : OptionsOf<ImageFolderOptions> {
    std::string train = "train", test = "val";
    int height = 224, width = 224, channels = 3;
    int resize = 0;  // the test split's shorter side before the centre crop; 0: the size / 0.875
    RandomCropOptions crop;
    bool flip = true;
    bool skip_bad = false;
    double max_bad_fraction = 0.01;
    uint64_t max_pixels = kDefaultMaxPixels;
    bool cache = false;     // data.cache: decoded
    int cache_side = 0;     // the cached images' shorter side; 0: eval_resize()
    std::string cache_dir;  // "": beside each split
    Fields fields() const override {
        Fields f = {{"train", train},
                    {"test", test},
                    {"size", "[" + std::to_string(height) + ", " + std::to_string(width) + "]"},
                    {"channels", std::to_string(channels)},
                    {"resize", std::to_string(resize)},
                    {"scale", "[" + number_text(crop.scale[0]) + ", " + number_text(crop.scale[1]) + "]"},
                    {"ratio", "[" + number_text(crop.ratio[0]) + ", " + number_text(crop.ratio[1]) + "]"},
                    {"flip", flip ? "true" : "false"},
                    {"on_bad_file", skip_bad ? "skip" : "error"},
                    {"max_bad_fraction", number_text(max_bad_fraction)},
                    {"max_pixels", std::to_string(max_pixels)},
                    {"cache", cache ? "decoded" : "none"}};
        if (cache) {  // its keys only with it (they are refused without)
            f.push_back({"cache_side", std::to_string(cached_side())});
            if (!cache_dir.empty()) f.push_back({"cache_dir", cache_dir});
        }
        return f;
    }
    bool operator==(const ImageFolderOptions& o) const {
        return train == o.train && test == o.test && height == o.height && width == o.width && channels == o.channels &&
               resize == o.resize && crop.scale[0] == o.crop.scale[0] && crop.scale[1] == o.crop.scale[1] &&
               crop.ratio[0] == o.crop.ratio[0] && crop.ratio[1] == o.crop.ratio[1] && flip == o.flip &&
               skip_bad == o.skip_bad && max_bad_fraction == o.max_bad_fraction && max_pixels == o.max_pixels &&
               cache == o.cache && cached_side() == o.cached_side() && cache_dir == o.cache_dir;
    }
    int eval_resize() const { return resize ? resize : int(std::lround(std::min(height, width) / 0.875)); }
    int cached_side() const { return cache_side ? cache_side : std::max({eval_resize(), height, width}); }
};

void read_range(SpecReader& r, const std::string& key, double* range, double lo, double hi) {
    if (!r.has(key)) return;
    const std::vector<double> v = r.number_list(key);
    if (v.size() != 2 || !(v[0] > lo) || !(v[1] <= hi) || !(v[0] <= v[1]))
        r.fail(key, "expected [low, high] with " + number_text(lo) + " < low <= high <= " + number_text(hi));
    range[0] = v[0];
    range[1] = v[1];
}

OptionsPtr read(SpecReader& r, const std::string& p, bool) {
    auto o = std::make_shared<ImageFolderOptions>();
    o->train = r.nonempty_text(p + ".train", o->train);
    o->test = r.nonempty_text(p + ".test", o->test);
    std::vector<int> size;  // 224 or [224, 224]
    for (const std::string& item : r.text_list(p + ".size")) {
        int v = 0;
        const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
        if (ec != std::errc() || end != item.data() + item.size() || v < 1 || v > 8192) size.clear();
        else size.push_back(v);
        if (size.empty()) break;
    }
    if (!r.has(p + ".size")) size = {224, 224};
    if (size.size() != 1 && size.size() != 2)
        r.fail(p + ".size", "expected a side or [height, width] in pixels, each in [1, 8192], e.g. 224");
    o->height = size[0];
    o->width = size.back();
    o->channels = int(r.integer(p + ".channels", 3, 1, 3));
    if (o->channels == 2) r.fail(p + ".channels", "expected 1 (grey) or 3 (RGB)");
    o->resize = int(r.integer(p + ".resize", 0, 0, 65536));
    read_range(r, p + ".scale", o->crop.scale, 0.0, 1.0);
    read_range(r, p + ".ratio", o->crop.ratio, 0.0, 100.0);
    o->flip = r.boolean(p + ".flip", true);
    o->skip_bad = r.choice(p + ".on_bad_file", "error", {"error", "skip"}) == "skip";
    o->max_bad_fraction = r.number(p + ".max_bad_fraction", 0.01, 0.0, 1.0);
    o->max_pixels = uint64_t(r.integer(p + ".max_pixels", int64_t(kDefaultMaxPixels), 1, int64_t(1) << 40));
    o->cache = r.choice(p + ".cache", "none", {"none", "decoded"}) == "decoded";
    o->cache_side = int(r.integer(p + ".cache_side", 0, 0, 65536));
    o->cache_dir = r.text(p + ".cache_dir", "");
    if (!o->cache && (r.has(p + ".cache_side") || r.has(p + ".cache_dir")))
        r.fail(p + ".cache_side", "applies with data.cache: decoded only");
    return o;
}

// ---- listing ------------------------------------------------------------------------------

struct ImageFile {
    std::string path;
    int32_t label = 0;
    uint64_t bytes = 0;
    int64_t mtime_ns = 0;
    int width = 0, height = 0;  // from the header, when opened
};

struct Listing {
    std::vector<std::string> classes;
    std::vector<ImageFile> files;
    std::vector<std::string> bad;  // "<path>: <what is wrong>", in file order
};

bool has_suffix(std::string name, std::initializer_list<const char*> suffixes) {
    std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return char(std::tolower(c)); });
    for (const char* s : suffixes) {
        const size_t n = std::strlen(s);
        if (name.size() >= n && name.compare(name.size() - n, n, s) == 0) return true;
    }
    return false;
}

int64_t mtime_ns(const struct stat& st) { return int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec; }

// One class folder's files, as torchvision walks it (os.walk following links, directories in
// path order, files in name order). A link back to a folder on the current path is a loop.
void walk_class(const std::string& dir, int32_t label, std::vector<std::pair<dev_t, ino_t>>& ancestors,
                std::map<std::string, std::vector<ImageFile>>& by_dir, Listing& out) {
    struct stat st {};
    if (::stat(dir.c_str(), &st) != 0) {
        out.bad.push_back(dir + ": cannot read the folder (" + std::strerror(errno) + ")");
        return;
    }
    for (const auto& a : ancestors)
        if (a.first == st.st_dev && a.second == st.st_ino)
            throw DataError(dir + ": a symbolic-link loop (the folder contains itself)");
    ancestors.emplace_back(st.st_dev, st.st_ino);
    std::vector<std::string> names;
    std::error_code ec;
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
        names.push_back(it->path().filename().string());
    if (ec) out.bad.push_back(dir + ": cannot list the folder (" + ec.message() + ")");
    std::sort(names.begin(), names.end());
    std::vector<ImageFile>& files = by_dir[dir];
    for (const std::string& name : names) {
        const std::string path = dir + "/" + name;
        if (::stat(path.c_str(), &st) != 0) {  // a dangling link: bad only where an image was meant
            if (has_suffix(name, {".jpg", ".jpeg", ".png"}))
                out.bad.push_back(path + ": cannot read (" + std::strerror(errno) + ")");
            continue;
        }
        if (S_ISDIR(st.st_mode)) {
            walk_class(path, label, ancestors, by_dir, out);
        } else if (has_suffix(name, {".jpg", ".jpeg", ".png"})) {
            if (!S_ISREG(st.st_mode)) out.bad.push_back(path + ": not a regular file");
            else files.push_back({path, label, uint64_t(st.st_size), mtime_ns(st)});
        } else if (has_suffix(name, {".bmp", ".gif", ".pgm", ".ppm", ".tif", ".tiff", ".webp"})) {
            out.bad.push_back(path + ": an image format not read here (JPEG and PNG are): convert it");
        }  // anything else (README, labels.txt, .DS_Store) is not an image: torchvision skips it too
    }
    ancestors.pop_back();
}

// The class folders of a split, in name order (torchvision's find_classes).
std::vector<std::string> class_names(const std::string& root) {
    std::vector<std::string> classes;
    std::error_code ec;
    for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
        std::error_code not_dir;  // a dangling link here is no class, as for torchvision
        if (it->is_directory(not_dir)) classes.push_back(it->path().filename().string());
    }
    if (ec) throw DataError(root + ": cannot list the folder (" + ec.message() + ")");
    std::sort(classes.begin(), classes.end());
    return classes;
}

Listing list_folder(const std::string& root, const std::vector<std::string>* train_classes) {
    Listing out;
    out.classes = class_names(root);
    if (out.classes.empty())
        throw DataError(root + ": no class folders (expected " + root +
                        "/<class>/<image>, as torchvision's ImageFolder)");
    for (size_t c = 0; c < out.classes.size(); ++c) {
        int32_t label = int32_t(c);
        if (train_classes) {
            auto at = std::find(train_classes->begin(), train_classes->end(), out.classes[c]);
            if (at == train_classes->end())
                throw DataError(root + "/" + out.classes[c] + ": a class the training split does not have");
            label = int32_t(at - train_classes->begin());
        }
        std::vector<std::pair<dev_t, ino_t>> ancestors;
        std::map<std::string, std::vector<ImageFile>> mine;  // path order, as sorted(os.walk(...))
        walk_class(root + "/" + out.classes[c], label, ancestors, mine, out);
        const size_t before = out.files.size();
        for (auto& [dir, files] : mine)
            for (ImageFile& f : files) out.files.push_back(std::move(f));
        if (out.files.size() == before)
            throw DataError(root + "/" + out.classes[c] +
                            ": a class folder without .jpg, .jpeg or .png images (remove it, or add images)");
    }
    if (train_classes) out.classes = *train_classes;
    return out;
}

// `path,label` lines (a header line "path,label" allowed), paths relative to the list's folder.
Listing list_file(const std::string& list) {
    std::ifstream in(list);
    if (!in) throw DataError(list + ": cannot read the list file");
    Listing out;
    const std::string base = fs::path(list).parent_path().string();
    std::string line;
    int32_t top = -1;
    for (size_t number = 1; std::getline(in, line); ++number) {
        if (!line.empty() && line.back() == '\r') line.pop_back();
        if (number == 1 && line.rfind("\xEF\xBB\xBF", 0) == 0) line.erase(0, 3);  // UTF-8's byte-order mark, as CSV
        if (line.empty() || (number == 1 && line == "path,label")) continue;
        const size_t comma = line.rfind(',');
        const std::string where = list + ":" + std::to_string(number) + ": ";
        if (comma == std::string::npos || comma == 0) throw DataError(where + "expected path,label");
        int64_t label = -1;
        const char* b = line.data() + comma + 1;
        const char* e = line.data() + line.size();
        auto r = std::from_chars(b, e, label);
        if (r.ec != std::errc() || r.ptr != e || label < 0 || label >= (int64_t(1) << 24))
            throw DataError(where + "label '" + std::string(b, e) + "': expected a class index in [0, 2^24)");
        fs::path p(line.substr(0, comma));
        const std::string path = p.is_absolute() ? p.string() : (fs::path(base) / p).string();
        struct stat st {};
        if (::stat(path.c_str(), &st) != 0) out.bad.push_back(path + ": cannot read (" + std::strerror(errno) + ")");
        else if (!S_ISREG(st.st_mode)) out.bad.push_back(path + ": not a regular file");
        else out.files.push_back({path, int32_t(label), uint64_t(st.st_size), mtime_ns(st)});
        top = std::max(top, int32_t(label));
    }
    if (out.files.empty() && out.bad.empty()) throw DataError(list + ": no images listed");
    for (int32_t c = 0; c <= top; ++c) out.classes.push_back(std::to_string(c));
    return out;
}

// Reads at most `limit` bytes of a regular file into out (resized to what was read).
void read_prefix(const std::string& path, size_t limit, std::vector<unsigned char>& out) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw DataError(path + ": cannot open (" + std::strerror(errno) + ")");
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        ::close(fd);
        throw DataError(path + ": not a regular file");
    }
    const size_t want = std::min(size_t(st.st_size), limit);
    out.resize(want);
    size_t got = 0;
    while (got < want) {
        const ssize_t n = ::pread(fd, out.data() + got, want - got, off_t(got));
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            const int err = errno;
            ::close(fd);
            throw DataError(path + ": read failed (" + std::strerror(err) + ")");
        }
        if (n == 0) break;
        got += size_t(n);
    }
    ::close(fd);
    out.resize(got);
}

constexpr size_t kHeaderBytes = size_t(64) << 10;
constexpr size_t kMaxFileBytes = size_t(1) << 30;

// Every file's header, read by several threads; files that fail join `bad`, in file order.
void check_headers(Listing& l, uint64_t max_pixels) {
    std::vector<std::string> problem(l.files.size());
    std::atomic<size_t> next{0};
    auto work = [&] {
        std::vector<unsigned char> bytes;
        for (size_t i = next++; i < l.files.size(); i = next++) {
            ImageFile& f = l.files[i];
            try {
                if (f.bytes > kMaxFileBytes) throw DataError(f.path + ": over 1 GiB, too large for an image");
                read_prefix(f.path, kHeaderBytes, bytes);
                ImageHeader h{};
                try {
                    h = read_image_header(bytes.data(), bytes.size(), f.path, max_pixels);
                } catch (const DataError&) {
                    if (bytes.size() == f.bytes) throw;         // the whole file: it is bad
                    read_prefix(f.path, kMaxFileBytes, bytes);  // a JPEG frame header after large EXIF data
                    h = read_image_header(bytes.data(), bytes.size(), f.path, max_pixels);
                }
                f.width = h.width;
                f.height = h.height;
            } catch (const DataError& e) {
                problem[i] = e.what();
            }
        }
    };
    const size_t n = std::min<size_t>(std::max(1u, std::thread::hardware_concurrency()), 16);
    std::vector<std::thread> threads;
    for (size_t t = 1; t < n && t < l.files.size(); ++t) threads.emplace_back(work);
    work();
    for (auto& t : threads) t.join();
    std::vector<ImageFile> good;
    good.reserve(l.files.size());
    for (size_t i = 0; i < l.files.size(); ++i) {
        if (problem[i].empty()) good.push_back(std::move(l.files[i]));
        else l.bad.push_back(std::move(problem[i]));
    }
    l.files = std::move(good);
}

// ---- the samples ----------------------------------------------------------------------------

class ImageSamples final : public SampleSource {
public:
    ImageSamples(std::shared_ptr<const Listing> listing, const ImageFolderOptions& o, bool train, uint64_t seed,
                 std::shared_ptr<const DecodedImageCache> cache)
        : listing_(std::move(listing)),
          cache_(std::move(cache)),
          o_(o),
          train_(train),
          seed_(seed),
          map_(PixelMap::normalized({}, {}, o.channels)),
          bad_(std::make_shared<BadFiles>(listing_->files.size())) {
        Fingerprint f;
        const int64_t head[6] = {o.height, o.width, o.channels, train ? 1 : 0, o.eval_resize(), o.flip ? 1 : 0};
        f.add(head, sizeof head);
        f.add(o.crop.scale, sizeof o.crop.scale);
        f.add(o.crop.ratio, sizeof o.crop.ratio);
        if (cache_) {  // the samples are cut from the cached images: other pixels
            const int64_t side = o.cached_side();
            f.add(&side, sizeof side);
        }
        for (const ImageFile& file : listing_->files) {
            const std::string name = fs::path(file.path).filename().string();  // not the root: data moves
            f.add(name.data(), name.size());
            const int64_t v[4] = {file.label, int64_t(file.bytes), file.width, file.height};
            f.add(v, sizeof v);
        }
        fingerprint_ = f.value();
    }

    size_t count() const override { return listing_->files.size(); }
    uint64_t fingerprint() const override {
        return mean_.empty() ? fingerprint_ : normalized_fingerprint(fingerprint_, mean_, std_);
    }
    uint64_t bad_reads() const override { return bad_->count.load(); }

    std::shared_ptr<const SampleSource> normalized(const Normalization& n) const override {
        auto copy = std::make_shared<ImageSamples>(*this);
        copy->mean_ = n.mean;
        copy->std_ = n.std;
        copy->map_ = PixelMap::normalized(n.mean, n.std, o_.channels);
        return copy;
    }

    void read(uint32_t idx, int64_t epoch, float* features, int32_t* labels) const override {
        const ImageFile& f = listing_->files[idx];
        if (labels) *labels = f.label;
        if (features) read_features(idx, epoch, features, nullptr);
    }
    void read_timed(uint32_t idx, int64_t epoch, float* features, Stages& s) const override {
        read_features(idx, epoch, features, &s);
    }

private:
    void read_features(uint32_t idx, int64_t epoch, float* features, Stages* stages) const {
        const ImageFile& f = listing_->files[idx];
        try {
            decode(f, idx, epoch, features, stages);
        } catch (const DataError& e) {
            if (!o_.skip_bad) throw;
            // a file counts once, however often it is read (every epoch, evaluation, normalisation)
            const uint64_t bad = bad_->seen[idx].exchange(1) ? bad_->count.load() : ++bad_->count;
            if (double(bad + listing_->bad.size()) > o_.max_bad_fraction * double(count() + listing_->bad.size()))
                throw DataError(
                    std::string(e.what()) + "; " + std::to_string(bad + listing_->bad.size()) +
                    " bad files in this split, more than data.max_bad_fraction = " + number_text(o_.max_bad_fraction));
            std::fill_n(features, size_t(o_.height) * size_t(o_.width) * size_t(o_.channels), 0.0f);
        }
    }

    using Clock = std::chrono::steady_clock;
    static void lap(double* stage, Clock::time_point& t) {
        const Clock::time_point now = Clock::now();
        *stage += std::chrono::duration<double>(now - t).count();
        t = now;
    }

    void decode(const ImageFile& f, uint32_t idx, int64_t epoch, float* features, Stages* stages) const {
        Clock::time_point t;
        if (stages) t = Clock::now();
        thread_local std::vector<unsigned char> bytes;
        thread_local Pixels pixels;
        thread_local std::vector<float> scratch;
        bool flip = false;
        // The crop is drawn on the image's own size, cached or not: the same region either way.
        const CropBox box = train_ ? random_resized_crop(f.width, f.height, o_.crop, seed_, idx, epoch, &flip)
                                   : center_crop(f.width, f.height, o_.eval_resize(), o_.width, o_.height);
        if (cache_) {
            const PixelView image = cache_->image(idx);
            if (image.width == 0)
                throw DataError(f.path + ": could not be decoded when the decode cache " + cache_->path() +
                                " was built");
            const double sx = double(image.width) / f.width, sy = double(image.height) / f.height;
            resample(image, {box.x * sx, box.y * sy, box.w * sx, box.h * sy}, flip && o_.flip, o_.width, o_.height,
                     map_, features, scratch);
            if (stages) lap(&stages->transform, t);
            return;
        }
        read_prefix(f.path, kMaxFileBytes, bytes);
        if (stages) lap(&stages->read, t);
        const int shrink = jpeg_shrink_for(box.w, box.h, o_.width, o_.height);
        decode_image(bytes.data(), bytes.size(), f.path, o_.channels, shrink, o_.max_pixels, pixels);
        if (stages) lap(&stages->decode, t);
        const double sx = decoded_scale(pixels, f.width, f.height, f.path), sy = sx;
        const CropBox scaled{box.x * sx, box.y * sy, box.w * sx, box.h * sy};
        resample(pixels, scaled, flip && o_.flip, o_.width, o_.height, map_, features, scratch);
        if (stages) lap(&stages->transform, t);
    }

    std::shared_ptr<const Listing> listing_;
    std::shared_ptr<const DecodedImageCache> cache_;  // data.cache: decoded
    ImageFolderOptions o_;
    bool train_;
    uint64_t seed_;
    PixelMap map_;
    std::vector<float> mean_, std_;
    uint64_t fingerprint_ = 0;
    // Files that failed as they were decoded, each counted once; shared by the normalised copy.
    struct BadFiles {
        explicit BadFiles(size_t n) : seen(n) {}
        std::vector<std::atomic<uint8_t>> seen;
        std::atomic<uint64_t> count{0};
    };
    std::shared_ptr<BadFiles> bad_;
};

// Where a split's decode cache lives: beside it ("train" -> "train.decoded-cache"), or in
// data.cache_dir.
std::string cache_path(const std::string& split, const std::string& cache_dir) {
    fs::path p = fs::path(split).lexically_normal();
    if (p.filename().empty()) p = p.parent_path();  // "train/"
    const std::string name = p.filename().string() + ".decoded-cache";
    return cache_dir.empty() ? (p.parent_path() / name).string() : (fs::path(cache_dir) / name).string();
}

std::shared_ptr<const DecodedImageCache> open_cache(const std::string& split, const Listing& l,
                                                    const ImageFolderOptions& o, const std::string& cache_dir) {
    std::vector<CacheSource> sources;
    sources.reserve(l.files.size());
    for (const ImageFile& f : l.files) sources.push_back({f.path, f.bytes, f.mtime_ns, f.width, f.height});
    DecodedImageCache::Options co;
    co.path = cache_path(split, cache_dir);
    co.side = o.cached_side();
    co.channels = o.channels;
    co.skip_bad = o.skip_bad;
    return DecodedImageCache::open(co, sources, [&](size_t i, int shrink, Pixels& out) {
        thread_local std::vector<unsigned char> bytes;
        read_prefix(l.files[i].path, kMaxFileBytes, bytes);
        decode_image(bytes.data(), bytes.size(), l.files[i].path, o.channels, shrink, o.max_pixels, out);
    });
}

Dataset open_split(const std::string& path, const ImageFolderOptions& o, bool train, uint64_t seed,
                   const std::vector<std::string>* train_classes, const std::string& cache_dir) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) throw DataError(path + ": no such folder or list file");
    auto listing = std::make_shared<Listing>(S_ISDIR(st.st_mode) ? list_folder(path, train_classes) : list_file(path));
    check_headers(*listing, o.max_pixels);
    const size_t total = listing->files.size() + listing->bad.size();
    if (!listing->bad.empty()) {
        if (!o.skip_bad)
            throw DataError(
                listing->bad.front() +
                (listing->bad.size() > 1 ? " (and " + std::to_string(listing->bad.size() - 1) + " more)" : "") +
                "; data.on_bad_file: skip leaves bad files out");
        if (double(listing->bad.size()) > o.max_bad_fraction * double(total))
            throw DataError(path + ": " + std::to_string(listing->bad.size()) + " of " + std::to_string(total) +
                            " files are bad, more than data.max_bad_fraction = " + number_text(o.max_bad_fraction) +
                            "; the first: " + listing->bad.front());
    }
    if (listing->files.empty()) throw DataError(path + ": no readable images");
    if (listing->files.size() > UINT32_MAX) throw DataError(path + ": more than 2^32 - 1 images");
    Dataset ds;
    ds.name = path;
    ds.labels_source = path;
    ds.shape = {o.height, o.width, o.channels};
    ds.classes = int(listing->classes.size());
    ds.skipped_files = listing->bad;
    auto cache = o.cache ? open_cache(path, *listing, o, cache_dir) : nullptr;
    auto samples = std::make_shared<const ImageSamples>(listing, o, train, seed, std::move(cache));
    ds.source = std::move(samples);
    return ds;
}

Datasets load(const Options& options, const DataSource& src) {
    const auto& o = options_as<ImageFolderOptions>(options);
    if (src.config.targets) throw DataError("dataset image_folder has class labels, not float targets");
    Datasets out;
    const std::string train_path = src.path(o.train), test_path = src.path(o.test);
    const std::string cache_dir = o.cache_dir.empty() ? "" : src.path(o.cache_dir);
    out.train = open_split(train_path, o, true, src.seed, nullptr, cache_dir);
    struct stat st {};
    const bool folders = ::stat(train_path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
    if (folders != (::stat(test_path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)))
        throw DataError(test_path + ": a " + (folders ? "list file" : "folder") + ", the training split " + train_path +
                        " a " + (folders ? "folder" : "list file") +
                        ": both splits are folders (classes by name) or both list files (classes by number)");
    const std::vector<std::string> classes = folders ? class_names(train_path) : std::vector<std::string>{};
    out.test = open_split(test_path, o, false, src.seed, folders ? &classes : nullptr, cache_dir);
    return out;
}

// The split folders (or list files), every image under them included.
std::vector<std::string> inputs(const Options& opts) {
    const auto& o = options_as<ImageFolderOptions>(opts);
    return {o.train, o.test};
}

}  // namespace

extern const DataFormat kImageFolderFormat{"image_folder", ".", "", read, load, inputs};

}  // namespace mirrored
