// The data section of a run: which dataset, where its files are, how it is preprocessed and
// loaded. load_datasets() turns it into normalised train and test sets.
#pragma once

#include <string>
#include <vector>

#include "data/dataset.h"
#include "base/registry.h"
#include "base/spec_reader.h"
#include "data/loader.h"

namespace mirrored {

struct DataConfig {
    std::string dataset =
        "idx";          // the format (data/formats/): idx | cifar10 | csv | npy | synthetic | tokens | image_folder
    OptionsPtr format;  // the format's own keys (its files, ...); null: its defaults
    std::string root = "/usr/share/datasets/fashion-mnist";
    // preprocessing
    enum class Normalize { auto_compute, none, given } normalize = Normalize::auto_compute;
    Normalization normalization;  // when given
    AugmentOptions augment;
    // loading
    int loader_threads = 0;  // 0: auto (1 with CPU replicas, which take every core; 2 with GPUs)
    int prefetch = 4;
    bool drop_last = true;
    // Not a key: the loss reads float targets, so label columns hold targets, not class indexes.
    bool targets = false;
    bool operator==(const DataConfig& o) const {
        return dataset == o.dataset && same_options(format, o.format) && root == o.root && normalize == o.normalize &&
               normalization == o.normalization && augment == o.augment && loader_threads == o.loader_threads &&
               prefetch == o.prefetch && drop_last == o.drop_last && targets == o.targets;
    }
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

// What a format's loader is given besides its own keys.
struct DataSource {
    const DataConfig& config;
    std::string base_dir;  // the config file's folder: a relative root is taken from there
    uint64_t seed;
    // `file` resolved against the data root; a missing one is a DataError saying where the root
    // came from (data.root or MIRRORED_DATA_DIR).
    std::string path(const std::string& file) const;
};

// A data format: its name (data.dataset), its root when data.root is not given, a hint for a
// missing file under that default root, how its own keys are read (under `data`; targets: the loss
// reads float targets), and how both splits are read (not yet normalised: load_datasets does
// that). Each lives in data/formats/.
struct DataFormat {
    const char* name;
    const char* default_root;
    const char* missing_hint;
    OptionsPtr (*read)(SpecReader& r, const std::string& path, bool targets);
    Datasets (*load)(const Options& o, const DataSource& src);
    // The files and folders it reads, as its keys name them (relative to the data root, or
    // absolute): what no output of a command may replace (data_inputs).
    std::vector<std::string> (*inputs)(const Options& o);
};
const Registry<DataFormat>& data_formats();  // datasets.cpp lists every format
// Every file and folder c's data section reads, resolved, as (what, path) pairs: the inputs that
// no output of a command may replace or write into (base/output.h's OutputTarget::inputs).
std::vector<std::pair<std::string, std::string>> data_inputs(const DataConfig& c, const std::string& base_dir);
// c.format, or its format's defaults when there are none.
OptionsPtr data_format_options(const DataConfig& c);
// data.mmap (the npy and idx formats): read at `key` (auto, always, never), and its name.
MapFeatures read_map_features(SpecReader& r, const std::string& key);
const char* map_features_name(MapFeatures mode);
// A data config from code: the format and its own keys through its reader ({"train.file", "a.csv"}).
DataConfig make_data_config(const std::string& format, const Fields& keys = {}, bool targets = false);

}  // namespace mirrored
