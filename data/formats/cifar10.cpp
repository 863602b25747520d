// cifar10: CIFAR-10's binary batches, a list of files per split (records of a label byte and a
// 32x32 RGB image in planes).
#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include "data/datasets.h"
#include "data/formats/reading.h"

namespace mirrored {

constexpr size_t kCifarRecord = 1 + 3 * 32 * 32, kCifarRecordFloats = 3 * 32 * 32;  // bytes on disk, floats

void read_cifar10_batch(InputFile& in, Dataset& ds) {
    constexpr size_t kRecord = kCifarRecord, kPlane = 32 * 32;
    const std::string& path = in.path();
    std::vector<unsigned char> b;
    as_data_error([&] { in.read_rest(b, size_t(std::min<uint64_t>(memory_bound() / 4, SIZE_MAX)), "the batch file"); });
    if (b.empty()) throw DataError(path + ": empty file");
    if (b.size() % kRecord != 0)
        throw DataError(path + ": " + std::to_string(b.size()) + " bytes is not a whole number of " +
                        std::to_string(kRecord) + "-byte CIFAR-10 records (truncated or not CIFAR-10)");
    const size_t n = b.size() / kRecord, base = ds.labels.size();
    if (base + n > kMaxSamples) throw DataError(path + ": more than 2^31 - 1 records in all");
    resize_features(ds.features, (base + n) * 3 * kPlane);
    for (size_t i = 0; i < n; ++i) {
        const unsigned char* r = &b[i * kRecord];
        if (r[0] > 9)
            throw DataError(path + ": label " + std::to_string(r[0]) + " of record " + std::to_string(i) +
                            " is outside [0, 10)");
        ds.labels.push_back(r[0]);
        float* out = &ds.features[(base + i) * 3 * kPlane];
        for (size_t p = 0; p < kPlane; ++p)  // CHW planes -> HWC
            for (size_t c = 0; c < 3; ++c) out[p * 3 + c] = r[1 + c * kPlane + p] * (1.0f / 255.0f);
    }
}

Dataset read_cifar10(const std::vector<std::string>& paths) {
    Dataset ds;
    ds.name = paths.empty() ? "cifar10" : paths.front();
    ds.labels_source = ds.name;
    ds.shape = {32, 32, 3};
    ds.classes = 10;
    if (paths.empty()) throw DataError("cifar10: no batch files given");
    // The uncompressed files' records, counted from their sizes: the data set is sized once
    // instead of regrown file by file (each file is still checked as it is read).
    uint64_t records = 0;
    for (const auto& path : paths)
        as_data_error([&] {
            InputFile in(path);
            if (!in.compressed()) records += in.file_size() / kCifarRecord;
        });
    reserve_samples(ds, records, kCifarRecordFloats);
    for (const auto& path : paths) {
        as_data_error([&] {
            InputFile in(path);
            read_cifar10_batch(in, ds);
        });
    }
    return ds;
}

namespace {

struct Cifar10Options final : OptionsOf<Cifar10Options> {
    std::vector<std::string> train{"data_batch_1.bin", "data_batch_2.bin", "data_batch_3.bin", "data_batch_4.bin",
                                   "data_batch_5.bin"};
    std::vector<std::string> test{"test_batch.bin"};
    Fields fields() const override { return {{"train.files", yaml_list(train)}, {"test.files", yaml_list(test)}}; }
    bool operator==(const Cifar10Options&) const = default;
};

OptionsPtr read(SpecReader& r, const std::string& p, bool) {
    auto o = std::make_shared<Cifar10Options>();
    for (auto [split, files] : {std::pair{".train", &o->train}, std::pair{".test", &o->test}}) {
        r.expect_map(p + split);
        const std::string key = p + split + ".files";
        std::vector<std::string> given = r.text_list(key);
        if (!given.empty()) *files = std::move(given);
        else if (r.has(key)) r.fail(key, "expected at least one batch file (leave the key out for the default list)");
    }
    return o;
}

Datasets load(const Options& options, const DataSource& src) {
    const auto& o = options_as<Cifar10Options>(options);
    auto paths = [&](const std::vector<std::string>& files) {
        std::vector<std::string> v;
        for (const auto& f : files) v.push_back(src.path(f));
        return v;
    };
    Datasets out;
    out.train = read_cifar10(paths(o.train));
    out.test = read_cifar10(paths(o.test));
    return out;
}

std::vector<std::string> inputs(const Options& opts) {
    const auto& o = options_as<Cifar10Options>(opts);
    std::vector<std::string> files = o.train;
    files.insert(files.end(), o.test.begin(), o.test.end());
    return files;
}

}  // namespace

extern const DataFormat kCifar10Format{"cifar10", ".", "", read, load, inputs};

}  // namespace mirrored
