// Training a byte-level BPE (`mirrored tokenize --train-bpe`): GPT-2's pre-tokenizer over the
// texts, then the merges, each costing only the pieces that hold its pair.
#include <algorithm>
#include <array>
#include <atomic>
#include <cctype>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "data/pretokenizer.h"
#include "data/tokenizer.h"

namespace mirrored {

namespace {

using json = nlohmann::json;

// Pieces of GPT-2's pre-tokenizer as strings of its printable stand-ins, with how often each occurs.
using PieceCounts = std::unordered_map<std::string, int64_t>;

void count_pieces(std::string_view text, const Regex& regex, const std::array<std::string, 256>& chars,
                  PieceCounts& counts) {
    static constexpr std::string_view kEot = "<|endoftext|>";
    for (size_t start = 0; start <= text.size();) {
        const size_t at = std::min(text.find(kEot, start), text.size());
        regex.split(text.substr(start, at - start), [&](std::string_view piece) {
            std::string s;
            for (unsigned char b : piece) s += chars[b];
            ++counts[s];
        });
        start = at + kEot.size();
    }
}

// The BPE merges over counted pieces, with the bookkeeping that makes each merge cost only the
// pieces holding its pair: pair -> count in a set ordered by (count, pair) descending, pair -> the
// pieces it occurs in.
class BpeTrainer {
public:
    explicit BpeTrainer(const PieceCounts& counts) {
        for (const auto& [piece, n] : counts) {
            std::vector<int> symbols;
            for (size_t i = 0; i < piece.size();) {  // one stand-in (1 or 2 UTF-8 bytes) per symbol
                const size_t len = (static_cast<unsigned char>(piece[i]) & 0xE0) == 0xC0 ? 2 : 1;
                symbols.push_back(intern(piece.substr(i, len)));
                i += len;
            }
            words_.push_back({std::move(symbols), n});
        }
        for (size_t w = 0; w < words_.size(); ++w) add_pairs(int(w), +1);
    }

    // The best pair merged everywhere; false when no pair is left.
    bool merge_best(std::pair<std::string, std::string>& merged) {
        if (order_.empty()) return false;
        const Key best = *order_.begin();
        const int a = best.a, b = best.b, ab = intern(names_[size_t(a)] + names_[size_t(b)]);
        merged = {names_[size_t(a)], names_[size_t(b)]};
        std::vector<int> where = std::move(where_[pair_id(a, b)]);
        std::sort(where.begin(), where.end());
        where.erase(std::unique(where.begin(), where.end()), where.end());
        for (int w : where) {
            add_pairs(w, -1);
            std::vector<int>& s = words_[size_t(w)].symbols;
            size_t j = 0;
            for (size_t i = 0; i < s.size(); ++i, ++j) {
                if (i + 1 < s.size() && s[i] == a && s[i + 1] == b) s[j] = ab, ++i;
                else s[j] = s[i];
            }
            s.resize(j);
            add_pairs(w, +1);
        }
        return true;
    }
    const std::string& name(int symbol) const { return names_[size_t(symbol)]; }

private:
    struct Word {
        std::vector<int> symbols;
        int64_t count = 0;
    };
    struct Key {
        int64_t count;
        int a, b;
    };
    struct Order {  // the larger count first; ties: the larger pair (its tokens' strings)
        const std::vector<std::string>* names;
        bool operator()(const Key& x, const Key& y) const {
            if (x.count != y.count) return x.count > y.count;
            const std::string &xa = (*names)[size_t(x.a)], &ya = (*names)[size_t(y.a)];
            if (xa != ya) return xa > ya;
            return (*names)[size_t(x.b)] > (*names)[size_t(y.b)];
        }
    };
    static uint64_t pair_id(int a, int b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }
    int intern(const std::string& s) {
        const auto [it, added] = ids_.emplace(s, int(names_.size()));
        if (added) names_.push_back(s);
        return it->second;
    }
    // Every adjacent pair of word w counted in (sign +1) or out (-1).
    void add_pairs(int w, int sign) {
        const Word& word = words_[size_t(w)];
        for (size_t i = 0; i + 1 < word.symbols.size(); ++i) {
            const int a = word.symbols[i], b = word.symbols[i + 1];
            int64_t& n = counts_[pair_id(a, b)];
            if (n > 0) order_.erase(Key{n, a, b});
            n += sign * word.count;
            if (n > 0) order_.insert(Key{n, a, b});
            if (sign > 0) where_[pair_id(a, b)].push_back(w);
        }
    }

    std::vector<std::string> names_;
    std::unordered_map<std::string, int> ids_;
    std::vector<Word> words_;
    std::unordered_map<uint64_t, int64_t> counts_;
    std::unordered_map<uint64_t, std::vector<int>> where_;
    std::set<Key, Order> order_{Order{&names_}};
};

}  // namespace

// An ASCII character other than white space (Unicode's other white space is never one byte).
static bool ascii_non_space(char c) {
    const auto u = static_cast<unsigned char>(c);
    return u < 0x80 && !std::isspace(u);
}

std::string train_bpe(const std::vector<std::string_view>& texts, const BpeTraining& t) {
    const Regex regex(kGpt2Pattern, "train_bpe");
    std::array<std::string, 256> chars;
    const std::array<uint32_t, 256> cps = byte_chars();
    for (int b = 0; b < 256; ++b) append_utf8(chars[size_t(b)], cps[size_t(b)]);
    // count the pieces: each thread a share of the texts, a long text in parts cut after a newline
    // between two characters that are not white space (where the pre-tokenizer cuts anyway: no
    // piece holds a newline and the non-space after it, and the newline is a piece of its own)
    std::vector<std::string_view> parts;
    constexpr size_t kPart = size_t(1) << 20;
    for (std::string_view text : texts)
        while (!text.empty()) {
            size_t cut = text.size();
            if (text.size() > kPart)
                for (size_t at = kPart; at + 1 < text.size() && cut == text.size(); ++at)
                    if (text[at] == '\n' && ascii_non_space(text[at - 1]) && ascii_non_space(text[at + 1]))
                        cut = at + 1;
            parts.push_back(text.substr(0, cut));
            text.remove_prefix(cut);
        }
    const int threads = std::max(1, std::min<int>(t.threads, int(parts.size())));
    std::vector<PieceCounts> counts(static_cast<size_t>(threads));
    std::vector<std::string> errors(static_cast<size_t>(threads));
    std::atomic<size_t> next{0};
    std::vector<std::thread> pool;
    for (int k = 0; k < threads; ++k)
        pool.emplace_back([&, k] {
            try {
                for (size_t i; (i = next++) < parts.size();) count_pieces(parts[i], regex, chars, counts[size_t(k)]);
            } catch (const std::exception& e) {
                errors[size_t(k)] = e.what();
            }
        });
    for (auto& th : pool) th.join();
    for (const std::string& e : errors)
        if (!e.empty()) throw DataError("train_bpe: " + e);
    for (int k = 1; k < threads; ++k)
        for (const auto& [piece, n] : counts[size_t(k)]) counts[0][piece] += n;

    BpeTrainer trainer(counts[0]);
    json vocab = json::object();
    for (int b = 0; b < 256; ++b) vocab[chars[size_t(b)]] = b;
    json merges = json::array();
    for (std::pair<std::string, std::string> m; (t.merges == 0 || merges.size() < t.merges) &&
                                                (t.vocab_size == 0 || vocab.size() + 1 < t.vocab_size) &&
                                                trainer.merge_best(m);) {
        merges.push_back(m.first + " " + m.second);
        const std::string joined = m.first + m.second;
        if (!vocab.contains(joined)) {
            const size_t id = vocab.size();
            vocab[joined] = id;
        }
    }
    const uint32_t eot = uint32_t(vocab.size());
    vocab["<|endoftext|>"] = eot;
    const json tok = {{"version", "1.0"},
                      {"added_tokens", {{{"id", eot}, {"content", "<|endoftext|>"}, {"special", true}}}},
                      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
                      {"decoder", {{"type", "ByteLevel"}}},
                      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}}}};
    return tok.dump() + "\n";
}

}  // namespace mirrored
