#include "data/image_codec.h"

#include <png.h>
#include <turbojpeg.h>

#include <cmath>
#include <cstring>
#include <memory>

#include "base/error.h"

namespace mirrored {

namespace {

// One TurboJPEG decompressor per thread: loader threads decode at once, and a handle is not
// thread-safe. After an error the handle is replaced: libjpeg-turbo 2.1 can leave one in a state
// that refuses the next, valid file ("Bogus Huffman table definition").
struct JpegDecoder {
    tjhandle h = nullptr;
    ~JpegDecoder() {
        if (h) tjDestroy(h);
    }
};
thread_local JpegDecoder jpeg;

tjhandle jpeg_decoder() {
    if (!jpeg.h) jpeg.h = tjInitDecompress();
    if (!jpeg.h)
        throw DataError(std::string("libjpeg-turbo: cannot create a decompressor: ") + tjGetErrorStr2(nullptr));
    return jpeg.h;
}

// The error's text, then the handle replaced.
std::string jpeg_failed(tjhandle h) {
    std::string what = tjGetErrorStr2(h);
    tjDestroy(h);
    jpeg.h = nullptr;
    return what;
}

void check_pixels(const std::string& path, const char* what, uint64_t w, uint64_t h, uint64_t max_pixels) {
    if (w == 0 || h == 0)
        throw DataError(path + ": a " + what + " of " + std::to_string(w) + " x " + std::to_string(h) + " pixels");
    if (w * h > max_pixels)  // both below 2^32: no overflow
        throw DataError(path + ": a " + what + " of " + std::to_string(w) + " x " + std::to_string(h) + " = " +
                        std::to_string(w * h) + " pixels, over the limit of " + std::to_string(max_pixels) +
                        " (data.max_pixels): refused before decoding (a decompression bomb, or raise the limit)");
}

ImageHeader jpeg_header(const unsigned char* data, size_t size, const std::string& path, uint64_t max_pixels) {
    tjhandle h = jpeg_decoder();
    int w = 0, ht = 0, subsamp = 0, colorspace = 0;
    if (size > ULONG_MAX ||
        tjDecompressHeader3(h, data, static_cast<unsigned long>(size), &w, &ht, &subsamp, &colorspace) != 0)
        throw DataError(path + ": a corrupt or truncated JPEG header (" + jpeg_failed(h) + ")");
    check_pixels(path, "JPEG", uint64_t(w), uint64_t(ht), max_pixels);
    if (colorspace == TJCS_CMYK || colorspace == TJCS_YCCK)  // libjpeg-turbo 2.1 cannot turn these into RGB
        throw DataError(path + ": a CMYK JPEG (print colours): convert it to RGB (e.g. PIL's convert('RGB'))");
    return {ImageType::jpeg, w, ht};
}

struct PngImage {
    png_image image;
    PngImage() {
        std::memset(&image, 0, sizeof image);
        image.version = PNG_IMAGE_VERSION;
    }
    ~PngImage() { png_image_free(&image); }
};

void png_begin(PngImage& p, const unsigned char* data, size_t size, const std::string& path, uint64_t max_pixels) {
    if (!png_image_begin_read_from_memory(&p.image, data, size))
        throw DataError(path + ": a corrupt or truncated PNG header (" + p.image.message + ")");
    check_pixels(path, "PNG", p.image.width, p.image.height, max_pixels);
}

void decode_jpeg(const unsigned char* data, size_t size, const std::string& path, int channels, int shrink,
                 uint64_t max_pixels, Pixels& out) {
    const ImageHeader head = jpeg_header(data, size, path, max_pixels);
    const tjscalingfactor sf{1, shrink};
    const int w = TJSCALED(head.width, sf), h = TJSCALED(head.height, sf);
    out.width = w;
    out.height = h;
    out.shrink = shrink;
    out.channels = channels;
    out.data.resize(size_t(w) * size_t(h) * size_t(channels));
    tjhandle t = jpeg_decoder();
    // Stop on a warning too: a truncated or corrupt stream decodes "successfully" into grey.
    if (tjDecompress2(t, data, static_cast<unsigned long>(size), out.data.data(), w, 0, h,
                      channels == 1 ? TJPF_GRAY : TJPF_RGB, TJFLAG_STOPONWARNING | TJFLAG_LIMITSCANS) != 0)
        throw DataError(path + ": a corrupt or truncated JPEG (" + jpeg_failed(t) + ")");
}

void decode_png(const unsigned char* data, size_t size, const std::string& path, int channels, uint64_t max_pixels,
                Pixels& out) {
    PngImage p;
    png_begin(p, data, size, path, max_pixels);
    const bool alpha = p.image.format & PNG_FORMAT_FLAG_ALPHA;
    const bool colour = p.image.format & PNG_FORMAT_FLAG_COLOR;
    // 16-bit samples are sRGB-encoded, as PIL reads them (libpng would take them as linear light)
    p.image.flags |= PNG_IMAGE_FLAG_16BIT_sRGB;
    // Read colour as RGB(A) and grey as G(A): alpha is dropped, not composited onto black (which
    // would darken edges PIL's convert leaves as they are), and grey from colour is ITU-R 601 luma
    // as PIL's convert('L') and a JPEG's Y plane (libpng's own is Rec. 709 in linear light).
    const int read_channels = (colour ? 3 : 1) + (alpha ? 1 : 0);
    p.image.format = colour ? (alpha ? PNG_FORMAT_RGBA : PNG_FORMAT_RGB) : (alpha ? PNG_FORMAT_GA : PNG_FORMAT_GRAY);
    const int w = int(p.image.width), h = int(p.image.height);
    out.width = w;
    out.height = h;
    out.shrink = 1;
    out.channels = channels;
    thread_local std::vector<unsigned char> raw;
    raw.resize(size_t(w) * size_t(h) * size_t(read_channels));
    if (!png_image_finish_read(&p.image, nullptr, raw.data(), 0, nullptr))
        throw DataError(path + ": a corrupt or truncated PNG (" + p.image.message + ")");
    const size_t pixels = size_t(w) * size_t(h), in = size_t(read_channels);
    out.data.resize(pixels * size_t(channels));
    unsigned char* d = out.data.data();
    const unsigned char* r = raw.data();
    for (size_t i = 0; i < pixels; ++i, r += in) {
        if (channels == 3) {
            for (int c = 0; c < 3; ++c) d[i * 3 + size_t(c)] = colour ? r[c] : r[0];
        } else {
            d[i] = colour ? static_cast<unsigned char>((19595u * r[0] + 38470u * r[1] + 7471u * r[2] + 0x8000u) >> 16)
                          : r[0];
        }
    }
}

}  // namespace

ImageType image_type(const unsigned char* data, size_t size) {
    if (size >= 3 && data[0] == 0xFF && data[1] == 0xD8 && data[2] == 0xFF) return ImageType::jpeg;
    if (size >= 8 && std::memcmp(data, "\x89PNG\r\n\x1a\n", 8) == 0) return ImageType::png;
    return ImageType::unknown;
}

ImageHeader read_image_header(const unsigned char* data, size_t size, const std::string& path, uint64_t max_pixels) {
    switch (image_type(data, size)) {
        case ImageType::jpeg:
            return jpeg_header(data, size, path, max_pixels);
        case ImageType::png: {
            PngImage p;
            png_begin(p, data, size, path, max_pixels);
            return {ImageType::png, int(p.image.width), int(p.image.height)};
        }
        default:
            break;
    }
    throw DataError(path + ": neither a JPEG nor a PNG image (by its first bytes)");
}

void decode_image(const unsigned char* data, size_t size, const std::string& path, int channels, int shrink,
                  uint64_t max_pixels, Pixels& out) {
    if (channels != 1 && channels != 3) throw DataError(path + ": images decode to 1 or 3 channels");
    switch (image_type(data, size)) {
        case ImageType::jpeg:
            return decode_jpeg(data, size, path, channels, shrink, max_pixels, out);
        case ImageType::png:
            return decode_png(data, size, path, channels, max_pixels, out);
        default:
            break;
    }
    throw DataError(path + ": neither a JPEG nor a PNG image (by its first bytes)");
}

int jpeg_shrink_for(double w, double h, int min_w, int min_h) {
    int shrink = 8;
    while (shrink > 1 && (std::floor(w / shrink) < min_w || std::floor(h / shrink) < min_h)) shrink /= 2;
    return shrink;
}

double decoded_scale(const Pixels& pixels, int width, int height, const std::string& path) {
    const int k = pixels.shrink;
    if (pixels.width == (width + k - 1) / k && pixels.height == (height + k - 1) / k) return 1.0 / k;
    throw DataError(path + ": the image changed since the data set was opened (" + std::to_string(pixels.width) +
                    " x " + std::to_string(pixels.height) + " pixels now, " + std::to_string(width) + " x " +
                    std::to_string(height) + " before" + (k > 1 ? ", decoded at 1/" + std::to_string(k) : "") + ")");
}

}  // namespace mirrored
