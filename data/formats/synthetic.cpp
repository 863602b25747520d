// synthetic: Gaussian inputs labelled by a fixed random linear teacher, made in memory from the
// config alone (no files): learnable, not noise. For tests, benchmarks and a first run. With
// `vocab`, a language model's windows instead: random token ids, each position labelled with the
// next (what `plan` and the benchmarks time a language model on).
#include <random>

#include "base/io.h"
#include "data/datasets.h"

namespace mirrored {

namespace {

struct SyntheticConfig final : OptionsOf<SyntheticConfig> {
    std::vector<int> input_shape{784};
    int classes = 10;
    size_t train_samples = 60000, test_samples = 10000;
    int vocab = 0;  // > 0: token windows of input_shape [context]
    Fields fields() const override {
        std::vector<std::string> shape;
        for (int d : input_shape) shape.push_back(std::to_string(d));
        return {{"input_shape", yaml_list(shape)},
                {"classes", std::to_string(classes)},
                {"train_samples", std::to_string(train_samples)},
                {"test_samples", std::to_string(test_samples)},
                {"vocab", std::to_string(vocab)}};
    }
    bool operator==(const SyntheticConfig&) const = default;
};

OptionsPtr read(SpecReader& r, const std::string& p, bool) {
    auto o = std::make_shared<SyntheticConfig>();
    o->input_shape = r.integer_list(p + ".input_shape", o->input_shape, 1, 1 << 20);
    o->classes = int(r.integer(p + ".classes", 10, 2, 1 << 20));
    o->train_samples = size_t(r.integer(p + ".train_samples", 60000, 1, int64_t(1) << 32));
    o->test_samples = size_t(r.integer(p + ".test_samples", 10000, 1, int64_t(1) << 32));
    o->vocab = int(r.integer(p + ".vocab", 0, 0, 1 << 24));
    if (o->vocab && o->input_shape.size() != 1)
        r.fail(p + ".input_shape", "token windows (vocab) take a shape [context]");
    return o;
}

// Made in memory from the config alone: sizes that overflow or do not fit are refused before
// anything is allocated.
void check_size(const SyntheticConfig& c) {
    uint64_t features = 1;
    for (int d : c.input_shape)
        if (d <= 0 || !checked_mul(features, uint64_t(d), features) || features > (uint64_t(1) << 26))
            throw ConfigError("data.input_shape", "more than 2^26 features per sample is implausibly large");
    uint64_t bytes = 0, test = 0, teacher = 0;
    const uint64_t avail = available_host_memory();
    if (!checked_mul(c.train_samples, features * 4 + 4, bytes) ||
        !checked_mul(c.test_samples, features * 4 + 4, test) ||
        !checked_mul(uint64_t(c.classes), features * 4, teacher) || !checked_add(bytes, test, bytes) ||
        !checked_add(bytes, teacher, bytes) || (avail && bytes > avail))
        throw ConfigError("data.train_samples",
                          std::to_string(c.train_samples) + " + " + std::to_string(c.test_samples) + " samples of " +
                              std::to_string(features) + " features need " +
                              (bytes ? format_bytes(bytes) : std::string("more memory than exists")) + ", " +
                              format_bytes(avail) + " are available");
}

// Windows of a random token stream, as data/formats/tokens.cpp cuts a file: position i's label is
// the input at i + 1.
Dataset token_windows(const SyntheticConfig& c, size_t samples, uint64_t seed) {
    const size_t t = size_t(c.input_shape[0]), n = samples * t;
    std::mt19937_64 rng(seed);
    std::vector<int32_t> stream(n + 1);
    for (int32_t& id : stream) id = int32_t(rng() % uint64_t(c.vocab));
    Dataset ds;
    ds.name = "synthetic tokens";
    ds.labels_source = "synthetic tokens";
    ds.shape = {int(t)};
    ds.classes = c.vocab;
    ds.label_size = int(t);
    ds.tokens = true;
    resize_features(ds.features, n);
    for (size_t i = 0; i < n; ++i) ds.features[i] = float(stream[i]);
    ds.labels.assign(stream.begin() + 1, stream.end());
    return ds;
}

Datasets load(const Options& options, const DataSource& src) {
    const auto& c = options_as<SyntheticConfig>(options);
    check_size(c);
    if (c.vocab)
        return {token_windows(c, c.train_samples, src.seed), token_windows(c, c.test_samples, src.seed + 1), {}};
    SyntheticOptions o;
    o.shape = c.input_shape;
    o.classes = c.classes;
    o.seed = src.seed;
    o.samples = c.train_samples;
    Datasets out;
    out.train = make_synthetic(o);
    o.samples = c.test_samples;
    o.split = 1;
    out.test = make_synthetic(o);
    return out;
}

std::vector<std::string> inputs(const Options&) { return {}; }  // generated: no file

}  // namespace

extern const DataFormat kSyntheticFormat{"synthetic", ".", "", read, load, inputs};

}  // namespace mirrored
