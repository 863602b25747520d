// Tokenizers (data/tokenizer.h): byte-level BPE against an independent encoder written from GPT-2's
// encoder.py (scripts/bpe_reference.py) over 1 MB of mixed text - code, prose, several scripts,
// emoji, runs of spaces and newlines, <|endoftext|> - read from both of Hugging Face's layouts;
// decode(encode(x)) == x for any bytes, valid UTF-8 or not; files that lie are refused, named.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

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

// The first `n` bytes of s or fewer, not cutting a UTF-8 sequence (the reference reads UTF-8 text).
std::string utf8_prefix(const std::string& s, size_t n) {
    if (n >= s.size()) return s;
    while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
    return s.substr(0, n);
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
    return utf8_prefix(s, bytes);
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
    reference_tokenizer(dir, utf8_prefix(text, 60000) + utf8_prefix(code, 60000), 300);
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
    CHECK(bpe->end_of_text() == eot[0]);  // where generate stops
    CHECK(!bytes->end_of_text());
    const std::vector<uint32_t> bad = {0, bpe->vocab_size()};
    CHECK_THROWS_WITH_AS(bpe->decode(bad), doctest::Contains("is not in the vocabulary"), DataError);
    const std::vector<uint32_t> big = {256};
    CHECK_THROWS_WITH_AS(bytes->decode(big), doctest::Contains("token id 256 is not a byte"), DataError);
}

TEST_CASE("SentencePiece: a model trained here gives python3-sentencepiece's ids over 1 MB; tokenize takes it") {
    if (!python_has("sentencepiece", "Python's sentencepiece", "python3-sentencepiece")) return;
    TempDir dir;
    const std::string text = mixed_text(1 << 20, 77);
    const std::string corpus = dir.write("corpus.txt", utf8_prefix(text, 200000));
    const std::string text_path = dir.write("text.txt", text);
    // a BPE of 600 pieces with byte fallback, as Llama 2's is built; the reference encodes and decodes
    const std::string script =
        "import sys, sentencepiece as spm\n"
        "spm.SentencePieceTrainer.train(input=sys.argv[1], model_prefix=sys.argv[2], vocab_size=600,\n"
        "    model_type='bpe', byte_fallback=True, character_coverage=1.0, num_threads=1, minloglevel=2)\n"
        "sp = spm.SentencePieceProcessor(model_file=sys.argv[2] + '.model')\n"
        "text = open(sys.argv[3], encoding='utf-8', errors='surrogateescape').read()\n"
        "ids = sp.encode(text)\n"
        "open(sys.argv[4], 'w').write(' '.join(map(str, ids)))\n"
        "open(sys.argv[5], 'w', encoding='utf-8').write(sp.decode(ids))\n";
    std::string err;
    REQUIRE_MESSAGE(
        run_program(kPython, {"-c", script, corpus, dir / "spm", text_path, dir / "ids.txt", dir / "decoded.txt"},
                    &err) == 0,
        err);
    const std::unique_ptr<Tokenizer> sp = load_tokenizer(dir / "spm.model");
    CHECK(sp->vocab_size() == 600);
    const std::vector<uint32_t> ids = sp->encode(text);
    CHECK(ids == read_ids(dir / "ids.txt"));
    CHECK(sp->decode(ids) == read_text(dir / "decoded.txt"));  // the text as its model normalises it
    CHECK(sp->end_of_text() == 2u);                            // </s>
    CHECK_THROWS_WITH_AS(sp->decode(std::vector<uint32_t>{600}), doctest::Contains("not in the vocabulary"), DataError);
    CHECK_THROWS_WITH_AS(load_tokenizer(dir.write("bad.model", "not a model")),
                         doctest::Contains("bad.model: not a SentencePiece model"), DataError);
    // tokenize: the model travels as tokenizer.model, each file ends with </s>
    fs::create_directories(dir / "in");
    for (int i = 0; i < 4; ++i) std::ofstream(dir / ("in/f" + std::to_string(i) + ".txt")) << mixed_text(3000, 10 + i);
    REQUIRE(
        run_cli({"tokenize", dir / "in", "--tokenizer", dir / "spm.model", "--out", dir / "tok", "--val-every", "4"},
                {}, -1, &err) == kExitOk);
    CHECK(fs::exists(dir / "tok/tokenizer.model"));
    const nlohmann::json meta = nlohmann::json::parse(read_text(dir / "tok/meta.json"));
    CHECK(meta["end_of_text"] == 2);
    CHECK(load_tokenizer(dir / "tok")->encode("café") == sp->encode("café"));
}

TEST_CASE("train_bpe: the reference trainer's merges and vocabulary over 2.5 MB; tokenize --train-bpe uses it") {
    if (!python_has("regex", "Python's regex module", "python3-regex")) return;
    TempDir dir;
    const std::string code = python_sources(1 << 20);
    const std::string text = mixed_text((5 << 19) - code.size(), 33) + "<|endoftext|>" + code;
    const std::string text_path = dir.write("text.txt", text);
    std::string err;
    REQUIRE_MESSAGE(
        run_program(kPython,
                    {repo_script("bpe_reference.py"), "train", text_path, "--merges", "60", "--out", dir / "ref"},
                    &err) == 0,
        err);
    BpeTraining t;
    t.merges = 60;
    t.threads = 2;
    const nlohmann::json ours = nlohmann::json::parse(train_bpe({text}, t));
    const nlohmann::json ref = nlohmann::json::parse(read_text(dir / "ref/tokenizer.json"));
    CHECK(ours["model"]["merges"] == ref["model"]["merges"]);
    CHECK(ours["model"]["vocab"] == ref["model"]["vocab"]);
    // one thread, or the text in two files, count the same pieces
    t.threads = 1;
    const size_t cut = text.find("\ndef ", text.size() / 2) + 1;
    CHECK(nlohmann::json::parse(train_bpe({std::string_view(text).substr(0, cut), std::string_view(text).substr(cut)},
                                          t))["model"]["merges"] == ref["model"]["merges"]);
    // a vocabulary size: 256 bytes, the merged tokens, <|endoftext|>; it loads and round-trips
    BpeTraining sized;
    sized.vocab_size = 300;
    const std::unique_ptr<Tokenizer> tok = tokenizer_from_json(train_bpe({text}, sized), "trained");
    CHECK(tok->vocab_size() == 300);
    CHECK(tok->end_of_text() == 299u);
    CHECK(tok->decode(tok->encode(text)) == text);
    // tokenize --train-bpe: trained on the training files only, written beside the token files
    fs::create_directories(dir / "in");
    for (int i = 0; i < 4; ++i) std::ofstream(dir / ("in/f" + std::to_string(i) + ".txt")) << mixed_text(20000, 50 + i);
    REQUIRE(run_cli({"tokenize", dir / "in", "--train-bpe", "320", "--out", dir / "tok", "--val-every", "4"}, {}, -1,
                    &err) == kExitOk);
    const std::unique_ptr<Tokenizer> written = load_tokenizer(dir / "tok");
    CHECK(written->vocab_size() == 320);
    const nlohmann::json meta = nlohmann::json::parse(read_text(dir / "tok/meta.json"));
    CHECK(meta["vocab"] == 320);
    std::vector<std::string_view> train;
    std::vector<std::string> kept;
    for (int i = 0; i < 3; ++i) kept.push_back(read_text(dir / ("in/f" + std::to_string(i) + ".txt")));
    for (const std::string& k : kept) train.push_back(k);
    BpeTraining same;
    same.vocab_size = 320;
    CHECK(nlohmann::json::parse(read_text(dir / "tok/tokenizer.json")) ==
          nlohmann::json::parse(train_bpe(train, same)));
    CHECK(run_cli({"tokenize", dir / "in", "--train-bpe", "320", "--tokenizer", dir / "tok", "--out", dir / "tok2"}, {},
                  -1, &err) == kExitUsage);
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
    // values of other types than Hugging Face writes
    refused(dir.write("types.json", R"({"model": {"type": 5}})"), "types.json: not a Hugging Face tokenizer.json");
    refused(dir.write("pattern.json", R"({"model": {"type": "BPE", "vocab": {}},
        "pre_tokenizer": {"type": "Split", "pattern": {"Regex": [1]}}})"),
            "pattern.json: not a Hugging Face tokenizer.json");
    refused(
        dir.write("wide.json", R"({"model": {"type": "BPE", "vocab": {"a": 0}}, "pre_tokenizer": {"type": "ByteLevel"},
        "added_tokens": [{"id": 4294967301, "content": "<s>"}]})"),
        "has an id past 2^30");
    refused(dir / "missing", "no such tokenizer file or folder");
    fs::create_directories(dir / "empty");
    refused(dir / "empty", "no tokenizer.model, tokenizer.json, vocab.json and merges.txt, nor a .tiktoken");
    if (!python_has("regex", "Python's regex module", "python3-regex")) return;
    // a real vocabulary with a merge naming a token it lacks, and one whose join it lacks
    reference_tokenizer(dir, mixed_text(20000, 905), 20);
    std::ofstream(dir / "tok/merges.txt", std::ios::app) << "zzz q\n";
    refused(dir / "tok/vocab.json", "merge 21 ('zzz q') names 'zzz', which the vocabulary lacks");
}

namespace {

// A tiktoken rank file of the 256 bytes (ranks 0-255, in byte order) and then `extra` lines.
std::string byte_ranks(const std::string& extra) {
    static const char* const b64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    std::string s;
    for (int b = 0; b < 256; ++b)
        s += std::string{b64[b >> 2], b64[(b & 3) << 4], '=', '='} + " " + std::to_string(b) + "\n";
    return s + extra;
}

// js-tiktoken installed from the npm registry into dir/node_modules; else the test says skipped.
bool js_tiktoken(const TempDir& dir) {
    if (run_program("node", {"--version"}) != 0) {
        mark_skipped("node is not installed (Debian and Ubuntu: nodejs, npm)");
        return false;
    }
    std::string err;
    if (run_program(
            "npm",
            {"install", "--prefix", dir.path().string(), "--no-audit", "--no-fund", "--silent", "js-tiktoken@1.0.21"},
            &err) != 0) {
        mark_skipped("js-tiktoken could not be installed from the npm registry: " + err.substr(0, 300));
        return false;
    }
    return true;
}

}  // namespace

TEST_CASE("tiktoken rank files: GPT-2's, cl100k's and o200k's ranks give js-tiktoken's ids over 1 MB") {
    TempDir dir;
    if (!js_tiktoken(dir)) return;
    const std::string modules = dir / "node_modules", script = repo_script("tiktoken_reference.js");
    const std::string code = python_sources(1 << 19);
    const std::string text = mixed_text((1 << 20) - code.size(), 907) + code;
    const std::string text_path = dir.write("text.txt", text);
    for (const char* name : {"gpt2", "cl100k_base", "o200k_base"}) {
        CAPTURE(name);
        const std::string ranks = dir / (std::string(name) + ".tiktoken"),
                          ids_path = dir / (std::string(name) + ".ids");
        std::string err;
        REQUIRE_MESSAGE(run_program("node", {script, modules, "ranks", name, ranks}, &err) == 0, err);
        REQUIRE_MESSAGE(run_program("node", {script, modules, "encode", name, text_path, ids_path}, &err) == 0, err);
        const std::vector<uint32_t> want = read_ids(ids_path);
        REQUIRE(want.size() > 100000);
        const auto t = load_tokenizer(ranks);
        const std::vector<uint32_t> ids = t->encode(text);
        CHECK(ids.size() == want.size());
        CHECK(ids == want);
        CHECK(t->decode(ids) == text);
        REQUIRE(t->end_of_text());
        CHECK(t->decode(std::vector<uint32_t>{*t->end_of_text()}) == "<|endoftext|>");
    }
    CHECK(load_tokenizer(dir / "gpt2.tiktoken")->vocab_size() == 50257);
    CHECK(load_tokenizer(dir / "o200k_base.tiktoken")->vocab_size() == 200019);
}

TEST_CASE("tiktoken rank files that lie are refused, naming the file, the line and what is wrong") {
    TempDir dir;
    const auto refused = [&](const std::string& name, const std::string& ranks, const char* what) {
        CAPTURE(name);
        CHECK_THROWS_WITH_AS(load_tokenizer(dir.write(name, ranks)), doctest::Contains(what), DataError);
    };
    // "ab" (YWI=) merges "a" and "b"; "abc" (YWJj) merges "ab" and "c"
    const auto t = load_tokenizer(dir.write("mine.tiktoken", byte_ranks("YWI= 256\nYWJj 257\n")));
    CHECK(t->vocab_size() == 259);  // <|endoftext|> after the last rank
    CHECK(t->encode("abcab") == std::vector<uint32_t>{257, 256});
    CHECK(t->encode("x<|endoftext|>") == std::vector<uint32_t>{'x', 258});
    // a token far past the others costs no table of gigabytes: its id read and written back
    const auto far = load_tokenizer(dir.write("far.tiktoken", byte_ranks("YWI= 536870912\n")));
    CHECK(far->vocab_size() == (1u << 29) + 2);
    CHECK(far->encode("ab<|endoftext|>") == std::vector<uint32_t>{1u << 29, (1u << 29) + 1});
    CHECK(far->decode(std::vector<uint32_t>{'x', 1u << 29, (1u << 29) + 1}) == "xab<|endoftext|>");
    CHECK_THROWS_WITH_AS(far->decode(std::vector<uint32_t>{1u << 28}), doctest::Contains("token id 268435456 is not"),
                         DataError);
    // tokenize copies the rank file, under its name, beside the token files
    fs::create_directories(dir / "docs");
    dir.write("docs/a.txt", "abcab x");
    dir.write("docs/b.txt", "ab abc");
    std::string err;
    REQUIRE(run_cli({"tokenize", dir / "docs", "--out", dir / "data", "--tokenizer", dir / "mine.tiktoken",
                     "--val-every", "2"},
                    {}, -1, &err) == kExitOk);
    CHECK(load_tokenizer(dir / "data")->encode("abcab") == std::vector<uint32_t>{257, 256});
    refused("base64.tiktoken", byte_ranks("YW*= 256\n"), "base64.tiktoken:257: expected a token's bytes in base64");
    refused("norank.tiktoken", byte_ranks("YWI=\n"), "norank.tiktoken:257: expected a token's bytes in base64");
    refused("rank.tiktoken", byte_ranks("YWI= 25x\n"), "rank.tiktoken:257: rank '25x' is not a whole number");
    refused("big.tiktoken", byte_ranks("YWI= 4294967296\n"), "is not a whole number below 2^30");
    refused("twice.tiktoken", byte_ranks("YWI= 256\nYWI= 257\n"), "twice.tiktoken:258: token 'YWI=' is listed twice");
    refused("tworank.tiktoken", byte_ranks("YWI= 256\nYWJj 256\n"), "rank 256 is given to two tokens");
    // "abc" before "ab": three bytes no lower-ranked token joins
    refused("order.tiktoken", byte_ranks("YWJj 256\nYWI= 257\n"),
            "the token of rank 256 ('abc') is not the merge of two tokens of lower rank");
    refused("nobytes.tiktoken", "YWI= 0\n", "has no token for byte 0");
    refused("empty.tiktoken", "", "no tokens");
    // gpt2's <|endoftext|> is 50256: a token at that rank cannot be
    refused("gpt2.tiktoken", byte_ranks("YWI= 50256\n"), "rank 50256 is <|endoftext|>'s id in the gpt2 encoding");
    fs::create_directories(dir / "two");
    dir.write("two/a.tiktoken", byte_ranks(""));
    dir.write("two/b.tiktoken", byte_ranks(""));
    CHECK_THROWS_WITH_AS(load_tokenizer(dir / "two"), doctest::Contains("more than one .tiktoken"), DataError);
}

namespace {

std::vector<uint32_t> u16_ids(const std::string& path) {
    const std::string b = read_text(path);
    std::vector<uint32_t> ids(b.size() / 2);
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = uint8_t(b[2 * i]) | uint32_t(uint8_t(b[2 * i + 1])) << 8;
    return ids;
}

}  // namespace

TEST_CASE("tokenize: text files and folders to token files, every Nth file held out, the tokenizer beside them") {
    TempDir dir;
    std::vector<std::string> texts;
    fs::create_directories(dir / "docs/sub");
    fs::create_directories(dir / "docs/.git");
    for (int i = 0; i < 12; ++i) {
        texts.push_back(mixed_text(size_t(300 + 40 * i), 910 + uint64_t(i)));
        const std::string name = (i < 6 ? "docs/" : "docs/sub/") + std::string(1, char('a' + i)) + ".txt";
        std::ofstream(dir / name, std::ios::binary) << texts.back();
    }
    std::ofstream(dir / "docs/.git/HEAD") << "hidden: left out";
    std::ofstream(dir / "docs/notes.bin") << "not a .txt: left out by --suffix";
    std::string err;
    // bytes: file 10 (index 9) held out with --val-every 10; names in order, sub-folders after files
    REQUIRE(run_cli({"tokenize", dir / "docs", "--out", dir / "bytes", "--suffix", ".txt"}, {}, -1, &err) == kExitOk);
    std::string train, val;
    for (int i = 0; i < 12; ++i) (i == 9 ? val : train) += texts[size_t(i)];
    const auto as_text = [](const std::vector<uint32_t>& ids) { return byte_tokenizer()->decode(ids); };
    CHECK(as_text(u16_ids(dir / "bytes/train.bin")) == train);
    CHECK(as_text(u16_ids(dir / "bytes/val.bin")) == val);
    const nlohmann::json meta = nlohmann::json::parse(read_text(dir / "bytes/meta.json"));
    CHECK(meta["tokens"]["val"] == val.size());
    CHECK(meta["bytes"]["train"] == train.size());
    CHECK(meta["files"]["train"] == 11);
    // a second run replaces its own files; a folder it did not write is refused, as are bad arguments
    CHECK(run_cli({"tokenize", dir / "docs", "--out", dir / "bytes", "--suffix", ".txt"}, {}, -1, &err) == kExitOk);
    fs::create_directories(dir / "foreign");
    std::ofstream(dir / "foreign/train.bin") << "someone's";
    CHECK(run_cli({"tokenize", dir / "docs", "--out", dir / "foreign"}, {}, -1, &err) == kExitUsage);
    CHECK(err.find("was not written by mirrored tokenize") != std::string::npos);
    CHECK(read_text(dir / "foreign/train.bin") == "someone's");
    CHECK(run_cli({"tokenize", dir / "docs/a.txt", "--out", dir / "one"}, {}, -1, &err) == kExitUsage);
    CHECK(err.find("leave an empty validation split") != std::string::npos);
    CHECK(run_cli({"tokenize", dir / "nothing", "--out", dir / "none"}, {}, -1, &err) == kExitData);
    CHECK(err.find("nothing: no such file or folder") != std::string::npos);
    // a damaged file among them, met while the token files are being written: named; the earlier
    // token files stay as they were, and no partial write is left behind
    const std::string before = read_text(dir / "bytes/train.bin");
    std::ofstream(dir / "docs/c2.txt", std::ios::binary) << std::string("\x1f\x8b\x08\0damaged", 12);
    CHECK(run_cli({"tokenize", dir / "docs", "--out", dir / "bytes", "--suffix", ".txt", "--threads", "2"}, {}, -1,
                  &err) == kExitData);
    CHECK(err.find("c2.txt") != std::string::npos);
    CHECK(read_text(dir / "bytes/train.bin") == before);
    for (const auto& f : fs::directory_iterator(dir / "bytes")) CHECK(f.path().extension() != ".tmp");
    fs::remove(dir / "docs/c2.txt");

    if (!python_has("regex", "Python's regex module", "python3-regex")) return;
    reference_tokenizer(dir, mixed_text(40000, 920), 150);
    REQUIRE(run_cli({"tokenize", dir / "docs", "--out", dir / "bpe", "--suffix", ".txt", "--tokenizer", dir / "tok",
                     "--threads", "3"},
                    {}, -1, &err) == kExitOk);
    const auto bpe = load_tokenizer(dir / "bpe");  // the tokenizer travelled with the files
    std::vector<uint32_t> want;
    for (int i = 0; i < 12; ++i)
        if (i != 9) {  // each file, then <|endoftext|>
            const std::vector<uint32_t> ids = bpe->encode(texts[size_t(i)] + "<|endoftext|>");
            want.insert(want.end(), ids.begin(), ids.end());
        }
    CHECK(u16_ids(dir / "bpe/train.bin") == want);
    CHECK(nlohmann::json::parse(read_text(dir / "bpe/meta.json"))["vocab"] == bpe->vocab_size());
    // a vocabulary past 65,536 ids: llm.c's header and uint32 ids, which the tokens format reads
    nlohmann::json big = nlohmann::json::parse(read_text(dir / "tok/tokenizer.json"));
    big["added_tokens"].push_back({{"id", 70000}, {"content", "<|big|>"}, {"special", true}});
    fs::create_directories(dir / "bigtok");
    std::ofstream(dir / "bigtok/tokenizer.json") << big.dump();
    REQUIRE(
        run_cli({"tokenize", dir / "docs", "--out", dir / "wide", "--suffix", ".txt", "--tokenizer", dir / "bigtok"},
                {}, -1, &err) == kExitOk);
    const std::string wide = read_text(dir / "wide/train.bin");
    REQUIRE(wide.size() == 1024 + 4 * want.size());
    int32_t header[3];
    std::memcpy(header, wide.data(), sizeof header);
    CHECK(header[0] == 20240520);
    CHECK(header[1] == 2);
    CHECK(header[2] == int32_t(want.size()));
    CHECK(std::memcmp(wide.data() + 1024, want.data(), 4 * want.size()) == 0);
}

TEST_CASE("a language model on BPE tokens trains from `tokenize`'s folder; generate takes and prints text") {
    if (!python_has("regex", "Python's regex module", "python3-regex")) return;
    TempDir dir;
    fs::create_directories(dir / "docs");
    for (int i = 0; i < 10; ++i)
        std::ofstream(dir / ("docs/" + std::to_string(i) + ".txt"), std::ios::binary) << mixed_text(3000, 930 + i);
    reference_tokenizer(dir, mixed_text(30000, 940), 100);
    std::string err;
    REQUIRE(run_cli({"tokenize", dir / "docs", "--out", dir / "data", "--tokenizer", dir / "tok", "--val-every", "5"},
                    {}, -1, &err) == kExitOk);
    const std::string cfg = dir.write("llama.yaml",
                                      "run: {name: bpe, seed: 3}\n"
                                      "strategy: {devices: \"cpu:1\"}\n"
                                      "data: {dataset: tokens, root: " +
                                          (dir / "data") +
                                          ", context: 16, vocab: 357}\n"
                                          "model:\n  layers:\n"
                                          "    - {type: embedding, vocab: 357, dim: 16}\n"
                                          "    - {type: llama_block, heads: 2, intermediate_size: 32}\n"
                                          "    - {type: rmsnorm}\n"
                                          "    - {type: lm_head, tie_weights: false, units: 357}\n"
                                          "optimizer: {type: adamw, lr: 0.01}\n"
                                          "train: {epochs: 0, steps: 6, global_batch_size: 4}\n"
                                          "checkpoint: {every_steps: 6}\n");
    REQUIRE(run_cli({"train", cfg, "--output", dir / "run"}, {}, -1, &err) == kExitOk);
    const nlohmann::json s = nlohmann::json::parse(read_text(dir / "run/summary.json"));
    CHECK(s["test_bits_per_byte"].get<double>() < s["test_bits_per_token"].get<double>());  // > 1 byte a token
    std::string ckpt;
    for (const auto& f : fs::directory_iterator(dir / "run/checkpoints")) ckpt = f.path().string();
    const std::string out = dir / "generated.txt";
    REQUIRE(run_cli({"generate", ckpt, "--tokenizer", dir / "data", "--prompt", "def f(", "--tokens", "12"}, {}, -1,
                    &err, Stdout::file, out) == kExitOk);
    CHECK(read_text(out).rfind("def f(", 0) == 0);  // text, not ids
    // the run kept the token files' tokenizer: text without --tokenizer
    CHECK(fs::exists(dir / "run/tokenizer/tokenizer.json"));
    REQUIRE(run_cli({"generate", ckpt, "--prompt", "def f(", "--tokens", "12"}, {}, -1, &err, Stdout::file,
                    dir / "kept.txt") == kExitOk);
    CHECK(read_text(dir / "kept.txt") == read_text(out));
    // a file of prompts, two at a time: each line's text is what --prompt alone printed after it
    REQUIRE(run_cli({"generate", ckpt, "--prompts", dir.write("prompts.jsonl", "\"x = 1\"\n\"def f(\"\n\"\\tü\"\n"),
                     "--tokens", "12", "--batch", "2"},
                    {}, -1, &err, Stdout::file, dir / "batched.txt") == kExitOk);
    std::istringstream lines(read_text(dir / "batched.txt"));
    std::vector<nlohmann::json> batched;
    for (std::string line; std::getline(lines, line);) batched.push_back(nlohmann::json::parse(line));
    REQUIRE(batched.size() == 3);
    CHECK(batched[1]["prompt"] == "def f(");
    CHECK(batched[2]["prompt"] == "\t\xC3\xBC");
    // the same ids as --prompt alone drew (the text in JSON: bytes that are not UTF-8 as U+FFFD)
    REQUIRE(run_cli({"generate", ckpt, "--prompt", "def f(", "--tokens", "12", "--json", dir / "alone.json"}, {}, -1,
                    &err, Stdout::file, dir / "alone.txt") == kExitOk);
    CHECK(batched[1]["ids"] == nlohmann::json::parse(read_text(dir / "alone.json"))["ids"]);
    fs::remove_all(dir / "run/tokenizer");
    CHECK(run_cli({"generate", ckpt, "--prompt", "x"}, {}, -1, &err) == kExitUsage);  // no tokenizer: refused
    CHECK(err.find("text needs the tokenizer it was trained with (--tokenizer") != std::string::npos);
}
