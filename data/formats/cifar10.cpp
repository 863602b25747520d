// cifar10: CIFAR-10's binary batches, a list of files per split (records of a label byte and a
// 32x32 RGB image in planes).
#include "data/datasets.h"

namespace mirrored {

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
