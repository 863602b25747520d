// The decode-once cache of an image-folder split (data.cache: decoded): every image decoded once,
// its shorter side resized to data.cache_side (never enlarged), and kept as uint8 pixels in one
// file beside the data that the loader memory-maps. A sample then costs its crop, resize, flip and
// normalisation only - no read of a compressed file, no decode - and the file's pages are the
// kernel's to keep or drop, so a split larger than memory still trains.
//
// The file: a header (magic, version, channels, side, the key, the count), one index entry per
// image (offset, width, height; 0 x 0 for a file that could not be decoded), then the pixels. Its
// key is a fingerprint of what it was built from - every file's path, size, modification time and
// header size, the side and the channels - so a changed, added or removed image, or another side,
// rebuilds it. Everything read from the file is checked against its size before use: a cache
// cut short, damaged or for other files is rebuilt, never trusted. A file at the cache's path that
// is not a cache is never replaced (the user named it, or another program wrote it).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/io.h"
#include "data/image_codec.h"

namespace mirrored {

// One image of the split, as its header was read when the split was opened.
struct CacheSource {
    std::string path;
    uint64_t bytes = 0;
    int64_t mtime_ns = 0;
    int width = 0, height = 0;
};

// The size an image is kept at: its shorter side `side` (the longer scaled to match, rounded),
// or as it is where its shorter side is `side` or less.
void cached_size(int width, int height, int side, int* out_w, int* out_h);

class DecodedImageCache {
public:
    // Decodes source i into `out`, as small as `shrink` (1, 2, 4 or 8) allows (a JPEG in its DCT);
    // throws DataError "<path>: <what is wrong>" for a file that cannot be decoded.
    using Decode = std::function<void(size_t i, int shrink, Pixels& out)>;
    struct Options {
        std::string path;  // the cache file
        int side = 0, channels = 3;
        bool skip_bad = false;  // a file that cannot be decoded: stop (DataError), or keep it as bad
    };

    // The cache at o.path when it was built from exactly these sources; else builds it (all cores,
    // written atomically) and maps it. `built` says which. Throws DataError naming o.path when the
    // path holds something else, or the cache cannot be written (and data.cache_dir puts it
    // elsewhere), or a file cannot be decoded and o.skip_bad is false.
    static std::shared_ptr<const DecodedImageCache> open(const Options& o, const std::vector<CacheSource>& sources,
                                                         const Decode& decode, bool* built = nullptr);

    size_t count() const { return entries_.size(); }
    // Image i's pixels (width 0 for a file that could not be decoded when the cache was built).
    PixelView image(size_t i) const;
    const std::string& path() const { return file_->path(); }

private:
    struct Entry {
        uint64_t offset = 0;
        uint32_t width = 0, height = 0;
    };
    // The cache at o.path when its header and every index entry are the ones `layout` expects (a
    // bad image's entry: 0 x 0); null otherwise, so that it is built again.
    static std::shared_ptr<const DecodedImageCache> map(const Options& o, uint64_t key,
                                                        const std::vector<Entry>& layout);
    std::unique_ptr<MappedFile> file_;
    int channels_ = 0;
    std::vector<Entry> entries_;
};

}  // namespace mirrored
