#include "tests/fuzz/targets.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "data/image_codec.h"
#include "data/npz.h"
#include "data/tokenizer.h"
#include "data/image_transform.h"
#include "base/io.h"
#include "base/error.h"
#include "mirrored/checkpoint.h"
#include "mirrored/config.h"
#include "mirrored/model.h"
#include "mirrored/strategy.h"
#include "mirrored/planner.h"

namespace mirrored::fuzz {

namespace {

// A clean rejection is the expected outcome for most inputs.
template <typename F>
void tolerate(F&& f) {
    try {
        f();
    } catch (const Error&) {}
}

}  // namespace

void idx(const uint8_t* data, size_t size) {
    if (size < 2) return;
    const size_t split = std::min(size - 2, size_t(data[0]) | (size_t(data[1]) << 8));
    tolerate([&] {
        InputFile images("images", data + 2, split), labels("labels", data + 2 + split, size - 2 - split);
        const Dataset ds = read_idx(images, labels);
        if (ds.features.size() != ds.count() * ds.feature_size()) __builtin_trap();  // a reader invariant
    });
}

void npy(const uint8_t* data, size_t size) {
    if (size < 2) return;
    const size_t word = size_t(data[0]) | (size_t(data[1]) << 8);
    const size_t split = std::min(size - 2, word & 0x7fff);
    tolerate([&] {
        InputFile features("x.npy", data + 2, split), labels("y.npy", data + 2 + split, size - 2 - split);
        const Dataset ds = read_npy(features, labels, (word & 0x8000) != 0);
        if (ds.features.size() != ds.count() * ds.feature_size()) __builtin_trap();  // a reader invariant
    });
}

void npz(const uint8_t* data, size_t size) {
    const ReadAt read = [&](uint64_t offset, size_t n, unsigned char* dst) {
        if (offset > size || n > size - offset) throw DataError("archive.npz: truncated");
        if (n) std::memcpy(dst, data + offset, n);  // an empty member's buffer may be null
    };
    tolerate([&] {
        const uint64_t limit = uint64_t(1) << 24;
        const std::vector<unsigned char> x = read_npz_member("archive.npz", size, read, "x", limit);
        const std::vector<unsigned char> y = read_npz_member("archive.npz", size, read, "y", limit);
        InputFile features("archive.npz:x", x.data(), x.size(), false),
            labels("archive.npz:y", y.data(), y.size(), false);
        const Dataset ds = read_npy(features, labels, false);
        if (ds.features.size() != ds.count() * ds.feature_size()) __builtin_trap();  // a reader invariant
    });
}

void image(const uint8_t* data, size_t size) {
    if (size < 1) return;
    const int channels = (data[0] & 1) ? 1 : 3, shrink = 1 << ((data[0] >> 1) & 3);
    const uint64_t limit = uint64_t(1) << 22;
    tolerate([&] {
        const ImageHeader h = read_image_header(data + 1, size - 1, "image", limit);
        Pixels p;
        decode_image(data + 1, size - 1, "image", channels, shrink, limit, p);
        const int step = h.type == ImageType::jpeg ? shrink : 1;
        if (p.width != (h.width + step - 1) / step || p.height != (h.height + step - 1) / step ||
            p.data.size() != size_t(p.width) * size_t(p.height) * size_t(channels))
            __builtin_trap();  // the decoder's invariants
        std::vector<float> out(size_t(8 * 8 * channels)), scratch;
        resample(p, center_crop(p.width, p.height, 9, 8, 8), (data[0] & 8) != 0, 8, 8,
                 PixelMap::normalized({}, {}, channels), out.data(), scratch);
        for (float v : out)
            if (!(v >= -1e-3f && v <= 1.001f)) __builtin_trap();  // an average of bytes / 255
    });
}

void tokens(const uint8_t* data, size_t size) {
    if (size < 3) return;
    const TokenFileOptions o{1 + data[0] % 32, 2 + int(data[1]) * 257, (data[2] & 1) != 0, (data[2] & 2) != 0, data[0]};
    tolerate([&] {
        InputFile in("train.bin", data + 3, size - 3, /*inflate=*/false);  // as the mapped files are read
        const Dataset ds = read_tokens(in, o);
        if (!ds.source || ds.count() == 0 || ds.count() * size_t(o.context) >= size) __builtin_trap();  // invariants
        std::vector<float> x(size_t(o.context));
        std::vector<int32_t> y(size_t(o.context));
        for (size_t i = 0; i < ds.count(); ++i) {  // every window reads inside the file, every id in range
            read_sample(ds, i, int64_t(i % 3), x.data(), y.data());
            for (int k = 0; k < o.context; ++k)
                if (y[size_t(k)] < 0 || y[size_t(k)] >= o.vocab || x[size_t(k)] < 0 || x[size_t(k)] >= float(o.vocab) ||
                    (k > 0 && x[size_t(k)] != float(y[size_t(k) - 1])))
                    __builtin_trap();
        }
    });
}

void tokenizer(const uint8_t* data, size_t size) {
    if (size < 1) return;
    const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
    tolerate([&] {
        std::unique_ptr<Tokenizer> tok;
        switch (data[0] % 3) {
            case 0:
                tok = tokenizer_from_json(text, "tokenizer.json");
                break;
            case 1: {
                if (text.size() < 2) return;
                const size_t split =
                    std::min(text.size() - 2, size_t(uint8_t(text[0])) | (size_t(uint8_t(text[1])) << 8));
                tok = tokenizer_from_vocab_merges(text.substr(2, split), text.substr(2 + split), "vocab.json",
                                                  "merges.txt");
                break;
            }
            default: {
                static const char* const names[] = {"gpt2", "r50k_base", "p50k_base", "cl100k_base", "o200k_base", "x"};
                if (text.empty()) return;
                tok = tokenizer_from_tiktoken(text.substr(1), std::string(names[uint8_t(text[0]) % 6]) + ".tiktoken");
            }
        }
        const std::string sample = "def f(x):\n    return x  # caf\xC3\xA9 \xF0\x9F\x99\x82<|endoftext|>\xFF\xC3 \n\n";
        const std::vector<uint32_t> ids = tok->encode(sample);
        for (uint32_t id : ids)
            if (id >= tok->vocab_size()) __builtin_trap();  // every id inside the vocabulary
        (void)tok->decode(ids);  // may refuse an id a lying file left without bytes, never crash
    });
}

void cifar10(const uint8_t* data, size_t size) {
    tolerate([&] {
        InputFile in("batch.bin", data, size);
        Dataset ds;
        ds.shape = {32, 32, 3};
        read_cifar10_batch(in, ds);
        if (ds.features.size() != ds.count() * 3072) __builtin_trap();
    });
}

void csv(const uint8_t* data, size_t size) {
    if (size < 1) return;
    CsvOptions o;
    const uint8_t k = data[0];
    o.header = k % 3 == 0   ? CsvOptions::Header::auto_detect
               : k % 3 == 1 ? CsvOptions::Header::yes
                            : CsvOptions::Header::no;
    const std::vector<std::string> labels[] = {{}, {"label"}, {"0"}, {"2"}, {"x1"}, {"0", "x1"}};
    o.label_columns = labels[(k / 3) % 6];
    o.delimiter = (k / 18) % 2 ? ';' : ',';
    o.targets = (k / 36) % 2;
    tolerate([&] {
        InputFile in("data.csv", data + 1, size - 1);
        const Dataset ds = read_csv(in, o);
        if (ds.features.size() != ds.count() * ds.feature_size()) __builtin_trap();
    });
}

void config(const uint8_t* data, size_t size) {
    const std::string all(reinterpret_cast<const char*>(data), size);
    const size_t nul = all.find('\0');
    const std::string text = all.substr(0, nul);
    std::vector<std::string> sets;
    if (nul != std::string::npos) {
        size_t start = nul + 1;
        while (start <= all.size() && sets.size() < 8) {
            const size_t end = std::min(all.find('\n', start), all.size());
            sets.push_back(all.substr(start, end - start));
            start = end + 1;
        }
    }
    tolerate([&] {
        const Config c = load_config_text(text, "fuzz.yaml", sets);
        (void)config_to_yaml(c);
        (void)model_config_hash(c);
        if (!c.model.input_shape.empty()) {
            const Model m(c.model.input_shape, c.model.layers, c.run.seed);
            (void)m.summary();
            (void)m.activation_bytes(4, 4, kCpuColumnBlockBytes);
            (void)m.train_flops_per_sample();
        }
    });
}

void safetensors(const uint8_t* data, size_t size) {
    tolerate([&] { (void)read_safetensors(InputFile("export.safetensors", data, size, false), false); });
    tolerate([&] { (void)read_safetensors(InputFile("ckpt.safetensors", data, size, false), true); });
    (void)peek_checkpoint_metadata(InputFile("ckpt.safetensors", data, size, false));  // never throws
    static const Model model({4}, {make_layer_spec("dense", {{"units", "3"}})}, 1);
    tolerate([&] { (void)read_checkpoint(InputFile("ckpt.safetensors", data, size, false), model, 0, "fuzz"); });
}

void checkpoint(const uint8_t* data, size_t size) {
    static const Model model({4}, {make_layer_spec("dense", {{"units", "3"}}), make_layer_spec("batchnorm", {})}, 1);
    static const std::string base = [] {
        CheckpointData d;
        d.step = 10;
        d.loader = {1, 2};
        d.seed = 1;
        d.params.assign(model.flat_size(), 0.5f);
        d.optimizer = {{"exp_avg", std::vector<float>(model.trainable_size(), 0.1f)}};
        d.model_hash = 42;
        d.model_summary = "fuzz";
        d.replicas = 2;
        d.devices = "cpu:2";
        d.train_metrics = {{0, 0, 0}, {1, 2, 3}};
        d.global_batch = 8;
        d.train_samples = 64;
        return checkpoint_bytes(model, d);
    }();
    static const char* const keys[] = {"step",       "loader_epoch", "loader_batch",    "seed",
                                       "replicas",   "global_batch", "train_samples",   "train_metrics",
                                       "loss_scale", "model_hash",   "optimizer_state", "format_version"};
    static const SafetensorsFile parsed =
        read_safetensors(InputFile("base", reinterpret_cast<const uint8_t*>(base.data()), base.size(), false), true);
    SafetensorsFile f = parsed;
    // 6-byte edits: what, which (a tensor or a key), a 32-bit value
    for (size_t i = 0; i + 6 <= size; i += 6) {
        const uint8_t op = data[i], which = data[i + 1];
        uint32_t v;
        std::memcpy(&v, data + i + 2, 4);
        auto tensor = f.tensors.empty() ? f.tensors.end() : std::next(f.tensors.begin(), which % f.tensors.size());
        const std::string key = keys[which % std::size(keys)];
        switch (op % 6) {
            case 0:  // any float, NaN and infinities included
                if (tensor != f.tensors.end() && !tensor->second.second.empty())
                    std::memcpy(&tensor->second.second[v % tensor->second.second.size()], &v, 4);
                break;
            case 1:  // a number, small or far beyond any run
                f.metadata[key] = std::to_string(int64_t(int32_t(v)) << (which % 40));
                break;
            case 2:  // another shape, its values resized to match
                if (tensor != f.tensors.end()) {
                    tensor->second.first = {int(v % 9)};
                    tensor->second.second.resize(v % 9, 1.0f);
                }
                break;
            case 3:
                if (tensor != f.tensors.end()) f.tensors.erase(tensor);
                break;
            case 4:  // another dtype
                if (tensor != f.tensors.end()) {
                    std::vector<int64_t> ints;
                    for (float x : tensor->second.second) ints.push_back(std::fabs(x) < 1e18f ? int64_t(x) : 0);
                    f.int_tensors[tensor->first] = {tensor->second.first, std::move(ints)};
                    f.tensors.erase(tensor);
                }
                break;
            default:  // text from the input
                f.metadata[key] = std::string(reinterpret_cast<const char*>(data + i + 2), 4);
        }
    }
    const std::string bytes = safetensors_bytes(f, true);
    if (size < 6) {  // no edit: the base checkpoint loads (else every input would be refused unseen)
        (void)read_checkpoint(InputFile("ckpt", reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), false),
                              model, 42, "fuzz");
        return;
    }
    tolerate([&] {
        const CheckpointData d = read_checkpoint(
            InputFile("ckpt", reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), false), model, 42, "fuzz");
        // what a resume relies on
        auto finite = [](const std::vector<float>& v) {
            return std::all_of(v.begin(), v.end(), [](float x) { return std::isfinite(x); });
        };
        if (!finite(d.params) || d.params.size() != model.flat_size()) __builtin_trap();
        for (const auto& [state, values] : d.optimizer)
            if (!finite(values) || values.size() != model.trainable_size()) __builtin_trap();
        if (d.step < 0 || d.loader.epoch < 0 || d.loader.batch < 0 || d.loader.epoch > d.step || d.replicas < 1)
            __builtin_trap();
        for (const auto& m : d.train_metrics)
            for (double x : m)
                if (!std::isfinite(x)) __builtin_trap();
    });
}

void devices(const uint8_t* data, size_t size) {
    if (size < 1) return;
    CudaStatus st;
    st.state = CudaStatus::State(data[0] % 5);
    st.devices = st.state == CudaStatus::State::ok ? 1 + data[0] % 8 : 0;
    st.reason = "fuzz";
    tolerate(
        [&] { (void)parse_devices(std::string(reinterpret_cast<const char*>(data + 1), size - 1), st).describe(); });
}

void profile(const uint8_t* data, size_t size) {
    tolerate([&] {
        const double s = profile_seconds_per_sample(std::string(reinterpret_cast<const char*>(data), size), "p.json");
        if (!(s > 0 && std::isfinite(s))) __builtin_trap();  // what the planner divides by
    });
}

}  // namespace mirrored::fuzz
