// tokens: a language model's token files, as nanoGPT writes them (train.bin / val.bin: raw
// little-endian uint16 ids) or as llm.c writes them (a header of 256 int32 - magic 20240520,
// version 1 for uint16 ids or 2 for uint32, the token count - then the ids); `dtype: uint32` for
// raw files of vocabularies over 65,535.
//
// A sample is a window of context + 1 tokens: its first `context` ids are the input, the last
// `context` the labels (each position predicts the next token). Window i starts at token
// i * context, so the windows cover the file once and overlap by one token; the loader shuffles
// and shards them like any samples, so N replicas train exactly as one and a resume is exact.
#include <cstring>

#include "base/error.h"
#include "base/io.h"
#include "data/datasets.h"

namespace mirrored {

namespace {

struct TokensOptions final : OptionsOf<TokensOptions> {
    std::string train = "train.bin", test = "val.bin";
    int context = 0;
    int vocab = 256;
    bool uint32 = false;  // raw files: 4-byte ids (llm.c files say so in their header)
    Fields fields() const override {
        return {{"train", train},
                {"test", test},
                {"context", std::to_string(context)},
                {"vocab", std::to_string(vocab)},
                {"dtype", uint32 ? "uint32" : "uint16"}};
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
    return o;
}

constexpr int32_t kLlmcMagic = 20240520;
constexpr size_t kLlmcHeaderBytes = 256 * sizeof(int32_t);

uint32_t read_le(const unsigned char* p, size_t width) {
    uint32_t v = 0;
    for (size_t b = 0; b < width; ++b) v |= uint32_t(p[b]) << (8 * b);
    return v;
}

}  // namespace

Dataset read_tokens(const std::string& path, const TokenFileOptions& o) {
    try {
        InputFile in(path);
        return read_tokens(in, o);
    } catch (const InputError& e) {
        throw DataError(e.what());
    }
}

Dataset read_tokens(InputFile& in, const TokenFileOptions& o) {
    const std::string& path = in.path();
    std::vector<unsigned char> bytes;
    // what the machine has left: inputs and labels then take 4 bytes per token each on top
    const uint64_t avail = available_host_memory();
    try {
        in.read_rest(bytes, size_t(std::min<uint64_t>(avail ? avail / 5 : uint64_t(1) << 40, SIZE_MAX)), "the tokens");
    } catch (const InputError& e) {
        throw DataError(e.what());
    }
    size_t begin = 0, width = o.uint32 ? 4 : 2;
    if (bytes.size() >= 4 && int32_t(read_le(bytes.data(), 4)) == kLlmcMagic) {
        if (bytes.size() < kLlmcHeaderBytes)
            throw DataError(path + ": an llm.c token file (magic 20240520) whose header is cut short: " +
                            std::to_string(bytes.size()) + " of 1024 bytes");
        const uint32_t version = read_le(bytes.data() + 4, 4), count = read_le(bytes.data() + 8, 4);
        if (version != 1 && version != 2)
            throw DataError(path + ": llm.c token file version " + std::to_string(version) +
                            "; this reader knows 1 (uint16 ids) and 2 (uint32 ids)");
        begin = kLlmcHeaderBytes;
        width = version == 1 ? 2 : 4;
        if ((bytes.size() - begin) / width != count || (bytes.size() - begin) % width)
            throw DataError(path + ": the header says " + std::to_string(count) + " tokens, the file holds " +
                            std::to_string(bytes.size() - begin) + " bytes of " + std::to_string(width) +
                            "-byte ids after it");
    } else if (bytes.size() % width) {
        throw DataError(path + ": " + std::to_string(bytes.size()) + " bytes is not a whole number of " +
                        std::to_string(width) + "-byte token ids (data.dtype)");
    }
    const size_t tokens = (bytes.size() - begin) / width, t = size_t(o.context);
    if (tokens < t + 1)
        throw DataError(path + ": " + std::to_string(tokens) +
                        " tokens, shorter than one window of data.context + 1 = " + std::to_string(t + 1));
    const size_t windows = (tokens - 1) / t;
    Dataset ds;
    ds.name = path;
    ds.labels_source = path;
    ds.shape = {o.context};
    ds.classes = o.vocab;
    ds.label_size = o.context;
    ds.tokens = true;
    resize_features(ds.features, windows * t);
    ds.labels.resize(windows * t);
    const unsigned char* ids = bytes.data() + begin;
    for (size_t i = 0; i <= windows * t; ++i) {
        const uint32_t id = read_le(ids + i * width, width);
        if (id >= uint32_t(o.vocab))
            throw DataError(path + ": token " + std::to_string(id) + " at byte offset " +
                            std::to_string(begin + i * width) + " is outside the vocabulary [0, " +
                            std::to_string(o.vocab) + ") (data.vocab)");
        // token i is the input at position i and the label of position i - 1 (window by window)
        if (i < windows * t) ds.features[i] = float(id);
        if (i > 0) ds.labels[i - 1] = int32_t(id);
    }
    return ds;
}

namespace {

Datasets load(const Options& options, const DataSource& src) {
    const auto& o = options_as<TokensOptions>(options);
    if (src.config.targets) throw DataError("dataset tokens has class labels (the next tokens), not float targets");
    const TokenFileOptions t{o.context, o.vocab, o.uint32};
    Datasets out;
    out.train = read_tokens(src.path(o.train), t);
    out.test = read_tokens(src.path(o.test), t);
    return out;
}

}  // namespace

extern const DataFormat kTokensFormat{"tokens", ".", "", read, load};

}  // namespace mirrored
