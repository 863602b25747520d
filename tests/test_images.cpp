// Image-folder data sets: JPEG/PNG decoding against the encoder's pixels, the resampler against
// PIL, the listing against torchvision's ImageFolder, the random-resized crop's contract, and every
// kind of bad input the format documents (docs/RELIABILITY.md) - each with the file it names.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <sys/file.h>
#include <png.h>
#include <sys/stat.h>
#include <turbojpeg.h>
#include <unistd.h>
#include <zlib.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "data/datasets.h"
#include "data/image_codec.h"
#include "data/image_transform.h"
#include "mirrored/config.h"
#include "mirrored/trainer.h"
#include "tests/helpers.h"
#include "tests/run_folder.h"

using namespace mirrored;
using namespace mirrored::test;
namespace fs = std::filesystem;

namespace {

std::vector<unsigned char> random_pixels(Rng& rng, int w, int h, int c) {
    std::vector<unsigned char> p(size_t(w) * size_t(h) * size_t(c));
    for (auto& v : p) v = static_cast<unsigned char>(rng.integer(0, 255));
    return p;
}

// RGB noise, each side in [lo, hi] pixels.
Pixels random_image(Rng& rng, int lo, int hi) {
    Pixels p;
    p.width = rng.integer(lo, hi);
    p.height = rng.integer(lo, hi);
    p.channels = 3;
    p.data = random_pixels(rng, p.width, p.height, 3);
    return p;
}

std::vector<unsigned char> encode_jpeg(const std::vector<unsigned char>& pixels, int w, int h, int c,
                                       int quality = 95) {
    tjhandle t = tjInitCompress();
    REQUIRE(t);
    unsigned char* buf = nullptr;
    unsigned long size = 0;
    const int rc = tjCompress2(t, pixels.data(), w, 0, h, c == 1 ? TJPF_GRAY : TJPF_RGB, &buf, &size,
                               c == 1 ? TJSAMP_GRAY : TJSAMP_444, quality, 0);
    REQUIRE(rc == 0);
    std::vector<unsigned char> out(buf, buf + size);
    tjFree(buf);
    tjDestroy(t);
    return out;
}

std::vector<unsigned char> encode_png(const std::vector<unsigned char>& pixels, int w, int h, int c) {
    png_image image;
    std::memset(&image, 0, sizeof image);
    image.version = PNG_IMAGE_VERSION;
    image.width = png_uint_32(w);
    image.height = png_uint_32(h);
    image.format = c == 1 ? PNG_FORMAT_GRAY : c == 2 ? PNG_FORMAT_GA : c == 3 ? PNG_FORMAT_RGB : PNG_FORMAT_RGBA;
    png_alloc_size_t size = 0;
    REQUIRE(png_image_write_to_memory(&image, nullptr, &size, 0, pixels.data(), 0, nullptr));
    std::vector<unsigned char> out(size);
    REQUIRE(png_image_write_to_memory(&image, out.data(), &size, 0, pixels.data(), 0, nullptr));
    out.resize(size);
    return out;
}

void write_bytes(const std::string& path, const std::vector<unsigned char>& bytes) {
    fs::create_directories(fs::path(path).parent_path());
    std::ofstream(path, std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
}

// A solid grey PNG whose level says which file it is.
void write_marked(const std::string& path, int level, int w = 12, int h = 10) {
    write_bytes(path, encode_png(std::vector<unsigned char>(size_t(w) * size_t(h), static_cast<unsigned char>(level)),
                                 w, h, 1));
}

DataConfig folder_config(const std::string& root, Fields keys = {}) {
    keys.insert(keys.begin(), {{"train", root + "/train"}, {"test", root + "/val"}});
    DataConfig c = make_data_config("image_folder", keys);
    c.normalize = DataConfig::Normalize::none;
    return c;
}

// The first output value of every sample, in index order (test split: no augmentation).
std::vector<float> first_values(const Dataset& d) {
    std::vector<float> x(d.feature_size()), out;
    for (size_t i = 0; i < d.count(); ++i) {
        read_sample(d, i, 0, x.data(), nullptr);
        out.push_back(x[0]);
    }
    return out;
}

std::string error_of(const std::function<void()>& f) {
    try {
        f();
    } catch (const DataError& e) {
        return e.what();
    }
    return "(no DataError)";
}

}  // namespace

TEST_CASE("png: grey, grey+alpha, RGB and RGBA decode losslessly to 1 or 3 channels; alpha is dropped") {
    Rng rng(base_seed());
    const int w = rng.integer(1, 40), h = rng.integer(1, 40);
    CAPTURE(w);
    CAPTURE(h);
    const auto rgba = random_pixels(rng, w, h, 4);
    std::vector<unsigned char> rgb, grey;
    for (size_t i = 0; i < size_t(w) * size_t(h); ++i) {
        for (int c = 0; c < 3; ++c) rgb.push_back(rgba[i * 4 + size_t(c)]);
        grey.push_back(rgba[i * 4]);
    }
    Pixels out;
    decode_image(encode_png(rgb, w, h, 3).data(), encode_png(rgb, w, h, 3).size(), "rgb.png", 3, 1, kDefaultMaxPixels,
                 out);
    CHECK(out.width == w);
    CHECK(out.height == h);
    CHECK(out.data == rgb);
    const auto rgba_png = encode_png(rgba, w, h, 4);
    decode_image(rgba_png.data(), rgba_png.size(), "rgba.png", 3, 1, kDefaultMaxPixels, out);
    CHECK(out.data == rgb);  // the colour kept as it is, not composited onto black
    // colour to grey is ITU-R 601 luma, as PIL's convert('L') and a JPEG's Y plane: red is 76
    const std::vector<unsigned char> primaries{255, 0, 0, 0, 255, 0, 0, 0, 255};
    const auto primaries_png = encode_png(primaries, 3, 1, 3);
    decode_image(primaries_png.data(), primaries_png.size(), "rgb.png", 1, 1, kDefaultMaxPixels, out);
    CHECK(out.data == std::vector<unsigned char>{76, 150, 29});
    const auto grey_png = encode_png(grey, w, h, 1);
    decode_image(grey_png.data(), grey_png.size(), "grey.png", 1, 1, kDefaultMaxPixels, out);
    CHECK(out.data == grey);
    decode_image(grey_png.data(), grey_png.size(), "grey.png", 3, 1, kDefaultMaxPixels, out);
    REQUIRE(out.data.size() == grey.size() * 3);
    for (size_t i = 0; i < grey.size(); ++i) CHECK(out.data[i * 3 + 1] == grey[i]);
    const ImageHeader head = read_image_header(rgba_png.data(), rgba_png.size(), "x.png", kDefaultMaxPixels);
    CHECK(head.type == ImageType::png);
    CHECK(head.width == w);
    CHECK(head.height == h);
}

TEST_CASE("jpeg: decodes near the encoder's pixels at full size and shrunk 2x, 4x, 8x in the DCT") {
    Rng rng(base_seed());
    const int w = 64 + rng.integer(0, 40), h = 48 + rng.integer(0, 40);
    // Smooth content (JPEG's own kind): a gradient, so quality 95 is near-lossless.
    std::vector<unsigned char> rgb(size_t(w) * size_t(h) * 3);
    for (int y = 0; y < h; ++y)
        for (int x = 0; x < w; ++x)
            for (int c = 0; c < 3; ++c)
                rgb[(size_t(y) * size_t(w) + size_t(x)) * 3 + size_t(c)] =
                    static_cast<unsigned char>((x * 3 + y * 2 + c * 40) % 256 / 2);
    const auto jpg = encode_jpeg(rgb, w, h, 3);
    Pixels out;
    decode_image(jpg.data(), jpg.size(), "a.jpg", 3, 1, kDefaultMaxPixels, out);
    REQUIRE(out.data.size() == rgb.size());
    double diff = 0;
    for (size_t i = 0; i < rgb.size(); ++i) diff += std::abs(int(out.data[i]) - int(rgb[i]));
    CHECK(diff / double(rgb.size()) < 2.0);  // mean absolute error in levels at quality 95
    for (int shrink : {2, 4, 8}) {
        decode_image(jpg.data(), jpg.size(), "a.jpg", 3, shrink, kDefaultMaxPixels, out);
        CHECK(out.width == (w + shrink - 1) / shrink);
        CHECK(out.height == (h + shrink - 1) / shrink);
    }
    CHECK(jpeg_shrink_for(400, 300, 224, 224) == 1);
    CHECK(jpeg_shrink_for(1000, 900, 224, 224) == 4);
    CHECK(jpeg_shrink_for(4000, 3000, 224, 224) == 8);
}

TEST_CASE(
    "images: truncated, corrupt and non-image bytes are DataErrors naming the file; bombs refused from the "
    "header") {
    Rng rng(base_seed());
    const auto rgb = random_pixels(rng, 40, 30, 3);
    const auto jpg = encode_jpeg(rgb, 40, 30, 3), png = encode_png(rgb, 40, 30, 3);
    Pixels out;
    for (const auto* file : {&jpg, &png}) {
        const std::string name = file == &jpg ? "cut.jpg" : "cut.png";
        for (size_t keep :
             {size_t(2), size_t(20), file->size() / 2, file->size() - 24}) {  // PNG: its IEND chunk is 12 bytes
            CAPTURE(keep);
            const std::string e =
                error_of([&] { decode_image(file->data(), keep, name, 3, 1, kDefaultMaxPixels, out); });
            CHECK(e.find(name + ": ") == 0);
        }
    }
    // a CMYK JPEG (libjpeg-turbo cannot make RGB of it) is refused from its header, by name
    {
        tjhandle t = tjInitCompress();
        REQUIRE(t);
        unsigned char* buf = nullptr;
        unsigned long size = 0;
        const auto cmyk = random_pixels(rng, 16, 8, 4);
        REQUIRE(tjCompress2(t, cmyk.data(), 16, 0, 8, TJPF_CMYK, &buf, &size, TJSAMP_444, 90, 0) == 0);
        CHECK(error_of([&] { read_image_header(buf, size, "print.jpg", kDefaultMaxPixels); }) ==
              "print.jpg: a CMYK JPEG (print colours): convert it to RGB (e.g. PIL's convert('RGB'))");
        tjFree(buf);
        tjDestroy(t);
    }
    // a decoder that failed decodes the next, valid file (libjpeg-turbo's handle is replaced)
    REQUIRE_NOTHROW(decode_image(jpg.data(), jpg.size(), "whole.jpg", 3, 1, kDefaultMaxPixels, out));
    CHECK(out.width == 40);
    const std::string text = "<html>not an image</html>";
    CHECK(error_of([&] {
              decode_image(reinterpret_cast<const unsigned char*>(text.data()), text.size(), "page.jpg", 3, 1,
                           kDefaultMaxPixels, out);
          }) == "page.jpg: neither a JPEG nor a PNG image (by its first bytes)");
    // A PNG whose IHDR claims 100,000 x 100,000 pixels (CRC intact): refused before any allocation.
    auto bomb = png;
    auto put32 = [](unsigned char* p, uint32_t v) {
        for (int i = 0; i < 4; ++i) p[i] = static_cast<unsigned char>(v >> (24 - 8 * i));
    };
    put32(bomb.data() + 16, 100000);
    put32(bomb.data() + 20, 100000);
    put32(bomb.data() + 29, uint32_t(crc32(crc32(0, nullptr, 0), bomb.data() + 12, 17)));
    std::string e = error_of([&] { read_image_header(bomb.data(), bomb.size(), "bomb.png", kDefaultMaxPixels); });
    CHECK(e.find("bomb.png: a PNG of 100000 x 100000 = 10000000000 pixels, over the limit of 89478485") == 0);
    // A JPEG whose frame header claims 60,000 x 60,000.
    auto jbomb = jpg;
    for (size_t i = 2; i + 8 < jbomb.size(); ++i)
        if (jbomb[i] == 0xFF && jbomb[i + 1] == 0xC0) {  // SOF0: length, precision, height, width
            jbomb[i + 5] = 0xEA, jbomb[i + 6] = 0x60, jbomb[i + 7] = 0xEA, jbomb[i + 8] = 0x60;
            break;
        }
    e = error_of([&] { decode_image(jbomb.data(), jbomb.size(), "bomb.jpg", 3, 1, kDefaultMaxPixels, out); });
    CHECK(e.find("bomb.jpg: a JPEG of 60000 x 60000 = 3600000000 pixels, over the limit") == 0);
}

TEST_CASE("resample: the whole image at its own size is the image; flipped, mirrored; constant stays constant") {
    Rng rng(base_seed());
    Pixels p = random_image(rng, 2, 30);
    const PixelMap map = PixelMap::normalized({}, {}, 3);
    std::vector<float> out(p.data.size()), flipped(p.data.size()), scratch;
    resample(p, {0, 0, double(p.width), double(p.height)}, false, p.width, p.height, map, out.data(), scratch);
    resample(p, {0, 0, double(p.width), double(p.height)}, true, p.width, p.height, map, flipped.data(), scratch);
    for (int y = 0; y < p.height; ++y)
        for (int x = 0; x < p.width; ++x)
            for (int c = 0; c < 3; ++c) {
                const size_t at = (size_t(y) * size_t(p.width) + size_t(x)) * 3 + size_t(c);
                const size_t mirror = (size_t(y) * size_t(p.width) + size_t(p.width - 1 - x)) * 3 + size_t(c);
                CHECK(out[at] == doctest::Approx(p.data[at] / 255.0).epsilon(1e-6));
                CHECK(flipped[mirror] == out[at]);
            }
    std::fill(p.data.begin(), p.data.end(), 77);
    std::vector<float> small(5 * 4 * 3);
    resample(p, {0.5, 0.25, p.width - 1.0, p.height - 0.5}, false, 5, 4,
             PixelMap::normalized({0.1f, 0.2f, 0.3f}, {0.5f, 1, 2}, 3), small.data(), scratch);
    for (size_t i = 0; i < small.size(); ++i) {
        const float mean[3] = {0.1f, 0.2f, 0.3f}, sd[3] = {0.5f, 1, 2};
        CHECK(small[i] == doctest::Approx((77 / 255.0 - mean[i % 3]) / sd[i % 3]).epsilon(1e-5));
    }
}

TEST_CASE("resample: equal to PIL's antialiased bilinear resize of a box, within one level") {
    if (std::system("/usr/bin/python3 -c 'import PIL' 2>/dev/null") != 0) {
        mark_skipped("PIL is not installed (Debian and Ubuntu: python3-pil): the resampler not compared");
        return;
    }
    TempDir dir;
    Rng rng(base_seed());
    const Pixels p = random_image(rng, 20, 90);
    write_bytes(dir / "in.png", encode_png(p.data, p.width, p.height, 3));
    struct Case {
        CropBox box;
        int ow, oh;
    };
    std::vector<Case> cases;
    for (int i = 0; i < 6; ++i) {
        const double w = rng.integer(4, p.width), h = rng.integer(4, p.height);
        const double x = rng.integer(0, int(p.width - w)), y = rng.integer(0, int(p.height - h));
        cases.push_back({{x, y, w, h}, rng.integer(3, 40), rng.integer(3, 40)});  // down and up
    }
    std::string script = "from PIL import Image\nim = Image.open('" + (dir / "in.png") + "')\n";
    for (size_t i = 0; i < cases.size(); ++i) {
        const Case& c = cases[i];
        script += "open('" + (dir / ("out" + std::to_string(i))) + "', 'wb').write(im.resize((" + std::to_string(c.ow) +
                  ", " + std::to_string(c.oh) + "), Image.BILINEAR, box=(" + std::to_string(c.box.x) + ", " +
                  std::to_string(c.box.y) + ", " + std::to_string(c.box.x + c.box.w) + ", " +
                  std::to_string(c.box.y + c.box.h) + ")).tobytes())\n";
    }
    std::ofstream(dir / "ref.py") << script;
    REQUIRE(std::system(("/usr/bin/python3 " + (dir / "ref.py")).c_str()) == 0);
    std::vector<float> out, scratch;
    for (size_t i = 0; i < cases.size(); ++i) {
        const Case& c = cases[i];
        CAPTURE(i);
        out.resize(size_t(c.ow) * size_t(c.oh) * 3);
        resample(p, c.box, false, c.ow, c.oh, PixelMap::normalized({}, {}, 3), out.data(), scratch);
        const std::string ref = read_text(dir / ("out" + std::to_string(i)));
        REQUIRE(ref.size() == out.size());
        double worst = 0;
        for (size_t k = 0; k < out.size(); ++k)
            worst = std::max(worst, std::abs(out[k] * 255.0 - double(static_cast<unsigned char>(ref[k]))));
        CHECK(worst <= 1.001);  // PIL rounds its fixed-point result to a byte; ours is a float
    }
}

TEST_CASE("random-resized crop: a function of (seed, index, epoch), inside the image, area and ratio in range") {
    Rng rng(base_seed());
    const RandomCropOptions o;
    int fallbacks = 0, flips = 0;
    for (int i = 0; i < 400; ++i) {
        const int w = rng.integer(1, 600), h = rng.integer(1, 600);
        const uint64_t seed = base_seed() + uint64_t(i);
        bool flip = false, again = false;
        const CropBox b = random_resized_crop(w, h, o, seed, uint32_t(i), 3, &flip);
        const CropBox c = random_resized_crop(w, h, o, seed, uint32_t(i), 3, &again);
        CHECK(b.x == c.x);
        CHECK(b.w == c.w);
        CHECK(flip == again);
        flips += flip;
        REQUIRE(b.x >= 0);
        REQUIRE(b.y >= 0);
        REQUIRE(b.x + b.w <= w);
        REQUIRE(b.y + b.h <= h);
        REQUIRE(b.w >= 1);
        REQUIRE(b.h >= 1);
        const double area = b.w * b.h / (double(w) * h), ratio = b.w / b.h;
        // integer rounding of a small crop moves its area and ratio: judge the large ones
        if (b.w >= 30 && b.h >= 30 && !(b.w == w || b.h == h)) {
            CHECK(area > 0.08 * 0.9);
            CHECK(ratio > 0.75 * 0.9);
            CHECK(ratio < 4.0 / 3.0 * 1.1);
        }
        if (b.w == w || b.h == h) ++fallbacks;
    }
    CHECK(flips > 120);
    CHECK(flips < 280);
    CHECK(fallbacks < 400);
    // another epoch, another crop
    int moved = 0;
    for (uint32_t i = 0; i < 50; ++i) {
        const CropBox a = random_resized_crop(300, 200, o, 9, i, 0, nullptr),
                      b = random_resized_crop(300, 200, o, 9, i, 1, nullptr);
        moved += a.x != b.x || a.w != b.w;
    }
    CHECK(moved > 40);
    // evaluation: torchvision's Resize(256) then CenterCrop(224) of a 500 x 375 image
    const CropBox e = center_crop(500, 375, 256, 224, 224);
    CHECK(e.w == doctest::Approx(224 * 500.0 / 341));
    CHECK(e.h == doctest::Approx(224 * 375.0 / 256));
    CHECK(e.x == doctest::Approx(58 * 500.0 / 341));  // Python's round(58.5) = 58, halves to even
}

TEST_CASE("image_folder: classes by name, files in torchvision's order; test classes matched by name") {
    TempDir dir;
    const std::string root = dir.path().string();
    // nested folders whose names sort differently as paths and as a walk ("a-x" < "a/b")
    const std::vector<std::string> train_files = {"cat/2.png",  "cat/10.PNG", "cat/a/b/1.png", "cat/a-x/0.png",
                                                  "cat/.h.png", "dog/z.jpg",  "dog/b.png",     "ant/q.png"};
    int level = 10;
    for (const std::string& f : train_files) {
        if (f.size() > 4 && f.compare(f.size() - 4, 4, ".jpg") == 0) {
            const std::vector<unsigned char> px(12 * 10, static_cast<unsigned char>(level));
            write_bytes(root + "/train/" + f, encode_jpeg(px, 12, 10, 1, 100));
        } else {
            write_marked(root + "/train/" + f, level);
        }
        level += 20;
    }
    std::ofstream(root + "/train/cat/README.txt") << "not an image: left out, as torchvision does";
    write_marked(root + "/val/dog/x.png", 200);
    write_marked(root + "/val/ant/y.png", 220);
    DataConfig c = folder_config(root, {{"size", "8"}, {"channels", "1"}});
    const Datasets d = load_datasets(c, "", 1);
    CHECK(d.train.classes == 3);
    CHECK(d.train.shape == std::vector<int>{8, 8, 1});
    REQUIRE(d.train.count() == train_files.size());
    REQUIRE(d.test.count() == 2);
    const std::vector<float> test_values = first_values(d.test);
    int32_t label = -1;
    read_sample(d.test, 0, 0, nullptr, &label);
    CHECK(label == 0);  // ant
    CHECK(test_values[0] * 255 == doctest::Approx(220).epsilon(1e-4));
    read_sample(d.test, 1, 0, nullptr, &label);
    CHECK(label == 2);  // dog, numbered as in the training split
    if (std::system("/usr/bin/python3 -c 'import torchvision' 2>/dev/null") != 0) {
        mark_skipped("torchvision is not installed (Debian and Ubuntu: python3-torchvision): order not compared");
        return;
    }
    const std::string listing = dir / "listing.txt";
    const std::string cmd = "/usr/bin/python3 -c \"import torchvision; d = torchvision.datasets.ImageFolder('" + root +
                            "/train'); print('\\n'.join('%s %d' % s for s in d.samples))\" > " + listing;
    REQUIRE(std::system(cmd.c_str()) == 0);
    std::ifstream in(listing);
    std::string path;
    int want_label = 0;
    for (size_t i = 0; in >> path >> want_label; ++i) {
        CAPTURE(path);
        REQUIRE(i < d.train.count());
        read_sample(d.train, i, 0, nullptr, &label);
        CHECK(label == want_label);
        // each file's grey level says which file it is
        const size_t at = size_t(std::find(train_files.begin(), train_files.end(), path.substr(root.size() + 7)) -
                                 train_files.begin());
        REQUIRE(at < train_files.size());
        std::vector<float> x(d.train.feature_size());
        read_sample(d.train, i, 0, x.data(), nullptr);
        CHECK(x[0] * 255 == doctest::Approx(10 + 20 * double(at)).epsilon(0.02));
    }
}

TEST_CASE("image_folder: a sample is a function of (seed, epoch, index), whatever thread reads it") {
    TempDir dir;
    Rng rng(base_seed());
    const std::string root = dir.path().string();
    for (int i = 0; i < 6; ++i)
        for (const char* split : {"train", "val"}) {
            const int w = rng.integer(20, 60), h = rng.integer(20, 60);
            write_bytes(root + "/" + split + "/c" + std::to_string(i % 2) + "/" + std::to_string(i) + ".jpg",
                        encode_jpeg(random_pixels(rng, w, h, 3), w, h, 3));
        }
    DataConfig c = folder_config(root, {{"size", "[12, 16]"}});
    c.normalize = DataConfig::Normalize::auto_compute;
    const Datasets d = load_datasets(c, "", 5);
    REQUIRE(d.normalization.mean.size() == 3);
    const size_t fs = d.train.feature_size();
    CHECK(fs == 12 * 16 * 3);
    std::vector<float> a(fs), b(fs), e1(fs);
    read_sample(d.train, 3, 0, a.data(), nullptr);
    std::thread([&] { read_sample(d.train, 3, 0, b.data(), nullptr); }).join();
    CHECK(a == b);
    read_sample(d.train, 3, 1, e1.data(), nullptr);
    CHECK(a != e1);
    const Datasets again = load_datasets(c, "", 5);
    CHECK(fingerprint(again.train) == fingerprint(d.train));
    DataConfig raw = c;
    raw.normalize = DataConfig::Normalize::none;
    CHECK(fingerprint(load_datasets(raw, "", 6).train) == fingerprint(load_datasets(raw, "", 5).train));  // same files
    CHECK(fingerprint(load_datasets(raw, "", 5).train) != fingerprint(d.train));  // not normalised
    DataConfig other = c;
    other.format =
        make_data_config("image_folder", {{"train", root + "/train"}, {"test", root + "/val"}, {"size", "12"}}).format;
    CHECK(fingerprint(load_datasets(other, "", 5).train) != fingerprint(d.train));
}

namespace {

// A smooth RGB image (a gradient with a little noise), as photographs are at the scale of a
// resize: a resized copy then resized again stays close to one resized once.
std::vector<unsigned char> smooth_pixels(Rng& rng, int w, int h) {
    std::vector<unsigned char> p(size_t(w) * size_t(h) * 3);
    const int gx = rng.integer(1, 3), gy = rng.integer(1, 3);
    for (int y = 0; y < h; ++y)
        for (int x = 0; x < w; ++x)
            for (int c = 0; c < 3; ++c)
                p[(size_t(y) * size_t(w) + size_t(x)) * 3 + size_t(c)] =
                    static_cast<unsigned char>(std::clamp(40 * c + gx * x + gy * y + rng.integer(-3, 3), 0, 255));
    return p;
}

// Every sample of a split (epochs 0 and 1), concatenated.
std::vector<float> all_samples(const Dataset& d) {
    std::vector<float> out(d.feature_size() * d.count() * 2);
    for (int64_t epoch = 0; epoch < 2; ++epoch)
        for (size_t i = 0; i < d.count(); ++i)
            read_sample(d, i, epoch, out.data() + (size_t(epoch) * d.count() + i) * d.feature_size(), nullptr);
    return out;
}

ino_t inode_of(const std::string& path) {
    struct stat st {};
    REQUIRE(::stat(path.c_str(), &st) == 0);
    return st.st_ino;
}

}  // namespace

TEST_CASE(
    "image_folder decode cache: built once beside each split, reused, rebuilt when a file changes or it is "
    "damaged, never over a file it did not write") {
    TempDir dir;
    Rng rng(base_seed());
    const std::string root = dir.path().string();
    for (int i = 0; i < 8; ++i)
        for (const char* split : {"train", "val"}) {
            const int w = rng.integer(40, 90), h = rng.integer(40, 90);
            write_bytes(root + "/" + split + "/c" + std::to_string(i % 2) + "/" + std::to_string(i) + ".png",
                        encode_png(smooth_pixels(rng, w, h), w, h, 3));
        }
    auto load = [&](Fields keys) {
        keys.insert(keys.begin(), {"size", "12"});
        return load_datasets(folder_config(root, keys), "", 7);
    };
    const std::string train_cache = root + "/train.decoded-cache", val_cache = root + "/val.decoded-cache";
    const Datasets plain = load({});
    CHECK_FALSE(fs::exists(train_cache));

    SUBCASE("kept whole (no image over the cached side): every sample bit-identical to decoding the file") {
        const Datasets cached = load({{"cache", "decoded"}, {"cache_side", "1000"}});
        REQUIRE(fs::exists(train_cache));
        REQUIRE(fs::exists(val_cache));
        CHECK(all_samples(cached.train) == all_samples(plain.train));
        CHECK(all_samples(cached.test) == all_samples(plain.test));
    }
    SUBCASE("resized to the shorter side: the same crops within a stated tolerance, another fingerprint") {
        const Datasets cached = load({{"cache", "decoded"}});  // side: resize's 14 (12 / 0.875)
        for (const auto& [a, b] : {std::pair{&cached.train, &plain.train}, std::pair{&cached.test, &plain.test}}) {
            const std::vector<float> x = all_samples(*a), y = all_samples(*b);
            REQUIRE(x.size() == y.size());
            double sum = 0, most = 0;
            for (size_t i = 0; i < x.size(); ++i) {
                sum += std::abs(x[i] - y[i]);
                most = std::max(most, double(std::abs(x[i] - y[i])));
            }
            CHECK(sum / double(x.size()) < 2.0 / 255);  // pixels in [0, 1]: within 2 levels on average
            CHECK(most < 12.0 / 255);
        }
        CHECK(fingerprint(cached.train) != fingerprint(plain.train));
        CHECK(fs::file_size(train_cache) < 8 * 3 * 14 * 90 / 40 * 14 + 4096);  // the resized pixels, not the files
    }
    SUBCASE("reused as it is; rebuilt when an image changes or the cache is damaged") {
        const Fields keys = {{"cache", "decoded"}, {"cache_side", "1000"}};
        load(keys);
        const ino_t first = inode_of(train_cache), val_first = inode_of(val_cache);
        const Datasets again = load(keys);
        CHECK(inode_of(train_cache) == first);  // not written again
        CHECK(inode_of(val_cache) == val_first);
        CHECK(all_samples(again.train) == all_samples(plain.train));

        write_bytes(root + "/train/c1/3.png", encode_png(smooth_pixels(rng, 50, 45), 50, 45, 3));
        const Datasets changed = load(keys);
        CHECK(inode_of(train_cache) != first);
        CHECK(inode_of(val_cache) == val_first);
        CHECK(all_samples(changed.train) == all_samples(load({}).train));

        // cut short, then a damaged index entry: each read back as not a cache for these files
        const ino_t before_cut = inode_of(train_cache);
        fs::resize_file(train_cache, fs::file_size(train_cache) / 2);
        const Datasets after_cut = load(keys);
        CHECK(inode_of(train_cache) != before_cut);
        CHECK(all_samples(after_cut.train) == all_samples(load({}).train));
        {
            std::fstream f(train_cache, std::ios::in | std::ios::out | std::ios::binary);
            f.seekp(64 + 16 * 2);  // image 2's offset: far past the end
            const uint64_t wild = uint64_t(1) << 60;
            f.write(reinterpret_cast<const char*>(&wild), sizeof wild);
        }
        const ino_t before_damage = inode_of(train_cache);
        const Datasets after_damage = load(keys);
        CHECK(inode_of(train_cache) != before_damage);
        CHECK(all_samples(after_damage.train) == all_samples(load({}).train));
        // an entry rewritten to 1 x 1 pixels, inside the file: not the size the build gave it
        {
            std::fstream f(train_cache, std::ios::in | std::ios::out | std::ios::binary);
            f.seekp(64 + 16 * 3 + 8);  // image 3's width and height
            const uint32_t one[2] = {1, 1};
            f.write(reinterpret_cast<const char*>(one), sizeof one);
        }
        const ino_t before_resize = inode_of(train_cache);
        const Datasets after_resize = load(keys);
        CHECK(inode_of(train_cache) != before_resize);
        CHECK(all_samples(after_resize.train) == all_samples(load({}).train));
    }
    SUBCASE("a build killed mid-write leaves a temporary the next start removes; a live write's is kept") {
        const std::string stale = root + "/.train.decoded-cache.Ab12Cd.tmp",
                          live = root + "/.train.decoded-cache.Ef34Gh.tmp";
        std::ofstream(stale) << "half a cache";
        std::ofstream(live) << "a cache being written";
        const int held = ::open(live.c_str(), O_RDONLY | O_CLOEXEC);  // as a writer in another process holds it
        REQUIRE(held >= 0);
        REQUIRE(::flock(held, LOCK_EX) == 0);
        std::ofstream(root + "/.train.decoded-cache.tmp") << "not a temporary's name";
        const Datasets cached = load({{"cache", "decoded"}, {"cache_side", "1000"}});
        CHECK(all_samples(cached.train) == all_samples(plain.train));
        CHECK_FALSE(fs::exists(stale));
        CHECK(fs::exists(live));  // flock is per open file: this process's other descriptor cannot take it
        CHECK(fs::exists(root + "/.train.decoded-cache.tmp"));
        ::close(held);
    }
    SUBCASE("a file at the cache's path that is not a cache is never replaced; data.cache_dir puts it elsewhere") {
        std::ofstream(train_cache) << "the user's notes";
        CHECK(error_of([&] {
                  load({{"cache", "decoded"}});
              }) == train_cache +
                        ": exists and is not a decode cache written by mirrored; nothing was replaced: move it, or set "
                        "data.cache_dir to keep the cache elsewhere");
        std::ifstream in(train_cache);
        std::string kept;
        std::getline(in, kept);
        CHECK(kept == "the user's notes");
        fs::create_directories(root + "/caches");
        const Datasets elsewhere = load({{"cache", "decoded"}, {"cache_dir", root + "/caches"}});
        CHECK(fs::exists(root + "/caches/train.decoded-cache"));
        CHECK(fs::exists(root + "/caches/val.decoded-cache"));
        CHECK_FALSE(fs::exists(val_cache));
        CHECK(elsewhere.train.count() == 8);
        CHECK(error_of([&] {
                  load({{"cache", "decoded"}, {"cache_dir", root + "/no/such/folder"}});
              }).find(root + "/no/such/folder: no such file") == 0);
    }
    SUBCASE("a file that cannot be decoded: stops the build naming it, or is cached as bad and counted once") {
        const auto png = encode_png(smooth_pixels(rng, 30, 30), 30, 30, 3);
        write_bytes(root + "/train/c0/cut.png",
                    std::vector<unsigned char>(png.begin(), png.begin() + long(png.size() / 2)));
        CHECK(error_of([&] {
                  load({{"cache", "decoded"}});
              }).find(root + "/train/c0/cut.png: a corrupt or truncated PNG") == 0);
        CHECK_FALSE(fs::exists(train_cache));  // nothing half-built left
        const Datasets lenient = load({{"cache", "decoded"}, {"on_bad_file", "skip"}, {"max_bad_fraction", "0.2"}});
        all_samples(lenient.train);
        CHECK(lenient.train.source->bad_reads() == 1);
        std::vector<float> x(lenient.train.feature_size(), 1.0f);
        const size_t cut = 4;  // c0: 0.png, 2.png, 4.png, 6.png, cut.png
        read_sample(lenient.train, cut, 0, x.data(), nullptr);
        CHECK(std::all_of(x.begin(), x.end(), [](float v) { return v == 0.0f; }));
    }
    SUBCASE("its keys apply with data.cache: decoded only") {
        CHECK_THROWS_WITH_AS(load({{"cache_side", "64"}}), doctest::Contains("applies with data.cache: decoded only"),
                             ConfigError);
    }
}

TEST_CASE(
    "image_folder: bad files stop the run naming the file, or are skipped and counted up to the stated fraction") {
    TempDir dir;
    Rng rng(base_seed());
    const std::string root = dir.path().string();
    for (int i = 0; i < 10; ++i) {
        write_marked(root + "/train/a/" + std::to_string(i) + ".png", 10 * i);
        write_marked(root + "/train/b/" + std::to_string(i) + ".png", 10 * i);
    }
    write_marked(root + "/val/a/0.png", 5);
    auto load = [&](Fields keys) { return load_datasets(folder_config(root, keys), "", 1); };
    CHECK(load({}).train.count() == 20);

    SUBCASE("not an image") {
        std::ofstream(root + "/train/b/notes.jpg") << "some text saved under an image's name";
        CHECK(error_of([&] { load({}); }) == root +
                                                 "/train/b/notes.jpg: neither a JPEG nor a PNG image (by its first "
                                                 "bytes); data.on_bad_file: skip leaves bad files out");
        const Datasets d = load({{"on_bad_file", "skip"}, {"max_bad_fraction", "0.1"}});
        CHECK(d.train.count() == 20);
        REQUIRE(d.train.skipped_files.size() == 1);
        CHECK(d.train.skipped_files[0].find("notes.jpg") != std::string::npos);
        CHECK(error_of([&] {
                  load({{"on_bad_file", "skip"}, {"max_bad_fraction", "0.01"}});
              }).find("1 of 21 files are bad, more than data.max_bad_fraction = 0.01") != std::string::npos);
    }
    SUBCASE("truncated") {
        const auto png = encode_png(random_pixels(rng, 30, 30, 3), 30, 30, 3);
        write_bytes(root + "/train/a/cut.png",
                    std::vector<unsigned char>(png.begin(), png.begin() + long(png.size() / 2)));
        // the header is intact: found when the sample is decoded
        const Datasets strict = load({});
        std::vector<float> x(strict.train.feature_size());
        CHECK(error_of([&] {
                  for (size_t i = 0; i < strict.train.count(); ++i) read_sample(strict.train, i, 0, x.data(), nullptr);
              }).find(root + "/train/a/cut.png: a corrupt or truncated PNG") == 0);
        const Datasets lenient = load({{"on_bad_file", "skip"}, {"max_bad_fraction", "0.1"}});
        for (int epoch = 0; epoch < 3; ++epoch)  // a bad file counts once, however often it is read
            for (size_t i = 0; i < lenient.train.count(); ++i) read_sample(lenient.train, i, epoch, x.data(), nullptr);
        CHECK(lenient.train.source->bad_reads() == 1);
    }
    SUBCASE("a file changed since the data set was opened") {
        const Datasets d = load({});
        write_marked(root + "/train/a/3.png", 1, 40, 40);
        std::vector<float> x(d.train.feature_size());
        CHECK(error_of([&] { read_sample(d.train, 3, 0, x.data(), nullptr); }).find("the image changed since") !=
              std::string::npos);
    }
    SUBCASE("decompression bomb") {
        auto png = encode_png(std::vector<unsigned char>(4, 0), 2, 2, 1);
        auto put32 = [](unsigned char* p, uint32_t v) {
            for (int i = 0; i < 4; ++i) p[i] = static_cast<unsigned char>(v >> (24 - 8 * i));
        };
        put32(png.data() + 16, 100000);
        put32(png.data() + 20, 100000);
        put32(png.data() + 29, uint32_t(crc32(crc32(0, nullptr, 0), png.data() + 12, 17)));
        write_bytes(root + "/train/b/bomb.png", png);
        CHECK(error_of([&] { load({}); }).find(root + "/train/b/bomb.png: a PNG of 100000 x 100000") == 0);
        fs::remove(root + "/train/b/bomb.png");
        CHECK(error_of([&] {
                  load({{"max_pixels", "100"}});
              }).find("0.png: a PNG of 12 x 10 = 120 pixels, over the limit of 100") != std::string::npos);
    }
    SUBCASE("an empty class, a symbolic-link loop, a dangling link, a format not read, a test class not trained") {
        fs::create_directories(root + "/train/empty");
        CHECK(error_of([&] { load({}); }) ==
              root + "/train/empty: a class folder without .jpg, .jpeg or .png images (remove it, or add images)");
        fs::remove(root + "/train/empty");
        fs::create_directory_symlink(root + "/train/a", root + "/train/a/again");
        CHECK(error_of([&] { load({}); }) ==
              root + "/train/a/again: a symbolic-link loop (the folder contains itself)");
        fs::remove(root + "/train/a/again");
        fs::create_symlink(root + "/nowhere.png", root + "/train/a/gone.png");
        CHECK(error_of([&] { load({}); }).find(root + "/train/a/gone.png: cannot read (No such file or directory)") ==
              0);
        fs::remove(root + "/train/a/gone.png");
        std::ofstream(root + "/train/a/old.bmp") << "BM";
        CHECK(error_of([&] { load({}); }).find("old.bmp: an image format not read here") != std::string::npos);
        fs::remove(root + "/train/a/old.bmp");
        write_marked(root + "/val/zebra/0.png", 1);
        CHECK(error_of([&] { load({}); }) == root + "/val/zebra: a class the training split does not have");
    }
    SUBCASE("a list file") {
        std::ofstream(root + "/list.csv") << "path,label\ntrain/a/1.png,0\ntrain/b/2.png,4\n";
        DataConfig c = make_data_config("image_folder", {{"train", root + "/list.csv"}, {"test", root + "/list.csv"}});
        c.normalize = DataConfig::Normalize::none;
        const Datasets d = load_datasets(c, "", 1);
        CHECK(d.train.count() == 2);
        CHECK(d.train.classes == 5);
        c.format = make_data_config("image_folder", {{"train", root + "/list.csv"}, {"test", root + "/val"}}).format;
        CHECK(error_of([&] {
                  load_datasets(c, "", 1);
              }).find(": both splits are folders (classes by name) or both list files") != std::string::npos);
        std::ofstream(root + "/bad.csv") << "train/a/1.png,0\ntrain/b/2.png,cat\n";
        c.format =
            make_data_config("image_folder", {{"train", root + "/bad.csv"}, {"test", root + "/list.csv"}}).format;
        CHECK(error_of([&] { load_datasets(c, "", 1); }) ==
              root + "/bad.csv:2: label 'cat': expected a class index in [0, 2^24)");
        // a byte-order mark (an editor's UTF-8) before the header, or before the first path
        for (const char* head : {"\xEF\xBB\xBFpath,label\n", "\xEF\xBB\xBF"}) {
            std::ofstream(root + "/bom.csv") << head << "train/a/1.png,0\ntrain/b/2.png,4\n";
            c.format =
                make_data_config("image_folder", {{"train", root + "/bom.csv"}, {"test", root + "/list.csv"}}).format;
            const Datasets b = load_datasets(c, "", 1);
            CHECK(b.train.count() == 2);
            CHECK(b.train.skipped_files.empty());
        }
    }
}

TEST_CASE("image_folder: trains end to end on CPU replicas; two runs are identical; bad reads reach summary.json") {
    TempDir dir;
    Rng rng(base_seed());
    const std::string root = dir.path().string();
    // reddish and bluish noise: a class any model separates
    for (const char* split : {"train", "val"})
        for (int i = 0; i < (std::string(split) == "train" ? 48 : 16); ++i) {
            const int cls = i % 2, w = rng.integer(16, 40), h = rng.integer(16, 40);
            std::vector<unsigned char> px = random_pixels(rng, w, h, 3);
            for (size_t k = 0; k < px.size(); k += 3)
                px[k + size_t(cls ? 2 : 0)] = static_cast<unsigned char>(200 + px[k + 1] % 56);
            write_bytes(root + "/" + split + "/" + (cls ? "blue" : "red") + "/" + std::to_string(i) + ".jpg",
                        encode_jpeg(px, w, h, 3, 90));
        }
    const std::string config = dir.write("images.yaml",
                                         "run: {name: images, seed: 2}\n"
                                         "strategy: {devices: \"cpu:2\"}\n"
                                         "data: {dataset: image_folder, root: " +
                                             root +
                                             ", size: 12, scale: [0.3, 1.0], loader_threads: 2}\n"
                                             "model:\n  layers:\n"
                                             "    - {type: conv2d, filters: 4, kernel_size: 3, activation: relu}\n"
                                             "    - {type: flatten}\n    - {type: dense, units: 2}\n"
                                             "optimizer: {type: adamw, lr: 0.01}\n"
                                             "train: {epochs: 4, global_batch_size: 8, log_every_steps: 4}\n");
    std::FILE* quiet = std::fopen("/dev/null", "w");
    const std::string a = dir / "a", b = dir / "b";
    REQUIRE(run_training(load_config(config, {"run.output_dir=" + a}), nullptr, quiet) == kExitOk);
    REQUIRE(run_training(load_config(config, {"run.output_dir=" + b}), nullptr, quiet) == kExitOk);
    std::fclose(quiet);
    const auto sa = summary(a), sb = summary(b);
    CHECK(sa["test_accuracy"].get<double>() >= 0.9);
    CHECK(sa["replica_checksums"] == sb["replica_checksums"]);
    CHECK(sa["data"]["bad_reads"] == 0);
    CHECK(sa["data"]["skipped_files"] == 0);
    // stopped after step 10 and resumed: the crops of the steps after it are drawn again alike
    const std::string stopped = dir / "stopped", one = dir / "one";
    quiet = std::fopen("/dev/null", "w");
    ::setenv("MIRRORED_TEST_STOP_AFTER_STEP", "10", 1);
    const int first = run_training(load_config(config, {"run.output_dir=" + stopped}), nullptr, quiet);
    ::unsetenv("MIRRORED_TEST_STOP_AFTER_STEP");
    CHECK(first == kExitInterrupted);
    CHECK(run_training(load_config(config, {"run.output_dir=" + stopped}), nullptr, quiet) == kExitOk);
    CHECK(summary(stopped)["resumed_from_step"] == 10);
    expect_same_run(a, stopped);
    // one replica on the same global batch: the same samples and crops, the sums in another order
    REQUIRE(run_training(load_config(config, {"run.output_dir=" + one, "strategy.devices=cpu:1"}), nullptr, quiet) ==
            kExitOk);
    std::fclose(quiet);
    CHECK(summary(one)["test_loss"].get<double>() == doctest::Approx(sa["test_loss"].get<double>()).epsilon(1e-3));
    CHECK(summary(one)["train_loss"].get<double>() == doctest::Approx(sa["train_loss"].get<double>()).epsilon(1e-3));
    // a bad file, skipped: the run completes and says which
    std::ofstream(root + "/train/red/zz.jpg") << "not a photograph";
    const std::string c = dir / "c";
    quiet = std::fopen("/dev/null", "w");
    REQUIRE(run_training(
                load_config(config, {"run.output_dir=" + c, "data.on_bad_file=skip", "data.max_bad_fraction=0.05"}),
                nullptr, quiet) == kExitOk);
    std::fclose(quiet);
    const auto sc = summary(c);
    CHECK(sc["data"]["skipped_files"] == 1);
    REQUIRE(sc["data"]["skipped"].size() == 1);
    CHECK(sc["data"]["skipped"][0].get<std::string>().find("zz.jpg: neither a JPEG nor a PNG") != std::string::npos);
}
