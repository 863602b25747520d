// Tokenizers (data/tokenizer.h): byte-level BPE against an independent encoder written from GPT-2's
// encoder.py (scripts/bpe_reference.py) over 1 MB of mixed text - code, prose, several scripts,
// emoji, runs of spaces and newlines, <|endoftext|> - read from both of Hugging Face's layouts;
// decode(encode(x)) == x for any bytes, valid UTF-8 or not; files that lie are refused, named.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "base/error.h"
#include "data/tokenizer.h"
#include "tests/cli.h"
#include "tests/helpers.h"

using namespace mirrored;
using namespace mirrored::test;
namespace fs = std::filesystem;

namespace {

// About `bytes` of text drawn from pieces of code, prose in several scripts, emoji, numbers,
// contractions, punctuation and whitespace runs.
std::string mixed_text(size_t bytes, uint64_t salt) {
    static const char* const pieces[] = {
        "def f(x):\n    return x + 1\n",
        "for (int i = 0; i < n; ++i) { sum += a[i]; }\n",
        "The quick brown fox's jumped over the lazy dog. ",
        "I'll say they're sure we've done it, don't you think? ",
        "naïve café Straße, Ελληνικά γράμματα, русский текст, ",
        "中文字符和日本語のテキスト、한국어 문장. ",
        "emoji 😀👍🏽🚀 and flags 🇫🇷 ",
        "3.14159 2718 1000000 0x1F ",
        "    ",
        "\n\n\n",
        "\t\t",
        "!!! ??? ... --- *** ",
        "<|endoftext|>",
        "   trailing spaces   \n",
        "CamelCaseWords and snake_case_names ",
    };
    Rng rng(salt);
    std::string s;
    while (s.size() < bytes) s += pieces[rng.integer(0, int(std::size(pieces)) - 1)];
    return s;
}

// Up to `bytes` of the Python standard library's source, files in name order ("" where there is
// none): real code and docstrings.
std::string python_sources(size_t bytes) {
    std::vector<fs::path> files;
    std::error_code ec;
    for (const auto& lib : fs::directory_iterator("/usr/lib", ec))
        if (lib.path().filename().string().rfind("python3.", 0) == 0)
            for (const auto& f : fs::directory_iterator(lib.path(), ec))
                if (f.path().extension() == ".py") files.push_back(f.path());
    std::sort(files.begin(), files.end());
    std::string s;
    for (const auto& f : files) {
        if (s.size() >= bytes) break;
        s += read_text(f.string());
    }
    return s.substr(0, std::min(s.size(), bytes));
}

std::vector<uint32_t> read_ids(const std::string& path) {
    std::ifstream in(path);
    std::vector<uint32_t> ids;
    for (uint32_t v; in >> v;) ids.push_back(v);
    return ids;
}

// A tokenizer trained by the reference on `train` (its first bytes), in dir/tok.
bool reference_tokenizer(const TempDir& dir, const std::string& train, int merges) {
    const std::string text = dir.write("train.txt", train);
    std::string err;
    const int rc = run_program(
        kPython,
        {repo_script("bpe_reference.py"), "train", text, "--merges", std::to_string(merges), "--out", dir / "tok"},
        &err);
    REQUIRE_MESSAGE(rc == 0, err);
    return true;
}

}  // namespace

TEST_CASE("byte-level BPE: the ids of an independent GPT-2 encoder over 1 MB of mixed text, both file layouts") {
    if (!python_has("regex", "Python's regex module", "python3-regex")) return;
    TempDir dir;
    // half synthetic mixed text, half real code where the machine has Python's sources
    const std::string code = python_sources(1 << 19);
    const std::string text = mixed_text((1 << 20) - code.size(), 901) + code;
    MESSAGE(code.size() << " bytes of Python's sources in the text");
    reference_tokenizer(dir, text.substr(0, 60000) + code.substr(0, 60000), 300);
    const std::string text_path = dir.write("text.txt", text);
    std::string err;
    REQUIRE_MESSAGE(run_program(kPython,
                                {repo_script("bpe_reference.py"), "encode", text_path, "--tokenizer", dir / "tok",
                                 "--out", dir / "ids.txt"},
                                &err) == 0,
                    err);
    const std::vector<uint32_t> want = read_ids(dir / "ids.txt");
    REQUIRE(want.size() > 100000);
    // the folder reads tokenizer.json; vocab.json names GPT-2's pair of files
    for (const std::string& path : {dir / "tok", dir / "tok/vocab.json"}) {
        CAPTURE(path);
        const auto t = load_tokenizer(path);
        CHECK(t->vocab_size() == 256 + 300 + 1);
        const std::vector<uint32_t> ids = t->encode(text);
        CHECK(ids.size() == want.size());
        CHECK(ids == want);
        CHECK(t->decode(ids) == text);
    }
}

TEST_CASE("tokenizers encode any bytes: decode(encode(x)) == x, invalid UTF-8 included") {
    if (!python_has("regex", "Python's regex module", "python3-regex")) return;
    TempDir dir;
    reference_tokenizer(dir, mixed_text(60000, 902), 100);
    const auto bpe = load_tokenizer(dir / "tok");
    const auto bytes = byte_tokenizer();
    Rng rng(903);
    for (int rep = 0; rep < 200; ++rep) {
        std::string x(size_t(rng.integer(0, 300)), '\0');
        for (char& c : x) c = char(rng.integer(0, 255));
        if (rep % 3 == 0) x = mixed_text(200, 904 + rep) + x;  // text, then bytes that are not UTF-8
        CHECK(bpe->decode(bpe->encode(x)) == x);
        CHECK(bytes->decode(bytes->encode(x)) == x);
    }
    // <|endoftext|> is one id wherever it stands; ids beyond the vocabulary are refused
    const std::vector<uint32_t> eot = bpe->encode("<|endoftext|>");
    CHECK(eot == std::vector<uint32_t>{bpe->vocab_size() - 1});
    const std::vector<uint32_t> bad = {0, bpe->vocab_size()};
    CHECK_THROWS_WITH_AS(bpe->decode(bad), doctest::Contains("is not in the vocabulary"), DataError);
    const std::vector<uint32_t> big = {256};
    CHECK_THROWS_WITH_AS(bytes->decode(big), doctest::Contains("token id 256 is not a byte"), DataError);
}

TEST_CASE("tokenizer files that lie are refused, naming the file and what is wrong") {
    TempDir dir;
    const auto refused = [&](const std::string& path, const char* what) {
        CAPTURE(path);
        CHECK_THROWS_WITH_AS(load_tokenizer(path), doctest::Contains(what), DataError);
    };
    // a vocabulary without a token for every byte is not a byte-level BPE
    const std::string good_dir = dir / "good";
    fs::create_directories(good_dir);
    std::ofstream(good_dir + "/vocab.json") << R"({"a": 0, "b": 1, "ab": 2})";
    std::ofstream(good_dir + "/merges.txt") << "#version: 0.2\na b\n";
    refused(good_dir, "has no token for byte 0");
    refused(dir.write("trunc.json", R"({"model": {"type": "BPE", "vocab": {"a": 0)"), "trunc.json: not JSON");
    refused(dir.write("unigram.json", R"({"model": {"type": "Unigram", "vocab": []}})"), "model.type is 'Unigram'");
    refused(dir.write("fallback.json", R"({"model": {"type": "BPE", "byte_fallback": true, "vocab": {}}})"),
            "byte_fallback");
    refused(dir.write("nobyte.json", R"({"model": {"type": "BPE", "vocab": {}}, "pre_tokenizer": null})"),
            "no ByteLevel step");
    refused(dir.write("badid.json",
                      R"({"model": {"type": "BPE", "vocab": {"a": -1}}, "pre_tokenizer": {"type": "ByteLevel"}})"),
            "expected an id below 2^30");
    refused(dir / "missing", "no such tokenizer file or folder");
    fs::create_directories(dir / "empty");
    refused(dir / "empty", "no tokenizer.json, nor vocab.json and merges.txt");
    if (!python_has("regex", "Python's regex module", "python3-regex")) return;
    // a real vocabulary with a merge naming a token it lacks, and one whose join it lacks
    reference_tokenizer(dir, mixed_text(20000, 905), 20);
    std::ofstream(dir / "tok/merges.txt", std::ios::app) << "zzz q\n";
    refused(dir / "tok/vocab.json", "merge 21 ('zzz q') names 'zzz', which the vocabulary lacks");
}
