// JPEG (libjpeg-turbo's TurboJPEG API) and PNG (libpng's simplified API) decoding from memory, for
// the image-folder data sets. Both are checked before any pixel is allocated: the header must say
// what the file is, and width x height must be within a pixel limit (a 100,000 x 100,000 header is
// a decompression bomb, not a photograph). Errors are DataError "<path>: <what is wrong>".
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace mirrored {

enum class ImageType { unknown, jpeg, png };

// By magic bytes, not by name.
ImageType image_type(const unsigned char* data, size_t size);

struct ImageHeader {
    ImageType type = ImageType::unknown;
    int width = 0, height = 0;
};

// PIL's limit (Image.MAX_IMAGE_PIXELS): about 9,459 x 9,459.
constexpr uint64_t kDefaultMaxPixels = 89478485;

// The type and size from the first bytes of a file (a JPEG's size is in its frame header, after
// any EXIF data: give at least what precedes it). Throws DataError when the bytes are no JPEG or
// PNG, the header is corrupt or cut short, or width x height exceeds max_pixels.
ImageHeader read_image_header(const unsigned char* data, size_t size, const std::string& path, uint64_t max_pixels);

// Pixels held elsewhere (a decoded image, the decode cache's mapped file): rows of width x
// channels bytes, channels 1 (grey) or 3 (RGB).
struct PixelView {
    int width = 0, height = 0, channels = 0;
    const unsigned char* data = nullptr;
};

// Decoded pixels, as a PixelView describes them.
struct Pixels {
    int width = 0, height = 0, channels = 0;
    int shrink = 1;  // what the decoder divided the image's size by: 1 for a PNG
    std::vector<unsigned char> data;
    operator PixelView() const { return {width, height, channels, data.data()}; }
};

// Decodes a whole file into `channels` (1 or 3): grey, RGB and RGBA files all convert (alpha is
// dropped, as PIL's convert does; grey from colour by ITU-R 601 luma). A JPEG may be decoded at
// 1/2, 1/4 or 1/8 of its size in its DCT - much faster - when `shrink` (1, 2, 4 or 8) asks so;
// out.width and out.height say what came out. A warning from the decoder (a truncated or
// corrupt stream that libjpeg-turbo would fill with grey) is an error here: the file is bad.
// `out` keeps its capacity between calls.
void decode_image(const unsigned char* data, size_t size, const std::string& path, int channels, int shrink,
                  uint64_t max_pixels, Pixels& out);

// The largest of 1, 2, 4, 8 that keeps a w x h region at least min_w x min_h once shrunk.
int jpeg_shrink_for(double w, double h, int min_w, int min_h);

// How the decoded pixels' coordinates map to the width x height image the data set was opened
// with: 1 / pixels.shrink (source pixel x becomes x / shrink; libjpeg's last pixel may be
// partial). Pixels of any other size than that image's, so shrunk, mean the file is not that
// image any more: a DataError naming `path`.
double decoded_scale(const Pixels& pixels, int width, int height, const std::string& path);

}  // namespace mirrored
