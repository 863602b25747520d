// synthetic: Gaussian inputs labelled by a fixed random linear teacher, made in memory from the
// config alone (no files): learnable, not noise. For tests, benchmarks and a first run. With
// `vocab`, a language model's windows instead: random token ids, each position labelled with the
// next (what `plan` and the benchmarks time a language model on).
#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>

#include "base/io.h"
#include "data/datasets.h"
#include "base/philox.h"
#include "data/formats/reading.h"

namespace mirrored {

Dataset make_synthetic(const SyntheticOptions& o) {
    Dataset ds;
    ds.name = "synthetic";
    ds.labels_source = "synthetic data";
    ds.shape = o.shape;
    ds.classes = o.classes;
    if (o.classes < 2) throw DataError("synthetic: classes must be at least 2");
    const size_t fs = ds.feature_size();
    // The teacher depends on the seed alone, so train and test splits share the rule.
    std::vector<float> teacher(size_t(o.classes) * fs);
    for (size_t i = 0; i < teacher.size(); ++i) {
        const Philox4 r = philox(o.seed, i, kStreamSynthetic, 0xFFFFFFFFu);
        teacher[i] = normal_from(r.v[0], r.v[1]);
    }
    resize_features(ds.features, o.samples * fs);
    ds.labels.resize(o.samples);
    auto make = [&](size_t begin, size_t end) {
        std::vector<double> score(size_t(o.classes));
        for (size_t s = begin; s < end; ++s) {
            float* x = &ds.features[s * fs];
            for (size_t j = 0; j < fs; ++j) {
                const Philox4 r = philox(o.seed, s * fs + j, kStreamSynthetic, o.split);
                x[j] = normal_from(r.v[0], r.v[1]);
            }
            int best = 0;
            for (int c = 0; c < o.classes; ++c) {
                double acc = 0;
                const float* w = &teacher[size_t(c) * fs];
                for (size_t j = 0; j < fs; ++j) acc += double(w[j]) * x[j];
                score[size_t(c)] = acc;
                if (acc > score[size_t(best)]) best = c;
            }
            ds.labels[s] = best;
        }
    };
    // Samples in contiguous ranges, one per thread: a benchmark's data is ready in a fraction of
    // the time on a many-core GPU host, and the same bits whatever the thread count.
    const size_t hw = std::max(1u, std::thread::hardware_concurrency());
    const size_t threads =
        std::min<size_t>({o.threads > 0 ? size_t(o.threads) : hw, 64, std::max<size_t>(1, o.samples / 256)});
    const auto range = [&](size_t t) { make(o.samples * t / threads, o.samples * (t + 1) / threads); };
    std::vector<std::thread> pool;
    pool.reserve(threads);
    size_t started = 1;
    try {
        for (; started < threads; ++started) pool.emplace_back(range, started);
    } catch (const std::system_error&) {
        // The system refused a thread: this thread makes the rest, the same data, later.
    }
    for (size_t t = started; t < threads; ++t) range(t);
    range(0);
    for (auto& th : pool) th.join();
    return ds;
}

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
