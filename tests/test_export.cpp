// The exported model is what a PyTorch user loads: the safetensors file holds PyTorch's names and
// layouts, and a forward pass written from PyTorch's definitions of each module - NCHW tensors,
// conv weights [out, in, kh, kw], flatten in (c, h, w) order, batchnorm in eval mode with the
// running statistics, dropout as the identity - in double precision, independently of the
// trainer, gives the trainer's logits. (scripts/check_export_pytorch.py does the same with PyTorch
// itself where it is installed.)
#include <doctest/doctest.h>

#include <cmath>
#include <fstream>
#include <cstring>
#include <functional>

#include "base/error.h"
#include "mirrored/checkpoint.h"
#include "mirrored/config.h"
#include "mirrored/trainer.h"
#include "tests/cli.h"
#include "tests/helpers.h"

using namespace mirrored;
using namespace mirrored::test;

namespace {

// An NCHW tensor (a vector is [n, c, 1, 1]).
struct Nchw {
    int n = 0, c = 0, h = 1, w = 1;
    bool image = false;
    std::vector<double> v;
    double& at(int b, int ch, int y, int x) { return v[((size_t(b) * c + ch) * h + y) * w + x]; }
    double at(int b, int ch, int y, int x) const { return v[((size_t(b) * c + ch) * h + y) * w + x]; }
};

double act(Activation a, double z) {
    if (a == Activation::relu) return z > 0 ? z : 0;
    if (a == Activation::gelu) return 0.5 * z * (1 + std::erf(z / std::sqrt(2.0)));
    if (a == Activation::gelu_tanh)
        return 0.5 * z * (1 + std::tanh(std::sqrt(2.0 / M_PI) * (z + 0.044715 * z * z * z)));
    return z;
}

// A layer's keys as its config gives them (LayerSpec::fields): what a PyTorch user would read.
int int_key(const LayerSpec& s, const char* key) { return std::stoi(s.field(key)); }
double number_key(const LayerSpec& s, const char* key) { return std::stod(s.field(key)); }
bool bool_key(const LayerSpec& s, const char* key) { return s.field(key) == "true"; }
Activation activation_key(const LayerSpec& s) {
    const std::string a = s.field("activation");
    return a == "relu"        ? Activation::relu
           : a == "gelu"      ? Activation::gelu
           : a == "gelu_tanh" ? Activation::gelu_tanh
                              : Activation::none;
}
int padding_key(const LayerSpec& s) {  // same | valid | N
    const std::string p = s.field("padding");
    return p == "same" ? (int_key(s, "kernel_size") - 1) / 2 : p == "valid" ? 0 : std::stoi(p);
}

class Reference {
public:
    explicit Reference(const SafetensorsFile& f) : f_(f) {}

    const std::vector<float>& w(const std::string& name) const {
        auto it = f_.tensors.find(name);
        REQUIRE_MESSAGE(it != f_.tensors.end(), "the export lacks " << name);
        return it->second.second;
    }
    const std::vector<int>& shape(const std::string& name) const { return f_.tensors.at(name).first; }

    Nchw sequence(const std::vector<LayerSpec>& specs, const std::string& prefix, Nchw x) const {
        for (size_t i = 0; i < specs.size(); ++i) x = layer(specs[i], prefix + "." + std::to_string(i), x);
        return x;
    }

    Nchw layer(const LayerSpec& s, const std::string& name, const Nchw& x) const {
        if (s.type == "dense") return linear(s, name, x);
        if (s.type == "conv2d")
            return conv(name, x, int_key(s, "stride"), padding_key(s), bool_key(s, "bias"), activation_key(s));
        if (s.type == "maxpool2d" || s.type == "avgpool2d") return pool(s, x);
        if (s.type == "global_avgpool") return global_pool(x);
        if (s.type == "flatten") return flatten(x);
        if (s.type == "batchnorm") return batchnorm(name, x, float(number_key(s, "epsilon")), activation_key(s));
        if (s.type == "layernorm") return layernorm(name, x, float(number_key(s, "epsilon")));
        if (s.type == "rmsnorm") return rmsnorm(name, x, float(number_key(s, "epsilon")));
        if (s.type == "dropout") return x;
        if (s.type == "residual") return residual(s, name, x);
        FAIL("no reference for " << s.type);
        return x;
    }

private:
    Nchw linear(const LayerSpec& s, const std::string& name, const Nchw& x) const {
        const auto& W = w(name + ".weight");
        const int out = shape(name + ".weight")[0], in = shape(name + ".weight")[1];
        REQUIRE(in == x.c * x.h * x.w);
        Nchw y{x.n, out, 1, 1, false, std::vector<double>(size_t(x.n) * out)};
        for (int b = 0; b < x.n; ++b)
            for (int o = 0; o < out; ++o) {
                double z = bool_key(s, "bias") ? w(name + ".bias")[size_t(o)] : 0.0;
                for (int i = 0; i < in; ++i) z += double(W[size_t(o) * in + i]) * x.v[size_t(b) * in + i];
                y.v[size_t(b) * out + o] = act(activation_key(s), z);
            }
        return y;
    }

    Nchw conv(const std::string& name, const Nchw& x, int stride, int pad, bool bias, Activation a) const {
        const auto& W = w(name + ".weight");
        const auto& sh = shape(name + ".weight");  // [out, in, kh, kw]
        const int O = sh[0], I = sh[1], kh = sh[2], kw = sh[3];
        REQUIRE(I == x.c);
        const int oh = (x.h + 2 * pad - kh) / stride + 1, ow = (x.w + 2 * pad - kw) / stride + 1;
        Nchw y{x.n, O, oh, ow, true, std::vector<double>(size_t(x.n) * O * oh * ow)};
        for (int b = 0; b < x.n; ++b)
            for (int o = 0; o < O; ++o)
                for (int oy = 0; oy < oh; ++oy)
                    for (int ox = 0; ox < ow; ++ox) {
                        double z = bias ? w(name + ".bias")[size_t(o)] : 0.0;
                        for (int i = 0; i < I; ++i)
                            for (int ky = 0; ky < kh; ++ky)
                                for (int kx = 0; kx < kw; ++kx) {
                                    const int iy = oy * stride + ky - pad, ix = ox * stride + kx - pad;
                                    if (iy < 0 || iy >= x.h || ix < 0 || ix >= x.w) continue;
                                    z += double(W[((size_t(o) * I + i) * kh + ky) * kw + kx]) * x.at(b, i, iy, ix);
                                }
                        y.at(b, o, oy, ox) = act(a, z);
                    }
        return y;
    }

    static Nchw pool(const LayerSpec& s, const Nchw& x) {
        const int k = int_key(s, "kernel_size"), st = int_key(s, "stride"), pad = padding_key(s);
        const int oh = (x.h + 2 * pad - k) / st + 1, ow = (x.w + 2 * pad - k) / st + 1;
        Nchw y{x.n, x.c, oh, ow, true, std::vector<double>(size_t(x.n) * x.c * oh * ow)};
        for (int b = 0; b < x.n; ++b)
            for (int c = 0; c < x.c; ++c)
                for (int oy = 0; oy < oh; ++oy)
                    for (int ox = 0; ox < ow; ++ox) {
                        double m = -INFINITY, sum = 0;
                        for (int ky = 0; ky < k; ++ky)
                            for (int kx = 0; kx < k; ++kx) {
                                const int iy = oy * st + ky - pad, ix = ox * st + kx - pad;
                                if (iy < 0 || iy >= x.h || ix < 0 || ix >= x.w) continue;
                                m = std::max(m, x.at(b, c, iy, ix));
                                sum += x.at(b, c, iy, ix);
                            }
                        y.at(b, c, oy, ox) = s.type == "maxpool2d" ? m : sum / (k * k);  // count_include_pad
                    }
        return y;
    }

    static Nchw global_pool(const Nchw& x) {
        Nchw y{x.n, x.c, 1, 1, false, std::vector<double>(size_t(x.n) * x.c)};
        for (int b = 0; b < x.n; ++b)
            for (int c = 0; c < x.c; ++c) {
                double s = 0;
                for (int yy = 0; yy < x.h; ++yy)
                    for (int xx = 0; xx < x.w; ++xx) s += x.at(b, c, yy, xx);
                y.v[size_t(b) * x.c + c] = s / (x.h * x.w);
            }
        return y;
    }

    static Nchw flatten(const Nchw& x) {  // torch.flatten(x, 1): NCHW order
        Nchw y = x;
        y.c = x.c * x.h * x.w;
        y.h = y.w = 1;
        y.image = false;
        return y;
    }

    Nchw batchnorm(const std::string& name, Nchw x, float eps, Activation a) const {
        const auto &g = w(name + ".weight"), &beta = w(name + ".bias"), &rm = w(name + ".running_mean"),
                   &rv = w(name + ".running_var");
        REQUIRE(f_.int_tensors.count(name + ".num_batches_tracked") == 1);
        for (int b = 0; b < x.n; ++b)
            for (int c = 0; c < x.c; ++c)
                for (int yy = 0; yy < x.h; ++yy)
                    for (int xx = 0; xx < x.w; ++xx) {
                        double& v = x.at(b, c, yy, xx);
                        v = act(a, (v - rm[size_t(c)]) / std::sqrt(double(rv[size_t(c)]) + eps) * g[size_t(c)] +
                                       beta[size_t(c)]);
                    }
        return x;
    }

    // LayerNorm(c) over the channels of each position (the last axis of the NHWC layout): on an
    // NCHW tensor, x.permute(0, 2, 3, 1), LayerNorm, and back.
    Nchw layernorm(const std::string& name, Nchw x, float eps) const {
        const auto &g = w(name + ".weight"), &beta = w(name + ".bias");
        for (int b = 0; b < x.n; ++b)
            for (int yy = 0; yy < x.h; ++yy)
                for (int xx = 0; xx < x.w; ++xx) {
                    double m = 0, var = 0;
                    for (int c = 0; c < x.c; ++c) m += x.at(b, c, yy, xx);
                    m /= x.c;
                    for (int c = 0; c < x.c; ++c) var += std::pow(x.at(b, c, yy, xx) - m, 2);
                    var /= x.c;
                    for (int c = 0; c < x.c; ++c)
                        x.at(b, c, yy, xx) =
                            (x.at(b, c, yy, xx) - m) / std::sqrt(var + eps) * g[size_t(c)] + beta[size_t(c)];
                }
        return x;
    }

    // RMSNorm(c) over the channels of each position, as LayerNorm above: x / sqrt(mean(x^2) + eps)
    // times the weight.
    Nchw rmsnorm(const std::string& name, Nchw x, float eps) const {
        const auto& g = w(name + ".weight");
        for (int b = 0; b < x.n; ++b)
            for (int yy = 0; yy < x.h; ++yy)
                for (int xx = 0; xx < x.w; ++xx) {
                    double q = 0;
                    for (int c = 0; c < x.c; ++c) q += std::pow(x.at(b, c, yy, xx), 2);
                    const double rs = 1.0 / std::sqrt(q / x.c + eps);
                    for (int c = 0; c < x.c; ++c) x.at(b, c, yy, xx) = x.at(b, c, yy, xx) * rs * g[size_t(c)];
                }
        return x;
    }

    Nchw residual(const LayerSpec& s, const std::string& name, const Nchw& x) const {
        Nchw f = sequence(s.layers, name + ".layers", x);
        Nchw sc = x;
        if (s.field("shortcut") == "conv1x1") {
            sc = conv(name + ".shortcut.0", x, x.h / f.h, 0, false, Activation::none);
            sc = batchnorm(name + ".shortcut.1", sc, 1e-5f, Activation::none);
        }
        REQUIRE(f.v.size() == sc.v.size());
        for (size_t i = 0; i < f.v.size(); ++i) f.v[i] = act(activation_key(s), f.v[i] + sc.v[i]);
        return f;
    }

    const SafetensorsFile& f_;
};

std::vector<float> read_npy(const std::string& path, std::vector<size_t>& shape) {
    std::ifstream in(path, std::ios::binary);
    std::string all((std::istreambuf_iterator<char>(in)), {});
    REQUIRE(all.size() > 10);
    const size_t hl = size_t(uint8_t(all[8])) | (size_t(uint8_t(all[9])) << 8);
    const std::string header = all.substr(10, hl);
    const size_t open = header.find('('), close = header.find(')');
    shape.clear();
    std::string dims = header.substr(open + 1, close - open - 1);
    for (size_t p = 0; p < dims.size();) {
        const size_t comma = dims.find(',', p);
        const std::string d = dims.substr(p, comma == std::string::npos ? std::string::npos : comma - p);
        if (d.find_first_of("0123456789") != std::string::npos) shape.push_back(std::stoul(d));
        if (comma == std::string::npos) break;
        p = comma + 1;
    }
    std::vector<float> v((all.size() - 10 - hl) / 4);
    std::memcpy(v.data(), all.data() + 10 + hl, v.size() * 4);
    return v;
}

}  // namespace

TEST_CASE("the exported safetensors reproduce the trainer's logits under PyTorch's module definitions") {
    TempDir d;
    const std::string cfg = d.write("cnn.yaml", R"(run: {name: export, seed: 7}
strategy: {devices: "cpu:2"}
data: {dataset: synthetic, input_shape: [8, 8, 3], classes: 5, train_samples: 400, test_samples: 64}
model:
  layers:
    - {type: conv2d, filters: 6, kernel_size: 3, padding: same, activation: relu}
    - {type: batchnorm}
    - type: residual
      activation: relu
      layers:
        - {type: conv2d, filters: 6, kernel_size: 3, padding: same, bias: false}
        - {type: batchnorm, activation: relu}
        - {type: conv2d, filters: 6, kernel_size: 3, padding: same, bias: false}
        - {type: batchnorm}
    - type: residual
      shortcut: conv1x1
      activation: relu
      layers:
        - {type: conv2d, filters: 8, kernel_size: 3, padding: 1, stride: 2, bias: false}
        - {type: batchnorm, activation: gelu}
    - {type: layernorm}
    - {type: rmsnorm}
    - {type: maxpool2d, kernel_size: 3, stride: 2, padding: 1}
    - {type: avgpool2d, kernel_size: 2, stride: 1}
    - {type: flatten}
    - {type: dropout, rate: 0.3}
    - {type: dense, units: 12, activation: gelu}
    - {type: dense, units: 5}
optimizer: {type: adamw, lr: 0.003}
train: {epochs: 2, global_batch_size: 20, log_every_steps: 10}
checkpoint: {every_steps: 0, keep: 1}
)");
    const std::string out = d / "run";
    REQUIRE(run_cli({"train", cfg, "--output", out}) == kExitOk);
    const std::string ckpt = list_checkpoints(out + "/checkpoints").front();
    const std::string exported = d / "model.safetensors";
    REQUIRE(run_cli({"export", ckpt, "--out", exported}) == kExitOk);
    REQUIRE(run_cli({"eval", cfg, "--checkpoint", ckpt, "--dump-inputs", d / "x.npy", "--dump-logits", d / "y.npy",
                     "--limit", "16"}) == kExitOk);
    const SafetensorsFile f = read_safetensors(exported, false);
    CHECK(f.tensors.count("layers.3.shortcut.0.weight") == 1);
    CHECK(f.tensors.at("layers.0.weight").first == std::vector<int>{6, 3, 3, 3});
    CHECK(f.int_tensors.at("layers.1.num_batches_tracked").second == std::vector<int64_t>{40});
    for (const auto& [name, t] : f.tensors) CHECK(name.rfind("optimizer.", 0) != 0);

    std::vector<size_t> xs, ys;
    const auto xh = read_npy(d / "x.npy", xs), yh = read_npy(d / "y.npy", ys);
    REQUIRE(xs == std::vector<size_t>{16, 8, 8, 3});
    REQUIRE(ys == std::vector<size_t>{16, 5});
    Nchw x{16, 3, 8, 8, true, std::vector<double>(xh.size())};
    for (int b = 0; b < 16; ++b)  // the dumped NHWC samples as the NCHW tensor PyTorch takes
        for (int yy = 0; yy < 8; ++yy)
            for (int xx = 0; xx < 8; ++xx)
                for (int c = 0; c < 3; ++c) x.at(b, c, yy, xx) = xh[((size_t(b) * 8 + yy) * 8 + xx) * 3 + c];
    const Config c = load_config(cfg, {});
    const Nchw logits = Reference(f).sequence(c.model.layers, "layers", x);
    REQUIRE(logits.v.size() == yh.size());
    CHECK(rel_error(yh, logits.v) < 1e-4);
}
