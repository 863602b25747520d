// Tokenizers: text to token ids and back, behind one interface.
//
// - bytes: each byte its own id (0..255), the byte-level language models' tokenizer.
// - byte-level BPE (GPT-2's, and Llama 3's, Qwen's, SmolLM's): a Hugging Face tokenizer.json with a
//   BPE model, or GPT-2's vocab.json + merges.txt. Text is split by the pre-tokenizer's regex
//   (GPT-2's, or the one tokenizer.json's Split names; PCRE2 with Unicode properties), each piece's
//   bytes become GPT-2's printable characters and are merged pair by pair, lowest merge rank first.
//   Special tokens (<|endoftext|>, tokenizer.json's added tokens) in the text are their own ids.
//   Any bytes encode, valid UTF-8 or not (bytes outside every regex match are pieces of their own),
//   and decode(encode(x)) == x.
// - tiktoken rank files (name.tiktoken: gpt2, r50k_base, p50k_base, cl100k_base, o200k_base), the
//   same byte-level BPE: the merges are recovered from the ranks; the regex and special tokens,
//   which the file does not hold, are those tiktoken gives the encoding's name (another name: GPT-2's
//   regex, <|endoftext|> after the last rank).
// - SentencePiece (Llama 2's, Mistral's tokenizer.model, or one trained with spm_train), through the
//   SentencePiece library; a folder with a tokenizer.model is read as one. Its model normalises the
//   text (NFKC, whitespace) as it was trained to, so decode(encode(x)) is x normalised.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace mirrored {

class Tokenizer {
public:
    virtual ~Tokenizer() = default;
    virtual std::vector<uint32_t> encode(std::string_view text) const = 0;
    // DataError for an id outside the vocabulary.
    virtual std::string decode(std::span<const uint32_t> ids) const = 0;
    virtual uint32_t vocab_size() const = 0;  // one past the largest id
    virtual std::string description() const = 0;
    // The special token that ends a text (<|endoftext|>, <|end_of_text|>, </s>, ...), if any.
    virtual std::optional<uint32_t> end_of_text() const { return std::nullopt; }
    // The token a text starts with where the model was trained so (SentencePiece's <s>), if any.
    virtual std::optional<uint32_t> begin_of_text() const { return std::nullopt; }
};

std::unique_ptr<Tokenizer> byte_tokenizer();

// A folder holding tokenizer.model, tokenizer.json, vocab.json and merges.txt, or one .tiktoken
// file; or a tokenizer.json, vocab.json, .model or .tiktoken file.
// DataError (exit 3) naming the file, and the line or key, for one that is not what it claims:
// truncated JSON, merges naming unknown tokens, ids beyond the vocabulary, a model other than BPE.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path);
// The files of a tokenizer a folder holds, full paths (tokenizer.model, tokenizer.json, vocab.json,
// merges.txt, tokenizer_config.json, .tiktoken rank files): what travels with token files and runs.
std::vector<std::string> tokenizer_files(const std::string& folder);
// The same from files' contents (`where` names each in messages; a rank file's encoding is its
// name's stem): a tokenizer.json, GPT-2's vocab.json and merges.txt, a .tiktoken rank file.
std::unique_ptr<Tokenizer> tokenizer_from_json(const std::string& text, const std::string& where);
std::unique_ptr<Tokenizer> tokenizer_from_vocab_merges(const std::string& vocab_json, const std::string& merges,
                                                       const std::string& vocab_where, const std::string& merges_where);
std::unique_ptr<Tokenizer> tokenizer_from_tiktoken(const std::string& ranks, const std::string& where);

// A byte-level BPE trained on `texts` with GPT-2's pre-tokenizer: the most frequent adjacent pair of
// symbols within the pieces merged, again and again (ties: the larger pair, as
// scripts/bpe_reference.py), until the vocabulary - the 256 bytes, the merged tokens, <|endoftext|>
// last - holds vocab_size ids or `merges` merges are made (0: no limit), or no pair is left. The
// pieces are counted on `threads` threads (<|endoftext|> in a text separates, as it does when
// encoding). Returns the tokenizer as Hugging Face's tokenizer.json, which load_tokenizer reads.
struct BpeTraining {
    uint32_t vocab_size = 0;
    uint32_t merges = 0;
    int threads = 1;
};
std::string train_bpe(const std::vector<std::string_view>& texts, const BpeTraining& t);

}  // namespace mirrored
