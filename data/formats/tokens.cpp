// tokens: a language model's token files, as nanoGPT writes them (train.bin / val.bin: raw
// little-endian uint16 ids) or as llm.c writes them (a header of 256 int32 - magic 20240520,
// version 1 for uint16 ids or 2 for uint32, the token count - then the ids); `dtype: uint32` for
// raw files of vocabularies over 65,535.
//
// A sample is a window of context + 1 tokens: its first `context` ids are the input, the last
// `context` the labels (each position predicts the next token). The file is mapped, not read:
// one larger than memory trains, and only the pages the windows touch are resident.
// `windows: tiled` (the default): window i starts at token i * context, so the windows cover the
// file once per epoch and overlap by one token; the loader shuffles and shards them like any
// samples. `windows: random` (nanoGPT's sampling): window i of epoch e starts anywhere, drawn from
// Philox(seed, i, e), as many windows per epoch as tiled. Either way a window is a function of
// (seed, epoch, index), so N replicas train exactly as one and a resume is exact. The test split
// is always tiled: every evaluation reads the same tokens.
//
// A meta.json beside the files (scripts/prepare_text.py writes one) gives each file's text bytes
// and tokens ({"bytes": {"val": B}, "tokens": {"val": N}} for val.bin): the loss is then also
// reported in bits per byte, comparable across tokenizers. Used only when its token count is the
// file's (a stale meta.json is ignored); one that is not JSON is an error naming it.
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/io.h"
#include "base/output.h"
#include "base/philox.h"
#include "data/datasets.h"

namespace mirrored {

namespace {

struct TokensOptions final : OptionsOf<TokensOptions> {
    std::string train = "train.bin", test = "val.bin";
    int context = 0;
    int vocab = 256;
    bool uint32 = false;  // raw files: 4-byte ids (llm.c files say so in their header)
    bool random_windows = false;
    Fields fields() const override {
        return {{"train", train},
                {"test", test},
                {"context", std::to_string(context)},
                {"vocab", std::to_string(vocab)},
                {"dtype", uint32 ? "uint32" : "uint16"},
                {"windows", random_windows ? "random" : "tiled"}};
    }
    bool operator==(const TokensOptions&) const = default;
};

OptionsPtr read(SpecReader& r, const std::string& p, bool) {
    auto o = std::make_shared<TokensOptions>();
    o->train = r.nonempty_text(p + ".train", o->train);
    o->test = r.nonempty_text(p + ".test", o->test);
    o->context = int(r.integer(p + ".context", 0, 1, 1 << 16));
    if (o->context == 0)
        r.fail(p + ".context", "required for dataset tokens: the tokens per sample, e.g. 256 (model.input_shape)");
    o->vocab = int(r.integer(p + ".vocab", 256, 2, 1 << 24));
    o->uint32 = r.choice(p + ".dtype", "uint16", {"uint16", "uint32"}) == "uint32";
    o->random_windows = r.choice(p + ".windows", "tiled", {"tiled", "random"}) == "random";
    return o;
}

constexpr int32_t kLlmcMagic = 20240520;
constexpr size_t kLlmcHeaderBytes = 256 * sizeof(int32_t);

uint32_t read_le(const unsigned char* p, size_t width) {
    uint32_t v = 0;
    for (size_t b = 0; b < width; ++b) v |= uint32_t(p[b]) << (8 * b);
    return v;
}

// llm.c's header, as far as the file goes: its magic, a version it writes (1 or 2), and the 253
// reserved ints it leaves zero. A raw file whose first ids happen to spell the magic (55432, 308 as
// uint16) is raw: 506 zero ids after them would be needed to read as a header.
bool llmc_header(const unsigned char* bytes, size_t size) {
    if (size < 4 || int32_t(read_le(bytes, 4)) != kLlmcMagic) return false;
    if (size >= 8 && read_le(bytes + 4, 4) != 1 && read_le(bytes + 4, 4) != 2) return false;
    const unsigned char* reserved = bytes + std::min<size_t>(size, 12);
    return std::all_of(reserved, bytes + std::min(size, kLlmcHeaderBytes), [](unsigned char b) { return b == 0; });
}

// The windows of one token file, over bytes that stay where they are (a mapping, or a buffer read
// into memory for the fuzzer); checked and hashed once when opened.
class TokenWindows final : public SampleSource {
public:
    TokenWindows(const std::string& path, std::shared_ptr<const void> owner, const unsigned char* bytes, size_t size,
                 const TokenFileOptions& o)
        : owner_(std::move(owner)), context_(size_t(o.context)), random_(o.random_windows), seed_(o.seed) {
        width_ = o.uint32 ? 4 : 2;
        size_t begin = 0;
        if (llmc_header(bytes, size)) {
            if (size < kLlmcHeaderBytes)
                throw DataError(path + ": an llm.c token file (magic 20240520) whose header is cut short: " +
                                std::to_string(size) + " of 1024 bytes");
            const uint32_t version = read_le(bytes + 4, 4), count = read_le(bytes + 8, 4);
            begin = kLlmcHeaderBytes;
            width_ = version == 1 ? 2 : 4;
            if ((size - begin) / width_ != count || (size - begin) % width_)
                throw DataError(path + ": the header says " + std::to_string(count) + " tokens, the file holds " +
                                std::to_string(size - begin) + " bytes of " + std::to_string(width_) +
                                "-byte ids after it");
        } else if (size % width_) {
            throw DataError(path + ": " + std::to_string(size) + " bytes is not a whole number of " +
                            std::to_string(width_) + "-byte token ids (data.dtype)");
        }
        ids_ = bytes + begin;
        tokens_ = (size - begin) / width_;
        if (tokens_ < context_ + 1)
            throw DataError(path + ": " + std::to_string(tokens_) +
                            " tokens, shorter than one window of data.context + 1 = " + std::to_string(context_ + 1));
        windows_ = (tokens_ - 1) / context_;
        if (windows_ > UINT32_MAX)  // the loader's sample indexes are 32-bit
            throw DataError(path + ": " + std::to_string(windows_) + " windows of data.context = " +
                            std::to_string(context_) + " tokens; at most 2^32 - 1: use a longer context");
        check_and_hash(path, begin, o);
    }

    size_t count() const override { return windows_; }
    size_t tokens() const { return tokens_; }
    uint64_t fingerprint() const override { return fingerprint_; }

    void read(uint32_t idx, int64_t epoch, float* features, int32_t* labels) const override {
        size_t start = size_t(idx) * context_;
        if (random_) {  // uniform over the tokens_ - context_ windows that fit
            const Philox4 r = philox(seed_, idx, kStreamWindows, static_cast<uint32_t>(epoch));
            const uint64_t x = (uint64_t(r.v[0]) << 32) | r.v[1];
            start = size_t((static_cast<unsigned __int128>(x) * (tokens_ - context_)) >> 64);
        }
        const unsigned char* p = ids_ + start * width_;
        if (width_ == 2) copy_window<uint16_t>(p, features, labels);
        else copy_window<uint32_t>(p, features, labels);
    }

private:
    template <typename Id>
    void copy_window(const unsigned char* p, float* features, int32_t* labels) const {
        Id w[2];  // little-endian hosts only (the project's), so ids load as they are
        static_assert(std::endian::native == std::endian::little);
        for (size_t i = 0; i < context_; ++i) {
            std::memcpy(w, p + i * sizeof(Id), 2 * sizeof(Id));
            if (features) features[i] = float(w[0]);
            if (labels) labels[i] = int32_t(w[1]);
        }
    }

    // Every id below the vocabulary (the first bad one named by its byte offset), and the hash of
    // the ids with what shapes the samples: one sequential pass, a block at a time.
    void check_and_hash(const std::string& path, size_t begin, const TokenFileOptions& o) {
        Fingerprint f;
        const int64_t head[5] = {o.vocab, int64_t(context_), int64_t(width_), random_ ? 1 : 0,
                                 int64_t(random_ ? seed_ : 0)};
        f.add(head, sizeof head);
        constexpr size_t kBlock = size_t(1) << 16;  // ids per block
        for (size_t first = 0; first < tokens_; first += kBlock) {
            const size_t n = std::min(kBlock, tokens_ - first);
            const unsigned char* p = ids_ + first * width_;
            uint32_t top = 0;
            if (width_ == 2) top = max_id<uint16_t>(p, n);
            else top = max_id<uint32_t>(p, n);
            if (top >= uint32_t(o.vocab))
                for (size_t i = 0; i < n; ++i)
                    if (read_le(p + i * width_, width_) >= uint32_t(o.vocab))
                        throw DataError(path + ": token " + std::to_string(read_le(p + i * width_, width_)) +
                                        " at byte offset " + std::to_string(begin + (first + i) * width_) +
                                        " is outside the vocabulary [0, " + std::to_string(o.vocab) + ") (data.vocab)");
            f.add(p, n * width_);
        }
        fingerprint_ = f.value();
    }

    template <typename Id>
    static uint32_t max_id(const unsigned char* p, size_t n) {
        Id top = 0;
        for (size_t i = 0; i < n; ++i) {
            Id v;
            std::memcpy(&v, p + i * sizeof(Id), sizeof(Id));
            top = std::max(top, v);
        }
        return top;
    }

    std::shared_ptr<const void> owner_;  // keeps the bytes alive
    const unsigned char* ids_ = nullptr;
    size_t width_ = 2, tokens_ = 0, context_ = 0, windows_ = 0;
    bool random_ = false;
    uint64_t seed_ = 1;
    uint64_t fingerprint_ = 0;
};

Dataset token_dataset(const std::string& path, std::shared_ptr<const SampleSource> source, const TokenFileOptions& o) {
    Dataset ds;
    ds.name = path;
    ds.labels_source = path;
    ds.shape = {o.context};
    ds.classes = o.vocab;
    ds.label_size = o.context;
    ds.tokens = true;
    ds.source = std::move(source);
    return ds;
}

}  // namespace

// The text bytes per token of the file at `path` (holding `tokens` ids) from the meta.json beside
// it, or 0 where none says.
double bytes_per_token(const std::string& path, size_t tokens) {
    namespace fs = std::filesystem;
    const fs::path file(path), meta = file.parent_path() / "meta.json";
    std::error_code ec;
    if (!fs::is_regular_file(meta, ec)) return 0;
    std::ifstream in(meta);
    const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
    if (j.is_discarded() || !j.is_object())
        throw DataError(meta.string() + ": not a JSON object (the token files' description; fix or remove it)");
    const std::string key = file.stem().string();
    const auto count = [&](const char* what) -> double {
        const auto f = j.find(what);
        if (f == j.end() || !f->is_object()) return 0;
        const auto v = f->find(key);
        return v != f->end() && v->is_number() && v->get<double>() > 0 ? v->get<double>() : 0;
    };
    const double b = count("bytes"), t = count("tokens");
    return b > 0 && t == double(tokens) ? b / t : 0;
}

Dataset read_tokens(const std::string& path, const TokenFileOptions& o) {
    if (path.size() > 3 && path.compare(path.size() - 3, 3, ".gz") == 0)
        throw DataError(path + ": a gzip file; token files are read uncompressed, memory-mapped (gunzip it first)");
    std::shared_ptr<const MappedFile> map;
    try {
        map = std::make_shared<const MappedFile>(path);
    } catch (const InputError& e) {
        throw DataError(e.what());
    }
    map->advise_sequential(true);  // the check reads it once, front to back
    auto windows = std::make_shared<const TokenWindows>(path, map, map->data(), map->size(), o);
    map->drop_resident();           // the check's pages need not stay
    map->advise_sequential(false);  // then windows are read anywhere
    const size_t tokens = windows->tokens();
    Dataset ds = token_dataset(path, std::move(windows), o);
    ds.bytes_per_token = bytes_per_token(path, tokens);
    return ds;
}

TokenFileWriter::TokenFileWriter(int fd, std::string path, std::string tmp, bool wide)
    : fd_(fd), path_(std::move(path)), tmp_(std::move(tmp)), wide_(wide) {
    if (wide_) {  // the count is written by finish()
        const int32_t header[kLlmcHeaderBytes / sizeof(int32_t)] = {kLlmcMagic, 2, 0};
        write_all(fd_, path_, tmp_, reinterpret_cast<const char*>(header), sizeof header);
    }
}

void TokenFileWriter::append(const std::vector<uint32_t>& ids) {
    tokens_ += ids.size();
    if (wide_ && tokens_ > uint64_t(INT32_MAX))
        throw DataError(path_ + ": a token file holds at most 2^31 - 1 ids (llm.c's header)");
    if (wide_) return write_all(fd_, path_, tmp_, reinterpret_cast<const char*>(ids.data()), ids.size() * 4);
    buffer_.resize(ids.size() * 2);
    for (size_t i = 0; i < ids.size(); ++i) {
        const uint16_t v = uint16_t(ids[i]);
        std::memcpy(&buffer_[i * 2], &v, 2);  // little-endian hosts only, as the reader
    }
    write_all(fd_, path_, tmp_, buffer_.data(), buffer_.size());
}

void TokenFileWriter::finish() {
    if (!wide_) return;
    const int32_t count = int32_t(tokens_);
    if (::lseek(fd_, 2 * sizeof(int32_t), SEEK_SET) < 0)  // the header's count, the last thing written
        throw CheckpointError(path_ + ": cannot seek to its header: " + std::strerror(errno));
    write_all(fd_, path_, tmp_, reinterpret_cast<const char*>(&count), sizeof count);
}

Dataset read_tokens(InputFile& in, const TokenFileOptions& o) {
    auto bytes = std::make_shared<std::vector<unsigned char>>();
    const uint64_t avail = available_host_memory();
    try {
        in.read_rest(*bytes, size_t(std::min<uint64_t>(avail ? avail / 2 : uint64_t(1) << 40, SIZE_MAX)), "the tokens");
    } catch (const InputError& e) {
        throw DataError(e.what());
    }
    auto windows = std::make_shared<const TokenWindows>(in.path(), bytes, bytes->data(), bytes->size(), o);
    return token_dataset(in.path(), std::move(windows), o);
}

namespace {

Datasets load(const Options& options, const DataSource& src) {
    const auto& o = options_as<TokensOptions>(options);
    if (src.config.targets) throw DataError("dataset tokens has class labels (the next tokens), not float targets");
    const TokenFileOptions train{o.context, o.vocab, o.uint32, o.random_windows, src.seed};
    const TokenFileOptions test{o.context, o.vocab, o.uint32, false, src.seed};
    Datasets out;
    out.train = read_tokens(src.path(o.train), train);
    out.test = read_tokens(src.path(o.test), test);
    return out;
}

std::vector<std::string> inputs(const Options& opts) {
    const auto& o = options_as<TokensOptions>(opts);
    return {o.train, o.test};
}

}  // namespace

extern const DataFormat kTokensFormat{"tokens", ".", "", read, load, inputs};

}  // namespace mirrored
