#include "tests/fuzz/targets.h"

#include <cmath>
#include <string>
#include <vector>

#include "data/dataset.h"
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
