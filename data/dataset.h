// In-memory datasets and their readers. Every reader validates what it reads (magic numbers,
// dimensions, sizes against the file, label ranges, image/label agreement) and throws DataError
// "<path>: <what is wrong>" rather than returning a shortened or garbled dataset.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace mirrored {

struct Normalization;

// Samples read on demand instead of held in Dataset::features and labels: a token file mapped
// into memory (data/formats/tokens.cpp) is never copied whole, so it may be larger than memory.
// read() is called from every loader thread at once.
class SampleSource {
public:
    virtual ~SampleSource() = default;
    virtual size_t count() const = 0;
    // Sample idx as drawn in `epoch` (a source may draw another window each epoch): its features
    // [feature_size] and its labels [label_size]; either pointer may be null.
    virtual void read(uint32_t idx, int64_t epoch, float* features, int32_t* labels) const = 0;
    virtual uint64_t fingerprint() const = 0;  // of what it reads (fingerprint() below), taken when opened
    // The same samples normalised (normalize() below); sources of values that are not measurements
    // (token ids) never are.
    virtual std::shared_ptr<const SampleSource> normalized(const Normalization& n) const;
    // Each channel's sum and sum of squares over every sample, in sample order, when the source
    // took them when opened (compute_normalization then uses every sample, as for data in memory).
    virtual bool channel_sums(std::vector<double>&, std::vector<double>&) const { return false; }
    // Samples that could not be read and were replaced (data.on_bad_file: skip), so far.
    virtual uint64_t bad_reads() const { return 0; }
    // read() with the seconds of its stages added up (bench-loader's split): reading the file,
    // decoding it, and transforming it (crop, resize, flip, normalise). A source without such
    // stages counts its whole read() as reading.
    struct Stages {
        double read = 0, decode = 0, transform = 0;
    };
    virtual void read_timed(uint32_t idx, int64_t epoch, float* features, Stages& s) const;
};

// Samples are stored flat, already scaled (u8 images to [0,1]) and, after normalize(), already
// normalised, so the loader only copies. The channel axis is the last axis of `shape`
// (HWC images; for tabular data every feature is a channel).
// A sample's label is a class index (`labels`, for classifiers) or `target_size` floats (`targets`,
// for regression and multi-label losses): which one, the loss decides (LabelKind).
struct Dataset {
    std::string name;
    std::string labels_source;  // the file the labels came from (for error messages)
    std::vector<int> shape;     // per sample, e.g. {28, 28, 1}
    int classes = 0;
    std::vector<float> features;   // [count, feature_size]
    std::vector<int32_t> labels;   // [count, label_size], each in [0, classes); empty when there are targets
    int label_size = 1;            // class labels per sample: 1, or a sequence's length (next tokens)
    bool tokens = false;           // features are token ids (data/formats/tokens.cpp): never normalised
    double bytes_per_token = 0;    // token files: the text's bytes per token where known (meta.json), else 0
    int target_size = 0;           // floats per sample's target; 0: class labels
    std::vector<float> targets;    // [count, target_size]
    std::vector<float> pad_value;  // per channel: what a raw 0 became after normalisation
    std::shared_ptr<const SampleSource> source;  // samples read on demand; features and labels stay empty
    std::vector<std::string> skipped_files;      // "<path>: <why>", left out when opened (on_bad_file: skip)

    size_t count() const {
        if (source) return source->count();
        return target_size ? targets.size() / size_t(target_size) : labels.size() / size_t(label_size);
    }
    bool has_targets() const { return target_size > 0; }
    size_t feature_size() const;
    int channels() const { return shape.empty() ? 1 : shape.back(); }
};

// A 64-bit hash of what a data set holds (shape, classes, every feature's bits, every label):
// another file, an edited label or another normalisation changes it. Several GB/s, so cheap to
// take at every start; checkpoints record the training set's, and a resume compares.
uint64_t fingerprint(const Dataset& d);

// The hash fingerprint() is made of, fed piece by piece (a SampleSource hashes its file with it).
class Fingerprint {
public:
    void add(const void* data, size_t bytes);
    uint64_t value() const;

private:
    uint64_t lane_[4] = {1, 2, 3, 4};
};

// A source's fingerprint once normalised: its own with the per-channel values it applies.
uint64_t normalized_fingerprint(uint64_t fingerprint, const std::vector<float>& mean, const std::vector<float>& scale);

// Sample i's features and labels (either may be null), wherever the data set keeps them.
void read_sample(const Dataset& d, size_t i, int64_t epoch, float* features, int32_t* labels);
// The features of samples [0, n) in one block: the data set's own, or read from its source into
// scratch (epoch 0).
const float* first_features(const Dataset& d, size_t n, std::vector<float>& scratch);

// Sizes a data set's features to n floats; a new buffer asks for 2 MiB pages before its first
// touch (data/readers.cpp says why).
void resize_features(std::vector<float>& features, size_t n);
// The same capacity without the size: a reader that knows the total up front grows no further.
void reserve_features(std::vector<float>& features, size_t n);
// Asks for 2 MiB pages for features already filled: pages are copied into huge ones now where the
// kernel can (for a reader that could not size its buffer with resize_features up front).
void prefer_huge_pages(std::vector<float>& features);

class InputFile;

// ---- readers ----------------------------------------------------------------------------
// Every reader opens only regular files, reads no more than the format promises and memory
// allows, checks size arithmetic for overflow, and rejects trailing bytes.
// IDX (MNIST / Fashion-MNIST). Either file may be gzip-compressed.
Dataset read_idx(const std::string& images_path, const std::string& labels_path);
Dataset read_idx(InputFile& images, InputFile& labels);
// CIFAR-10 binary batches: records of 1 label byte + 3072 bytes (R, G, B planes of 32x32).
Dataset read_cifar10(const std::vector<std::string>& paths);
void read_cifar10_batch(InputFile& in, Dataset& ds);  // appends one batch file's records

struct CsvOptions {
    // Header names or 0-based indexes; empty: "label", else the last column. One column of class
    // indexes, or with `targets` one or more columns of float targets.
    std::vector<std::string> label_columns;
    bool targets = false;
    enum class Header { auto_detect, yes, no } header = Header::auto_detect;
    char delimiter = ',';
    bool operator==(const CsvOptions&) const = default;
};
Dataset read_csv(const std::string& path, const CsvOptions& options);
Dataset read_csv(InputFile& in, const CsvOptions& options);

// The same with the images memory-mapped (an uncompressed file), read sample by sample, as
// read_npy_mapped reads its features.
Dataset read_idx_mapped(const std::string& images_path, const std::string& labels_path);

// data.mmap: whether a features file is memory-mapped - an uncompressed one, when asked or when
// it is over an eighth of the machine's memory (as floats it could fill half of it; MemTotal, so
// every start of a run decides alike). DataError when `always` meets a gzip file.
enum class MapFeatures { auto_size, always, never };
bool map_features(const std::string& path, MapFeatures mode);

// NumPy .npy arrays (format versions 1-3, C order, little- or big-endian bool/int/uint/float; never
// object arrays): features [N, F], [N, H, W] or [N, H, W, C] (uint8 scaled to [0, 1], as the image
// formats are); labels [N] of integer classes, or with `targets` [N] or [N, K] float targets.
// Either file may be gzip-compressed.
Dataset read_npy(const std::string& features_path, const std::string& labels_path, bool targets);
Dataset read_npy(InputFile& features, InputFile& labels, bool targets);
// The same with the features memory-mapped (an uncompressed .npy file), read sample by sample:
// features larger than memory train. Opening checks every value and hashes the file in one pass;
// the samples and their normalisation are bit-identical to read_npy's.
Dataset read_npy_mapped(const std::string& features_path, InputFile& labels, bool targets);

// A language model's token file (data/formats/tokens.cpp): nanoGPT's raw little-endian uint16 (or
// uint32) ids, or llm.c's 1024-byte header then uint16 (version 1) or uint32 (version 2) ids; every
// id below vocab. Samples are windows of context + 1 tokens - inputs and next-token labels - read
// from the file mapped into memory (Dataset::source): tiled (window i starts at i * context) or,
// with random_windows, starting anywhere, drawn from (seed, epoch, sample index).
struct TokenFileOptions {
    int context = 0;
    int vocab = 256;
    bool uint32 = false;  // raw files: 4-byte ids
    bool random_windows = false;
    uint64_t seed = 1;
};
Dataset read_tokens(const std::string& path, const TokenFileOptions& o);
// The same over a file read into memory (tests, fuzzing).
Dataset read_tokens(InputFile& in, const TokenFileOptions& o);
// A token file read_tokens reads back, written to a descriptor as ids arrive: nanoGPT's raw uint16,
// or with `wide` (ids past 65,535) llm.c's header, version 2, and uint32 ids, the header's count
// written by finish(). DataError past 2^31 - 1 ids (that count); write errors as write_all's.
class TokenFileWriter {
public:
    TokenFileWriter(int fd, std::string path, std::string tmp, bool wide);
    void append(const std::vector<uint32_t>& ids);
    void finish();
    uint64_t tokens() const { return tokens_; }

private:
    int fd_;
    std::string path_, tmp_;
    bool wide_;
    uint64_t tokens_ = 0;
    std::string buffer_;
};

struct SyntheticOptions {
    std::vector<int> shape{784};
    int classes = 10;
    size_t samples = 60000;
    uint64_t seed = 1;
    uint32_t split = 0;  // 0 train, 1 test: other samples, the same rule
    int threads = 0;     // 0: one per core (each sample is a function of its index: any count gives the same data)
};
// Gaussian inputs labelled by a fixed random linear teacher (argmax of W x): learnable, not noise.
Dataset make_synthetic(const SyntheticOptions& options);

// ---- preprocessing ----------------------------------------------------------------------
struct Normalization {
    std::vector<float> mean, std;  // per channel
    bool operator==(const Normalization&) const = default;
};
// Over every sample, or for a data set read on demand over up to 512 samples spread evenly across
// it (epoch 0: augmented as the first epoch is).
Normalization compute_normalization(const Dataset& train);
void normalize(Dataset& ds, const Normalization& n);  // in place; sets pad_value

// Whole-file read, transparently gunzipping (by magic bytes), bounded by the memory available.
// Throws DataError naming the path.
std::vector<unsigned char> read_file(const std::string& path);

}  // namespace mirrored
