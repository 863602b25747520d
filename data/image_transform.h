// What the image-folder loader does between decoding and the batch: choose a crop (torchvision's
// RandomResizedCrop for training; Resize of the shorter side then CenterCrop for evaluation),
// resample it to the output size with an antialiased bilinear filter (PIL's: the triangle's
// support widens with the downscale factor, so a 4x reduction averages 4x4 pixels instead of
// aliasing), flip it, and scale and normalise it into floats - one pass per axis, the crop,
// resize, flip and normalisation fused.
#pragma once

#include <cstdint>
#include <vector>

#include "data/image_codec.h"

namespace mirrored {

// A region of the source image, in its pixels.
struct CropBox {
    double x = 0, y = 0, w = 0, h = 0;
};

struct RandomCropOptions {
    double scale[2] = {0.08, 1.0};             // of the image's area
    double ratio[2] = {3.0 / 4.0, 4.0 / 3.0};  // width / height
};

// torchvision's RandomResizedCrop.get_params: ten tries at an area and a log-uniform aspect ratio
// that fit, else the whole image clamped to the ratio range, centred. The draws are Philox(seed,
// index, epoch): a sample's crop and flip are a function of (seed, epoch, index), so N replicas
// read what one reads and a resume is exact.
CropBox random_resized_crop(int width, int height, const RandomCropOptions& o, uint64_t seed, uint32_t index,
                            int64_t epoch, bool* flip);

// Resize(resize) of the shorter side then CenterCrop(out_w x out_h), as one box in the source.
CropBox center_crop(int width, int height, int resize, int out_w, int out_h);

// Per-channel affine map applied to each resampled byte value v: v * scale[c] + shift[c].
struct PixelMap {
    std::vector<float> scale, shift;
    static PixelMap normalized(const std::vector<float>& mean, const std::vector<float>& std, int channels);
};

// Resamples `box` of `src` to out_w x out_h x src.channels floats (HWC), mirrored left-right when
// flip is set. `scratch` is a per-thread buffer kept between calls.
void resample(const PixelView& src, const CropBox& box, bool flip, int out_w, int out_h, const PixelMap& map,
              float* out, std::vector<float>& scratch);

}  // namespace mirrored
