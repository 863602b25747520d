// The data section of a run: which dataset, where its files are, how it is preprocessed and
// loaded. load_datasets() turns it into normalised train and test sets.
#pragma once

#include <string>
#include <vector>

#include "data/dataset.h"
#include "data/loader.h"

namespace mirrored {

struct DataConfig {
    std::string dataset = "idx";  // idx | cifar10 | csv | synthetic
    std::string root = "/usr/share/datasets/fashion-mnist";
    struct Split {
        std::string images, labels;       // idx
        std::vector<std::string> files;   // cifar10
        std::string file;                 // csv
        bool operator==(const Split&) const = default;
    };
    Split train{"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", {}, {}};
    Split test{"t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz", {}, {}};
    CsvOptions csv;
    // synthetic
    std::vector<int> input_shape{784};
    int classes = 10;
    size_t train_samples = 60000, test_samples = 10000;
    // preprocessing
    enum class Normalize { auto_compute, none, given } normalize = Normalize::auto_compute;
    Normalization normalization;  // when given
    AugmentOptions augment;
    // loading
    int loader_threads = 0;  // 0: auto (1 with CPU replicas, which take every core; 2 with GPUs)
    int prefetch = 4;
    bool drop_last = true;
    bool operator==(const DataConfig&) const = default;
};

struct Datasets {
    Dataset train, test;
    Normalization normalization;  // what was applied (empty for none)
};

// Resolves a data file: absolute paths stay, others are joined to root. root itself, when
// relative, is taken relative to base_dir (the config file's folder). MIRRORED_DATA_DIR, when
// set, replaces root.
std::string resolve_data_path(const DataConfig& c, const std::string& base_dir, const std::string& file);
std::string effective_data_root(const DataConfig& c, const std::string& base_dir);

Datasets load_datasets(const DataConfig& c, const std::string& base_dir, uint64_t seed);

}  // namespace mirrored
