#include "data/tokenizer.h"

#include <sentencepiece_processor.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>

#include "base/error.h"
#include "data/pretokenizer.h"

namespace mirrored {

namespace {

using json = nlohmann::json;

class ByteTokenizer final : public Tokenizer {
public:
    std::vector<uint32_t> encode(std::string_view text) const override {
        return std::vector<uint32_t>(reinterpret_cast<const unsigned char*>(text.data()),
                                     reinterpret_cast<const unsigned char*>(text.data()) + text.size());
    }
    std::string decode(std::span<const uint32_t> ids) const override {
        std::string s;
        s.reserve(ids.size());
        for (uint32_t id : ids) {
            if (id > 255) throw DataError("token id " + std::to_string(id) + " is not a byte (bytes: ids 0..255)");
            s.push_back(char(id));
        }
        return s;
    }
    uint32_t vocab_size() const override { return 256; }
    std::string description() const override { return "bytes"; }
};

// A token of the vocabulary (GPT-2's printable characters) as the bytes it stands for; false when
// a character stands for no byte (a special token written as itself).
bool token_bytes(const std::string& token, const std::unordered_map<uint32_t, unsigned char>& to_byte,
                 std::string& out) {
    out.clear();
    for (size_t i = 0; i < token.size();) {
        const unsigned char c = static_cast<unsigned char>(token[i]);
        uint32_t cp = 0;
        int n = 0;
        if (c < 0x80) cp = c, n = 1;
        else if ((c & 0xE0) == 0xC0) cp = c & 0x1F, n = 2;
        else if ((c & 0xF0) == 0xE0) cp = c & 0x0F, n = 3;
        else return false;
        if (i + size_t(n) > token.size()) return false;
        for (int k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(token[i + size_t(k)]) & 0x3F);
        const auto b = to_byte.find(cp);
        if (b == to_byte.end()) return false;
        out.push_back(char(b->second));
        i += size_t(n);
    }
    return true;
}

class BpeTokenizer final : public Tokenizer {
public:
    // vocab: token -> id; merges: pairs of tokens, by rank; specials: text -> id.
    BpeTokenizer(const std::string& where, const std::unordered_map<std::string, uint32_t>& vocab,
                 const std::vector<std::pair<std::string, std::string>>& merges,
                 const std::vector<std::string>& merge_lines,
                 const std::vector<std::pair<std::string, uint32_t>>& specials, const std::string& pattern)
        : where_(where), regex_(pattern, where), specials_(specials) {
        const std::array<uint32_t, 256> chars = byte_chars();
        std::unordered_map<uint32_t, unsigned char> to_byte;
        for (int b = 0; b < 256; ++b) to_byte[chars[size_t(b)]] = static_cast<unsigned char>(b);
        uint32_t top = 0;
        for (const auto& [token, id] : vocab) top = std::max(top, id);
        for (const auto& [text, id] : specials) top = std::max(top, id);
        if (top >= (uint32_t(1) << 30))
            throw DataError(where + ": token id " + std::to_string(top) + " is implausible");
        // a table by id up to a little past the tokens listed; ids beyond (a special token placed far
        // out) in a map, so that one large id costs no gigabytes
        bytes_.assign(std::min<size_t>(size_t(top) + 1, 2 * (vocab.size() + specials.size()) + 65536), std::string());
        known_.assign(bytes_.size(), false);
        const auto set = [&](uint32_t id, std::string bytes) {
            if (id >= bytes_.size()) {
                far_[id] = std::move(bytes);
                return;
            }
            bytes_[id] = std::move(bytes);
            known_[id] = true;
        };
        std::string b;
        for (const auto& [token, id] : vocab) set(id, token_bytes(token, to_byte, b) ? b : token);
        for (const auto& [text, id] : specials) set(id, text);
        for (int c = 0; c < 256; ++c) {
            std::string one;
            append_utf8(one, chars[size_t(c)]);
            const auto it = vocab.find(one);
            if (it == vocab.end())
                throw DataError(where + ": the vocabulary has no token for byte " + std::to_string(c) + " ('" + one +
                                "'): not a byte-level BPE");
            byte_id_[size_t(c)] = it->second;
        }
        for (size_t r = 0; r < merges.size(); ++r) {
            const auto& [a, c] = merges[r];
            const auto ia = vocab.find(a), ic = vocab.find(c), im = vocab.find(a + c);
            if (ia == vocab.end() || ic == vocab.end() || im == vocab.end())
                throw DataError(where + ": merge " + std::to_string(r + 1) + " ('" + merge_lines[r] + "') names " +
                                (ia == vocab.end()   ? "'" + a + "', which the vocabulary lacks"
                                 : ic == vocab.end() ? "'" + c + "', which the vocabulary lacks"
                                                     : "a pair whose join '" + a + c + "' the vocabulary lacks"));
            merges_.emplace(key(ia->second, ic->second), Merge{uint32_t(r), im->second});  // the first rank stays
        }
        vocab_size_ = top + 1;
    }

    std::vector<uint32_t> encode(std::string_view text) const override {
        std::vector<uint32_t> out;
        out.reserve(text.size() / 3 + 1);
        size_t start = 0;
        while (start < text.size()) {
            // the earliest special token from here (the longest where two start together)
            size_t at = std::string_view::npos, len = 0;
            uint32_t id = 0;
            for (const auto& [s, sid] : specials_) {
                const size_t p = text.find(s, start);
                if (p != std::string_view::npos && (p < at || (p == at && s.size() > len)))
                    at = p, len = s.size(), id = sid;
            }
            const size_t end = at == std::string_view::npos ? text.size() : at;
            regex_.split(text.substr(start, end - start), [&](std::string_view piece) { encode_piece(piece, out); });
            if (at == std::string_view::npos) break;
            out.push_back(id);
            start = at + len;
        }
        return out;
    }

    std::string decode(std::span<const uint32_t> ids) const override {
        std::string s;
        for (uint32_t id : ids) {
            if (id < bytes_.size() && known_[id]) {
                s += bytes_[id];
                continue;
            }
            const auto far = id < bytes_.size() ? far_.end() : far_.find(id);
            if (far == far_.end())
                throw DataError("token id " + std::to_string(id) + " is not in the vocabulary of " + where_ + " (" +
                                std::to_string(vocab_size_) + " ids)");
            s += far->second;
        }
        return s;
    }
    uint32_t vocab_size() const override { return vocab_size_; }
    std::optional<uint32_t> end_of_text() const override {
        for (const char* name : {"<|endoftext|>", "<|end_of_text|>", "</s>", "<|im_end|>", "<eos>"})
            for (const auto& [text, id] : specials_)
                if (text == name) return id;
        return std::nullopt;
    }
    std::string description() const override {
        return "byte-level BPE, " + std::to_string(vocab_size_) + " tokens (" + where_ + ")";
    }

private:
    struct Merge {
        uint32_t rank, id;
    };
    static uint64_t key(uint32_t a, uint32_t b) { return (uint64_t(a) << 32) | b; }

    // GPT-2's bpe(): the pair of lowest rank merged wherever it occurs, left to right, until no
    // adjacent pair has a merge.
    void encode_piece(std::string_view piece, std::vector<uint32_t>& out) const {
        std::vector<uint32_t> w;
        w.reserve(piece.size());
        for (unsigned char c : piece) w.push_back(byte_id_[c]);
        while (w.size() > 1) {
            uint32_t best = std::numeric_limits<uint32_t>::max(), a = 0, b = 0, merged = 0;
            for (size_t i = 0; i + 1 < w.size(); ++i) {
                const auto m = merges_.find(key(w[i], w[i + 1]));
                if (m != merges_.end() && m->second.rank < best)
                    best = m->second.rank, a = w[i], b = w[i + 1], merged = m->second.id;
            }
            if (best == std::numeric_limits<uint32_t>::max()) break;
            size_t j = 0;
            for (size_t i = 0; i < w.size(); ++i, ++j) {
                if (i + 1 < w.size() && w[i] == a && w[i + 1] == b) w[j] = merged, ++i;
                else w[j] = w[i];
            }
            w.resize(j);
        }
        out.insert(out.end(), w.begin(), w.end());
    }

    std::string where_;
    Regex regex_;
    std::vector<std::pair<std::string, uint32_t>> specials_;
    std::vector<std::string> bytes_;                 // id -> the bytes it stands for
    std::vector<bool> known_;                        // ids the vocabulary assigns
    std::unordered_map<uint32_t, std::string> far_;  // the ids past bytes_, with theirs
    std::array<uint32_t, 256> byte_id_{};
    std::unordered_map<uint64_t, Merge> merges_;
    uint32_t vocab_size_ = 0;
};

json read_json(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw DataError(path + ": cannot open");
    try {
        return json::parse(in);
    } catch (const json::exception& e) {
        throw DataError(path + ": not JSON (truncated or damaged?): " + e.what());
    }
}

std::unordered_map<std::string, uint32_t> read_vocab(const json& v, const std::string& where) {
    if (!v.is_object()) throw DataError(where + ": expected an object of token: id");
    std::unordered_map<std::string, uint32_t> vocab;
    for (const auto& [token, id] : v.items()) {
        if (!id.is_number_unsigned() || id.get<uint64_t>() >= (uint64_t(1) << 30))
            throw DataError(where + ": token '" + token + "' has id " + id.dump() + ", expected an id below 2^30");
        vocab.emplace(token, id.get<uint32_t>());
    }
    return vocab;
}

// "a b" (merges.txt, older tokenizer.json) or ["a", "b"] (newer tokenizer.json).
std::pair<std::string, std::string> split_merge(const std::string& line, const std::string& where) {
    const size_t sp = line.find(' ');
    if (sp == std::string::npos || sp == 0 || sp + 1 >= line.size() || line.find(' ', sp + 1) != std::string::npos)
        throw DataError(where + ": '" + line + "' is not a merge (two tokens separated by one space)");
    return {line.substr(0, sp), line.substr(sp + 1)};
}

std::unique_ptr<Tokenizer> from_tokenizer_json(const json& j, const std::string& path);

// A tokenizer.json whose keys hold values of other types than Hugging Face writes (a number for
// model.type, a list for a pattern): refused naming the file, as any other lie.
std::unique_ptr<Tokenizer> read_tokenizer_json(const json& j, const std::string& path) {
    try {
        return from_tokenizer_json(j, path);
    } catch (const json::exception& e) {
        throw DataError(path + ": not a Hugging Face tokenizer.json: " + e.what());
    }
}

std::unique_ptr<Tokenizer> from_tokenizer_json(const json& j, const std::string& path) {
    const auto model = j.find("model");
    if (model == j.end() || !model->is_object()) throw DataError(path + ": no \"model\" object");
    const std::string type = model->value("type", "");
    if (type != "BPE")
        throw DataError(path + ": model.type is '" + type +
                        "'; only BPE models are read (a SentencePiece .model file " +
                        "needs the SentencePiece tokenizer)");
    if (model->value("byte_fallback", false))
        throw DataError(path + ": model.byte_fallback: a SentencePiece-style BPE (Llama 2), not a byte-level one");
    std::string pattern = kGpt2Pattern;
    bool byte_level = false;
    const json pre = j.value("pre_tokenizer", json());
    const auto visit = [&](const json& p) {
        if (!p.is_object()) return;
        const std::string t = p.value("type", "");
        if (t == "ByteLevel") byte_level = true;
        if (t == "Split" && p.contains("pattern") && p["pattern"].is_object() && p["pattern"].contains("Regex"))
            pattern = p["pattern"]["Regex"].get<std::string>();
    };
    visit(pre);
    if (pre.is_object() && pre.contains("pretokenizers") && pre["pretokenizers"].is_array())
        for (const json& p : pre["pretokenizers"]) visit(p);
    if (!byte_level) throw DataError(path + ": pre_tokenizer has no ByteLevel step: not a byte-level BPE");
    const auto vocab = read_vocab(model->value("vocab", json()), path + ": model.vocab");
    std::vector<std::pair<std::string, std::string>> merges;
    std::vector<std::string> lines;
    const json m = model->value("merges", json::array());
    if (!m.is_array()) throw DataError(path + ": model.merges: expected a list");
    for (const json& e : m) {
        if (e.is_string()) {
            lines.push_back(e.get<std::string>());
            merges.push_back(split_merge(lines.back(), path + ": model.merges"));
        } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
            merges.push_back({e[0].get<std::string>(), e[1].get<std::string>()});
            lines.push_back(merges.back().first + " " + merges.back().second);
        } else {
            throw DataError(path + ": model.merges: " + e.dump() + " is not a merge");
        }
    }
    std::vector<std::pair<std::string, uint32_t>> specials;
    for (const json& a : j.value("added_tokens", json::array())) {
        if (!a.is_object() || !a.contains("content") || !a.contains("id") || !a["id"].is_number_unsigned() ||
            !a["content"].is_string() || a["content"].get<std::string>().empty())
            throw DataError(path + ": added_tokens: " + a.dump() + " is not {id, content}");
        if (a["id"].get<uint64_t>() >= (uint64_t(1) << 30))
            throw DataError(path + ": added_tokens: " + a.dump() + " has an id past 2^30");
        specials.push_back({a["content"].get<std::string>(), a["id"].get<uint32_t>()});
    }
    return std::make_unique<BpeTokenizer>(path, vocab, merges, lines, specials, pattern);
}

// A SentencePiece model (Llama 2's, Mistral's, TinyLlama's tokenizer.model, or one trained with
// spm_train), through the SentencePiece library: its normalisation, pieces and byte fallback.
class SentencePieceTokenizer final : public Tokenizer {
public:
    explicit SentencePieceTokenizer(const std::string& path) : path_(path) {
        const auto status = sp_.Load(path);
        if (!status.ok()) throw DataError(path + ": not a SentencePiece model: " + status.ToString());
    }
    std::vector<uint32_t> encode(std::string_view text) const override {
        std::vector<int> ids;
        const auto status = sp_.Encode(absl::string_view(text.data(), text.size()), &ids);
        if (!status.ok()) throw DataError(path_ + ": cannot encode: " + status.ToString());
        return std::vector<uint32_t>(ids.begin(), ids.end());
    }
    std::string decode(std::span<const uint32_t> ids) const override {
        std::vector<int> in;
        in.reserve(ids.size());
        for (uint32_t id : ids) {
            if (id >= vocab_size())
                throw DataError(path_ + ": token id " + std::to_string(id) + " is not in the vocabulary of " +
                                std::to_string(vocab_size()));
            in.push_back(int(id));
        }
        std::string text;
        const auto status = sp_.Decode(in, &text);
        if (!status.ok()) throw DataError(path_ + ": cannot decode: " + status.ToString());
        return text;
    }
    uint32_t vocab_size() const override { return uint32_t(sp_.GetPieceSize()); }
    std::optional<uint32_t> end_of_text() const override {
        return sp_.eos_id() >= 0 ? std::optional<uint32_t>(uint32_t(sp_.eos_id())) : std::nullopt;
    }
    std::optional<uint32_t> begin_of_text() const override {
        return sp_.bos_id() >= 0 ? std::optional<uint32_t>(uint32_t(sp_.bos_id())) : std::nullopt;
    }
    std::string description() const override {
        return "SentencePiece " + path_ + " (" + std::to_string(vocab_size()) + " pieces)";
    }

private:
    std::string path_;
    sentencepiece::SentencePieceProcessor sp_;
};

// GPT-2's vocab.json (parsed) and merges.txt (a stream): `vocab_path` and `merges_path` name them.
std::unique_ptr<Tokenizer> from_vocab_merges(const json& vocab_json, std::istream& in, const std::string& vocab_path,
                                             const std::string& merges_path) {
    const auto vocab = read_vocab(vocab_json, vocab_path);
    std::vector<std::pair<std::string, std::string>> merges;
    std::vector<std::string> lines;
    std::string line;
    for (int n = 1; std::getline(in, line); ++n) {
        if (!line.empty() && line.back() == '\r') line.pop_back();
        if (line.empty() || (n == 1 && line.rfind("#version", 0) == 0)) continue;
        lines.push_back(line);
        merges.push_back(split_merge(line, merges_path + ":" + std::to_string(n)));
    }
    std::vector<std::pair<std::string, uint32_t>> specials;
    if (const auto eot = vocab.find("<|endoftext|>"); eot != vocab.end()) specials.push_back(*eot);
    return std::make_unique<BpeTokenizer>(vocab_path, vocab, merges, lines, specials, kGpt2Pattern);
}

// Standard base64 (RFC 4648, padded), as tiktoken rank files write tokens; false for anything else.
bool decode_base64(std::string_view in, std::string& out) {
    static const std::array<int8_t, 256> value = [] {
        std::array<int8_t, 256> v{};
        v.fill(-1);
        const char* alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        for (int i = 0; i < 64; ++i) v[static_cast<unsigned char>(alphabet[i])] = int8_t(i);
        return v;
    }();
    out.clear();
    if (in.empty() || in.size() % 4) return false;
    for (size_t i = 0; i < in.size(); i += 4) {
        uint32_t n = 0;
        int pad = 0;
        for (size_t k = 0; k < 4; ++k) {
            const char c = in[i + k];
            if (c == '=' && k >= 2 && i + 4 == in.size()) {
                ++pad;
                n <<= 6;
                continue;
            }
            const int v = value[static_cast<unsigned char>(c)];
            if (pad || v < 0) return false;
            n = (n << 6) | uint32_t(v);
        }
        out.push_back(char(n >> 16));
        if (pad < 2) out.push_back(char(n >> 8));
        if (pad < 1) out.push_back(char(n));
    }
    return true;
}

// What a tiktoken rank file does not hold - the pre-tokenizer's regex and the special tokens -
// tiktoken knows by the encoding's name (tiktoken_ext/openai_public.py), and so does this reader:
// the file's name without .tiktoken. Any other name: GPT-2's regex and <|endoftext|> after the last
// rank.
void tiktoken_encoding(const std::string& name, uint32_t after_last, std::string& pattern,
                       std::vector<std::pair<std::string, uint32_t>>& specials) {
    static constexpr const char* kContractions =
        "('s|'S|'t|'T|'re|'rE|'Re|'RE|'ve|'vE|'Ve|'VE|'m|'M|'ll|'lL|'Ll|'LL|'d|'D)";
    pattern = kGpt2Pattern;
    if (name == "gpt2" || name == "r50k_base" || name == "p50k_base") {
        specials = {{"<|endoftext|>", 50256}};
    } else if (name == "cl100k_base") {
        pattern = std::string(kContractions) +
                  R"(|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
        specials = {{"<|endoftext|>", 100257},
                    {"<|fim_prefix|>", 100258},
                    {"<|fim_middle|>", 100259},
                    {"<|fim_suffix|>", 100260},
                    {"<|endofprompt|>", 100276}};
    } else if (name == "o200k_base") {
        const std::string upper = R"([\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}])", lower = R"([\p{Ll}\p{Lm}\p{Lo}\p{M}])";
        pattern = R"([^\r\n\p{L}\p{N}]?)" + upper + "*" + lower + "+" + kContractions + "?|" + R"([^\r\n\p{L}\p{N}]?)" +
                  upper + "+" + lower + "*" + kContractions + "?" +
                  R"(|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
        specials = {{"<|endoftext|>", 199999}, {"<|endofprompt|>", 200018}};
    } else {
        specials = {{"<|endoftext|>", after_last}};
    }
}

// The .tiktoken rank files a folder holds, in name order.
std::vector<std::string> rank_files(const std::string& folder) {
    std::vector<std::string> files;
    std::error_code ec;
    for (const auto& f : std::filesystem::directory_iterator(folder, ec))
        if (f.path().extension() == ".tiktoken" && f.is_regular_file(ec)) files.push_back(f.path().string());
    std::sort(files.begin(), files.end());
    return files;
}

// A tiktoken rank file (OpenAI's gpt2, r50k_base, p50k_base, cl100k_base, o200k_base.tiktoken): a
// line per token, its bytes in base64 and its rank, the rank its merge order and its id. The pairs
// merged are recovered as tiktoken's byte_pair_encode finds them: a token's bytes merged by the
// lower-ranked tokens alone end as exactly two, the pair whose merge it is.
std::unique_ptr<Tokenizer> from_tiktoken(std::istream& in, const std::string& path) {
    std::vector<std::pair<uint32_t, std::string>> tokens;  // (rank, bytes)
    std::unordered_map<std::string, uint32_t> rank_of;
    std::string line, bytes;
    for (size_t n = 1; std::getline(in, line); ++n) {
        if (!line.empty() && line.back() == '\r') line.pop_back();
        if (line.empty()) continue;
        const std::string at = path + ":" + std::to_string(n);
        const size_t sp = line.find(' ');
        if (sp == std::string::npos || !decode_base64(std::string_view(line).substr(0, sp), bytes))
            throw DataError(at + ": expected a token's bytes in base64, a space and its rank");
        uint32_t rank = 0;
        const char* end = line.data() + line.size();
        const auto [stop, ec] = std::from_chars(line.data() + sp + 1, end, rank);
        if (ec != std::errc() || stop != end || sp + 1 == line.size() || rank >= (uint32_t(1) << 30))
            throw DataError(at + ": rank '" + line.substr(sp + 1) + "' is not a whole number below 2^30");
        if (!rank_of.emplace(bytes, rank).second)
            throw DataError(at + ": token '" + line.substr(0, sp) + "' is listed twice");
        tokens.push_back({rank, bytes});
    }
    if (tokens.empty()) throw DataError(path + ": no tokens (expected lines of base64 bytes and a rank)");
    std::sort(tokens.begin(), tokens.end());
    for (size_t i = 1; i < tokens.size(); ++i)
        if (tokens[i].first == tokens[i - 1].first)
            throw DataError(path + ": rank " + std::to_string(tokens[i].first) + " is given to two tokens");
    const std::array<uint32_t, 256> chars = byte_chars();
    const auto printable = [&](const std::string& b) {
        std::string s;
        for (unsigned char c : b) append_utf8(s, chars[c]);
        return s;
    };
    std::unordered_map<std::string, uint32_t> vocab;
    std::vector<std::pair<std::string, std::string>> merges;
    std::vector<std::string> lines;
    std::vector<std::string> parts;
    for (const auto& [rank, b] : tokens) {
        vocab.emplace(printable(b), rank);
        if (b.size() < 2) continue;
        parts.clear();
        for (char c : b) parts.emplace_back(1, c);
        while (parts.size() > 2) {  // the lowest-ranked adjacent pair below this token, leftmost first
            uint32_t best = rank;
            size_t at = 0;
            for (size_t i = 0; i + 1 < parts.size(); ++i)
                if (const auto r = rank_of.find(parts[i] + parts[i + 1]); r != rank_of.end() && r->second < best)
                    best = r->second, at = i;
            if (best == rank) break;
            parts[at] += parts[at + 1];
            parts.erase(parts.begin() + std::ptrdiff_t(at) + 1);
        }
        if (parts.size() != 2)
            throw DataError(path + ": the token of rank " + std::to_string(rank) + " ('" + printable(b) +
                            "') is not the merge of two tokens of lower rank: not a BPE rank file");
        merges.push_back({printable(parts[0]), printable(parts[1])});
        lines.push_back(merges.back().first + " " + merges.back().second);
    }
    std::string pattern;
    std::vector<std::pair<std::string, uint32_t>> specials;
    tiktoken_encoding(std::filesystem::path(path).stem().string(), tokens.back().first + 1, pattern, specials);
    const auto by_rank = [](const std::pair<uint32_t, std::string>& t, uint32_t r) { return t.first < r; };
    for (const auto& [text, id] : specials)
        if (const auto t = std::lower_bound(tokens.begin(), tokens.end(), id, by_rank);
            t != tokens.end() && t->first == id)
            throw DataError(path + ": rank " + std::to_string(id) + " is " + text + "'s id in the " +
                            std::filesystem::path(path).stem().string() + " encoding, not a token's");
    return std::make_unique<BpeTokenizer>(path, vocab, merges, lines, specials, pattern);
}

std::ifstream open_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw DataError(path + ": cannot open");
    return in;
}

std::unique_ptr<Tokenizer> from_vocab_merges(const std::string& vocab_path, const std::string& merges_path) {
    const json vocab = read_json(vocab_path);
    std::ifstream in = open_file(merges_path);
    return from_vocab_merges(vocab, in, vocab_path, merges_path);
}

std::unique_ptr<Tokenizer> from_tiktoken(const std::string& path) {
    std::ifstream in = open_file(path);
    return from_tiktoken(in, path);
}

json parse_json(const std::string& text, const std::string& where) {
    try {
        return json::parse(text);
    } catch (const json::exception& e) {
        throw DataError(where + ": not JSON: " + e.what());
    }
}

}  // namespace

std::unique_ptr<Tokenizer> byte_tokenizer() { return std::make_unique<ByteTokenizer>(); }

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path) {
    namespace fs = std::filesystem;
    std::error_code ec;
    if (fs::is_directory(path, ec)) {
        const fs::path dir(path);
        // Llama 2's family ships its SentencePiece model beside a tokenizer.json that only imitates it
        if (fs::exists(dir / "tokenizer.model", ec))
            return std::make_unique<SentencePieceTokenizer>((dir / "tokenizer.model").string());
        if (fs::exists(dir / "tokenizer.json", ec)) {
            const std::string file = (dir / "tokenizer.json").string();
            return read_tokenizer_json(read_json(file), file);
        }
        if (fs::exists(dir / "vocab.json", ec) && fs::exists(dir / "merges.txt", ec))
            return from_vocab_merges((dir / "vocab.json").string(), (dir / "merges.txt").string());
        const std::vector<std::string> ranks = rank_files(path);
        if (ranks.size() == 1) return from_tiktoken(ranks[0]);
        throw DataError(path + (ranks.empty() ? ": no tokenizer.model, tokenizer.json, vocab.json and merges.txt, "
                                                "nor a .tiktoken rank file"
                                              : ": more than one .tiktoken rank file; name the one to use"));
    }
    if (!fs::is_regular_file(path, ec)) throw DataError(path + ": no such tokenizer file or folder");
    if (fs::path(path).extension() == ".model") return std::make_unique<SentencePieceTokenizer>(path);
    if (fs::path(path).extension() == ".tiktoken") return from_tiktoken(path);
    if (fs::path(path).filename() == "vocab.json") {
        const std::string merges = (fs::path(path).parent_path() / "merges.txt").string();
        return from_vocab_merges(path, merges);
    }
    return read_tokenizer_json(read_json(path), path);
}

std::vector<std::string> tokenizer_files(const std::string& folder) {
    namespace fs = std::filesystem;
    std::vector<std::string> files;
    std::error_code ec;
    for (const char* n : {"tokenizer.model", "tokenizer.json", "vocab.json", "merges.txt", "tokenizer_config.json"})
        if (fs::is_regular_file(fs::path(folder) / n, ec)) files.push_back((fs::path(folder) / n).string());
    for (const std::string& f : rank_files(folder)) files.push_back(f);
    return files;
}

std::unique_ptr<Tokenizer> tokenizer_from_json(const std::string& text, const std::string& where) {
    return read_tokenizer_json(parse_json(text, where), where);
}

std::unique_ptr<Tokenizer> tokenizer_from_vocab_merges(const std::string& vocab_json, const std::string& merges,
                                                       const std::string& vocab_where,
                                                       const std::string& merges_where) {
    std::istringstream in(merges);
    return from_vocab_merges(parse_json(vocab_json, vocab_where), in, vocab_where, merges_where);
}

std::unique_ptr<Tokenizer> tokenizer_from_tiktoken(const std::string& ranks, const std::string& where) {
    std::istringstream in(ranks);
    return from_tiktoken(in, where);
}

}  // namespace mirrored
