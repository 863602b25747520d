// GPT-2's byte-level pre-tokenizing, shared by the tokenizers (tokenizer.cpp) and the BPE trainer
// (bpe_training.cpp): the printable stand-ins for bytes and the pre-tokenizer's regex. Private to
// data/: it includes PCRE2.
#pragma once

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <array>
#include <cstdint>
#include <new>
#include <string>
#include <string_view>

#include "base/error.h"

namespace mirrored {

// GPT-2's pre-tokenizer (encoder.py): contractions, letters, numbers, other symbols, each with one
// leading space, and runs of spaces.
constexpr const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// GPT-2's printable stand-ins for bytes (encoder.py's bytes_to_unicode): printable Latin-1 bytes
// stand for themselves, the others for the code points from 256 on, in byte order.
inline std::array<uint32_t, 256> byte_chars() {
    std::array<uint32_t, 256> c{};
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; ++b) {
        const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        c[b] = printable ? b : next++;
    }
    return c;
}

inline void append_utf8(std::string& s, uint32_t cp) {
    if (cp < 0x80) {
        s.push_back(char(cp));
    } else if (cp < 0x800) {
        s.push_back(char(0xC0 | (cp >> 6)));
        s.push_back(char(0x80 | (cp & 0x3F)));
    } else {
        s.push_back(char(0xE0 | (cp >> 12)));
        s.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
        s.push_back(char(0x80 | (cp & 0x3F)));
    }
}

// The pre-tokenizer's regex (PCRE2, Unicode properties; bytes that are not UTF-8 match nothing).
class Regex {
public:
    Regex(const std::string& pattern, const std::string& where) {
        int err = 0;
        PCRE2_SIZE at = 0;
        code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.c_str()), pattern.size(),
                              PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &at, nullptr);
        if (!code_) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(err, msg, sizeof msg);
            throw DataError(where + ": the pre-tokenizer's regex does not compile at offset " + std::to_string(at) +
                            ": " + reinterpret_cast<const char*>(msg));
        }
        pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE);  // where there is no JIT, the interpreter matches
    }
    ~Regex() { pcre2_code_free(code_); }
    Regex(const Regex&) = delete;
    Regex& operator=(const Regex&) = delete;

    // fn(piece) for each match and each run of bytes between matches, in order: together the text.
    template <typename F>
    void split(std::string_view text, F&& fn) const {
        pcre2_match_data* md = pcre2_match_data_create_from_pattern(code_, nullptr);
        if (!md) throw std::bad_alloc();
        const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
        size_t start = 0;
        while (start < text.size()) {
            const int rc = pcre2_match(code_, subject, text.size(), start, 0, md, nullptr);
            if (rc < 0) {
                pcre2_match_data_free(md);
                if (rc != PCRE2_ERROR_NOMATCH) throw DataError("tokenizer: the pre-tokenizer's regex failed to match");
                fn(text.substr(start));
                return;
            }
            const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
            size_t from = ov[0], to = ov[1];
            if (to == from) to = from + 1;  // an empty match: its byte goes on alone
            if (from > start) fn(text.substr(start, from - start));
            fn(text.substr(from, to - from));
            start = to;
        }
        pcre2_match_data_free(md);
    }

private:
    pcre2_code* code_ = nullptr;
};

}  // namespace mirrored
