#include "data/image_transform.h"

#include <algorithm>
#include <cmath>

#include "base/philox.h"

namespace mirrored {

namespace {

// The taps of every output pixel along one axis, padded to the same count K so that the loops
// over them have a fixed length: output o reads pixels [first[o], first[o] + K) with weights
// w[o * K ...] (zero where the filter does not reach).
struct AxisPlan {
    int K = 0;
    std::vector<int> first;
    std::vector<float> w;
};

// PIL's antialiased bilinear weights (ImagingResample's precompute_coeffs) for `out` pixels
// covering [begin, begin + span) of an axis of `size` pixels.
void axis_plan(int size, double begin, double span, int out, AxisPlan& p) {
    const double scale = span / out;
    const double filterscale = std::max(scale, 1.0);
    const double support = filterscale;  // the triangle's radius, 1 at unit scale
    thread_local std::vector<double> taps;
    thread_local std::vector<int> lo_of, count_of;
    taps.clear();
    lo_of.resize(size_t(out));
    count_of.resize(size_t(out));
    int K = 1;
    for (int o = 0; o < out; ++o) {
        const double center = begin + (o + 0.5) * scale;
        int lo = std::max(int(std::floor(center - support + 0.5)), 0);
        int hi = std::min(int(std::floor(center + support + 0.5)), size);
        double total = 0;
        const size_t at = taps.size();
        for (int i = lo; i < hi; ++i) {
            const double w = std::max(0.0, 1.0 - std::fabs((i - center + 0.5) / filterscale));
            taps.push_back(w);
            total += w;
        }
        if (total <= 0) {  // a box outside the image (the crops above never make one): the nearest pixel
            taps.resize(at);
            taps.push_back(1.0);
            lo = std::clamp(int(center), 0, size - 1);
            hi = lo + 1;
            total = 1;
        }
        for (size_t k = at; k < taps.size(); ++k) taps[k] /= total;
        lo_of[size_t(o)] = lo;
        count_of[size_t(o)] = hi - lo;
        K = std::max(K, hi - lo);
    }
    K = std::min(K, size);
    p.K = K;
    p.first.resize(size_t(out));
    p.w.assign(size_t(out) * size_t(K), 0.0f);
    size_t at = 0;
    for (int o = 0; o < out; ++o) {
        const int lo = lo_of[size_t(o)], n = count_of[size_t(o)];
        const int first = std::min(lo, size - K);  // shifted left at the right edge, zeros padding
        p.first[size_t(o)] = first;
        for (int k = 0; k < n; ++k) p.w[size_t(o) * size_t(K) + size_t(lo - first + k)] = float(taps[at + size_t(k)]);
        at += size_t(n);
    }
}

// Horizontal pass of one row: bytes [span_lo, span_hi) converted once, then every output pixel's
// taps. KN > 0: the tap count known at compile time (2: any enlargement), so the loops unroll.
template <int C, int KN>
void horizontal(const unsigned char* row, const AxisPlan& px, int out_w, bool flip, int span_lo, int span_hi,
                float* __restrict rowf, float* __restrict dst) {
    for (int i = span_lo * C; i < span_hi * C; ++i) rowf[i] = float(row[i]);
    const int K = KN > 0 ? KN : px.K;
    for (int x = 0; x < out_w; ++x) {
        const int src_x = flip ? out_w - 1 - x : x;
        const float* __restrict w = px.w.data() + size_t(src_x) * size_t(K);
        const float* __restrict s = rowf + size_t(px.first[size_t(src_x)]) * C;
        float acc[C] = {};
        for (int k = 0; k < K; ++k)
            for (int c = 0; c < C; ++c) acc[c] += w[k] * s[k * C + c];
        for (int c = 0; c < C; ++c) dst[x * C + c] = acc[c];
    }
}

template <int C>
void horizontal_any(const unsigned char* row, const AxisPlan& px, int out_w, bool flip, int span_lo, int span_hi,
                    float* rowf, float* dst) {
    switch (px.K) {
        case 2:
            return horizontal<C, 2>(row, px, out_w, flip, span_lo, span_hi, rowf, dst);
        case 3:
            return horizontal<C, 3>(row, px, out_w, flip, span_lo, span_hi, rowf, dst);
        case 4:
            return horizontal<C, 4>(row, px, out_w, flip, span_lo, span_hi, rowf, dst);
        default:
            return horizontal<C, 0>(row, px, out_w, flip, span_lo, span_hi, rowf, dst);
    }
}

template <int C>
void resample_channels(const PixelView& src, const CropBox& box, bool flip, int out_w, int out_h, const PixelMap& map,
                       float* out, std::vector<float>& scratch) {
    thread_local AxisPlan px, py;
    thread_local std::vector<float> rowf, scale_row, shift_row;
    axis_plan(src.width, box.x, box.w, out_w, px);
    axis_plan(src.height, box.y, box.h, out_h, py);
    const int y0 = py.first.front(), y1 = py.first.back() + py.K;
    const int span_lo = *std::min_element(px.first.begin(), px.first.end());
    const int span_hi = *std::max_element(px.first.begin(), px.first.end()) + px.K;
    const size_t row_floats = size_t(out_w) * C;
    // Horizontal pass over the rows the vertical taps read: [y1 - y0, out_w, C].
    scratch.resize(size_t(y1 - y0) * row_floats);
    rowf.resize(size_t(src.width) * C);
    for (int y = y0; y < y1; ++y)
        horizontal_any<C>(src.data + size_t(y) * size_t(src.width) * C, px, out_w, flip, span_lo, span_hi, rowf.data(),
                          scratch.data() + size_t(y - y0) * row_floats);
    // Vertical pass, then the byte-to-float map: both run along whole rows (vectorised).
    scale_row.resize(row_floats);
    shift_row.resize(row_floats);
    for (size_t i = 0; i < row_floats; ++i) {
        scale_row[i] = map.scale[i % C];
        shift_row[i] = map.shift[i % C];
    }
    const float* __restrict scale = scale_row.data();
    const float* __restrict shift = shift_row.data();
    for (int y = 0; y < out_h; ++y) {
        const float* __restrict w = py.w.data() + size_t(y) * size_t(py.K);
        float* __restrict dst = out + size_t(y) * row_floats;
        const float* first = scratch.data() + size_t(py.first[size_t(y)] - y0) * row_floats;
        if (py.K == 2) {  // any enlargement: one pass
            const float* __restrict r0 = first;
            const float* __restrict r1 = first + row_floats;
            const float w0 = w[0], w1 = w[1];
            for (size_t i = 0; i < row_floats; ++i) dst[i] = (w0 * r0[i] + w1 * r1[i]) * scale[i] + shift[i];
            continue;
        }
        for (size_t i = 0; i < row_floats; ++i) dst[i] = w[0] * first[i];
        for (int k = 1; k < py.K; ++k) {
            const float* __restrict r = first + size_t(k) * row_floats;
            const float wk = w[k];
            for (size_t i = 0; i < row_floats; ++i) dst[i] += wk * r[i];
        }
        for (size_t i = 0; i < row_floats; ++i) dst[i] = dst[i] * scale[i] + shift[i];
    }
}

double uniform(uint32_t v) { return (v >> 8) * (1.0 / 16777216.0); }
// torchvision's randint(0, n): [0, n).
int below(uint32_t v, int n) { return int((uint64_t(v) * uint64_t(n)) >> 32); }

}  // namespace

CropBox random_resized_crop(int width, int height, const RandomCropOptions& o, uint64_t seed, uint32_t index,
                            int64_t epoch, bool* flip) {
    const double area = double(width) * height;
    const double log_lo = std::log(o.ratio[0]), log_hi = std::log(o.ratio[1]);
    auto draw = [&](uint32_t attempt) {
        return philox(seed, (uint64_t(attempt) << 32) | index, kStreamImageCrop, static_cast<uint32_t>(epoch));
    };
    if (flip) *flip = draw(10).v[0] & 1u;
    for (uint32_t attempt = 0; attempt < 10; ++attempt) {
        const Philox4 r = draw(attempt);
        const double target = area * (o.scale[0] + uniform(r.v[0]) * (o.scale[1] - o.scale[0]));
        const double aspect = std::exp(log_lo + uniform(r.v[1]) * (log_hi - log_lo));
        const int w = int(std::lround(std::sqrt(target * aspect)));
        const int h = int(std::lround(std::sqrt(target / aspect)));
        if (w > 0 && w <= width && h > 0 && h <= height)
            return {double(below(r.v[3], width - w + 1)), double(below(r.v[2], height - h + 1)), double(w), double(h)};
    }
    const double in_ratio = double(width) / height;
    int w = width, h = height;
    if (in_ratio < o.ratio[0]) h = int(std::lround(w / o.ratio[0]));
    else if (in_ratio > o.ratio[1]) w = int(std::lround(h * o.ratio[1]));
    return {double((width - w) / 2), double((height - h) / 2), double(w), double(h)};
}

CropBox center_crop(int width, int height, int resize, int out_w, int out_h) {
    // Resize: the shorter side to `resize`, the longer in proportion (truncated, as torchvision),
    // in doubles: a 1,000,000 x 1 image would overflow an int.
    double rw = resize, rh = resize;
    if (width < height) rh = std::floor(double(resize) * height / width);
    else rw = std::floor(double(resize) * width / height);
    const double sx = double(width) / rw, sy = double(height) / rh;
    // Python's round(): halves to even (341 - 224 = 117: 58, not 59)
    const double left = std::nearbyint((rw - out_w) / 2.0), top = std::nearbyint((rh - out_h) / 2.0);
    return {left * sx, top * sy, out_w * sx, out_h * sy};
}

PixelMap PixelMap::normalized(const std::vector<float>& mean, const std::vector<float>& std, int channels) {
    PixelMap m;
    for (int c = 0; c < channels; ++c) {
        const float mu = mean.empty() ? 0.0f : mean[size_t(c)], sd = std.empty() ? 1.0f : std[size_t(c)];
        m.scale.push_back(1.0f / (255.0f * sd));
        m.shift.push_back(-mu / sd);
    }
    return m;
}

void resample(const PixelView& src, const CropBox& box, bool flip, int out_w, int out_h, const PixelMap& map,
              float* out, std::vector<float>& scratch) {
    if (src.channels == 1) resample_channels<1>(src, box, flip, out_w, out_h, map, out, scratch);
    else resample_channels<3>(src, box, flip, out_w, out_h, map, out, scratch);
}

}  // namespace mirrored
