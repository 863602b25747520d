// `mirrored tokenize --tokenizer T --out DIR INPUTS...`: text files and folders to a language model's
// token files. Files (a folder's, recursively, in name order; hidden ones left out; gzip ones read
// unzipped) are encoded on every core, each followed by the tokenizer's <|endoftext|> where it has
// one; every Nth file is held out for validation, so no file is split. DIR gets train.bin and val.bin - nanoGPT's raw uint16
// where the vocabulary fits, llm.c's header and uint32 ids above 65,536 - meta.json (tokens and text
// bytes per file: bits per byte in training) and the tokenizer's own files, so the folder carries
// what made it. Nothing in DIR is replaced that this command did not write.
#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include <unistd.h>

#include "base/error.h"
#include "base/io.h"
#include "base/output.h"
#include "data/dataset.h"
#include "data/tokenizer.h"
#include "mirrored/tools/tools.h"
#include "mirrored/util.h"

namespace mirrored {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr const char* kWriter = "mirrored tokenize";

bool wanted(const std::string& path, const std::vector<std::string>& suffixes) {
    if (suffixes.empty()) return true;
    for (const std::string& s : suffixes)
        if (path.size() >= s.size() && path.compare(path.size() - s.size(), s.size(), s) == 0) return true;
    return false;
}

std::vector<std::string> listed_files(const std::vector<std::string>& inputs,
                                      const std::vector<std::string>& suffixes) {
    std::vector<std::string> files;
    for (const std::string& in : inputs) {
        std::error_code ec;
        if (fs::is_directory(in, ec)) {
            std::vector<std::string> found;
            for (auto it = fs::recursive_directory_iterator(in, fs::directory_options::skip_permission_denied, ec);
                 it != fs::recursive_directory_iterator(); it.increment(ec)) {
                if (ec) throw DataError(in + ": cannot list: " + ec.message());
                const std::string name = it->path().filename().string();
                if (!name.empty() && name[0] == '.') {
                    if (it->is_directory(ec)) it.disable_recursion_pending();
                    continue;
                }
                if (it->is_regular_file(ec) && wanted(it->path().string(), suffixes))
                    found.push_back(it->path().string());
            }
            std::sort(found.begin(), found.end());
            files.insert(files.end(), found.begin(), found.end());
        } else if (fs::is_regular_file(in, ec)) {
            files.push_back(in);
        } else {
            throw DataError(in + ": no such file or folder");
        }
    }
    return files;
}

// A whole file as text (data/dataset.h's reader: a gzip file is read unzipped).
std::string read_text_file(const std::string& path) {
    const std::vector<unsigned char> b = read_file(path);
    return std::string(b.begin(), b.end());
}

// What DIR may receive: a name this command writes is replaced only where DIR's meta.json says it
// wrote them.
void check_out(const std::string& dir, const std::vector<std::string>& names) {
    std::error_code ec;
    if (fs::exists(dir, ec) && !fs::is_directory(dir, ec)) throw ConfigError("--out: " + dir + " is not a folder");
    bool ours = false;
    if (fs::exists(fs::path(dir) / "meta.json", ec)) {
        std::ifstream in(fs::path(dir) / "meta.json");
        const json j = json::parse(in, nullptr, false);
        ours = j.is_object() && j.value("writer", "") == kWriter;
    }
    for (const std::string& n : names)
        if (fs::exists(fs::path(dir) / n, ec) && !ours)
            throw ConfigError("--out: " + (fs::path(dir) / n).string() +
                              " exists and was not written by mirrored tokenize; choose another folder");
}

}  // namespace

int tokenize(const TokenizeOptions& o) {
    if (o.val_every < 2) throw ConfigError("--val-every: expected 2 or more (every Nth file held out)");
    if (o.train_bpe && o.tokenizer != "bytes")
        throw ConfigError("--train-bpe: trains its own tokenizer; drop --tokenizer " + o.tokenizer);
    const bool trained = o.train_bpe > 0;
    const std::vector<std::string> files = listed_files(o.inputs, o.suffixes);
    if (size_t(o.val_every) > files.size())
        throw ConfigError(std::to_string(files.size()) + " file(s) leave an empty validation split (every " +
                          std::to_string(o.val_every) + "th is held out): give more files or a smaller --val-every");
    // the tokenizer's files travel with the token files
    std::vector<std::pair<std::string, std::string>> copies;  // (source, name in DIR)
    if (trained) {
        copies.push_back({"", "tokenizer.json"});
    } else if (o.tokenizer != "bytes") {
        const fs::path t(o.tokenizer);
        std::error_code ec;
        const fs::path dir = fs::is_directory(t, ec) ? t : t.parent_path();
        if (t.extension() == ".model" && fs::is_regular_file(t, ec)) {  // a SentencePiece model of any name
            copies.push_back({t.string(), "tokenizer.model"});
        } else if (t.extension() == ".tiktoken" && fs::is_regular_file(t, ec)) {
            copies.push_back({t.string(), t.filename().string()});  // its name names its encoding
        } else {
            for (const std::string& f : tokenizer_files(dir.empty() ? "." : dir.string()))
                copies.push_back({f, fs::path(f).filename().string()});
        }
    }
    std::vector<std::string> names = {"train.bin", "val.bin", "meta.json"};
    for (const auto& c : copies) names.push_back(c.second);
    check_out(o.out, names);
    for (const std::string& f : files)
        for (const std::string& n : names)
            if (same_file(f, (fs::path(o.out) / n).string()))
                throw ConfigError("--out: " + f + " is an input; choose another folder");
    std::string trained_json;  // --train-bpe: a byte-level BPE of the training files (the held-out ones unseen)
    if (trained) {
        const double t0 = now_s();
        std::vector<std::string> texts;
        for (size_t i = 0; i < files.size(); ++i)
            if (i % size_t(o.val_every) != size_t(o.val_every) - 1) texts.push_back(read_text_file(files[i]));
        size_t bytes = 0;
        for (const std::string& t : texts) bytes += t.size();
        BpeTraining bpe;
        bpe.vocab_size = uint32_t(o.train_bpe);
        bpe.threads = std::max(1, o.threads > 0 ? o.threads : int(std::thread::hardware_concurrency()));
        trained_json = train_bpe(std::vector<std::string_view>(texts.begin(), texts.end()), bpe);
        std::fprintf(stderr, "trained a byte-level BPE of %d tokens on %s of text in %.1f s\n", o.train_bpe,
                     format_bytes(bytes).c_str(), now_s() - t0);
    }
    const std::unique_ptr<Tokenizer> tok = trained ? tokenizer_from_json(trained_json, "the trained tokenizer")
                                           : o.tokenizer == "bytes" ? byte_tokenizer()
                                                                    : load_tokenizer(o.tokenizer);

    const std::optional<uint32_t> end_of_text = tok->end_of_text();
    const std::vector<uint32_t> eot = end_of_text ? std::vector<uint32_t>{*end_of_text} : std::vector<uint32_t>{};
    const bool has_eot = !eot.empty();
    std::vector<std::vector<uint32_t>> ids(files.size());
    std::vector<size_t> sizes(files.size());
    std::atomic<size_t> next{0}, done{0}, bytes_done{0};
    std::vector<std::string> errors(files.size());
    const int threads = std::max(1, o.threads > 0 ? o.threads : int(std::thread::hardware_concurrency()));
    const double start = now_s();
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t)
        pool.emplace_back([&] {
            for (size_t i; (i = next++) < files.size();) {
                try {
                    const std::string text = read_text_file(files[i]);
                    ids[i] = tok->encode(text);
                    if (has_eot) ids[i].push_back(eot[0]);
                    sizes[i] = text.size();
                    bytes_done += text.size();
                } catch (const std::exception& e) {
                    errors[i] = e.what();
                }
                ++done;
            }
        });
    const bool terminal = ::isatty(2);
    while (done < files.size()) {  // progress on a terminal's stderr, a line rewritten in place
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        const double s = std::max(now_s() - start, 1e-9);
        if (terminal)
            std::fprintf(stderr, "\rtokenize: %s/%zu files, %.1f MB, %.1f MB/s", std::to_string(done.load()).c_str(),
                         files.size(), double(bytes_done) / 1e6, double(bytes_done) / 1e6 / s);
    }
    for (auto& th : pool) th.join();
    if (terminal) std::fprintf(stderr, "\n");
    for (const std::string& e : errors)
        if (!e.empty()) throw DataError(e);

    std::vector<uint32_t> split[2];
    size_t file_count[2] = {0, 0}, byte_count[2] = {0, 0};
    for (size_t i = 0; i < files.size(); ++i) {
        const int v = int(i % size_t(o.val_every) == size_t(o.val_every) - 1);
        split[v].insert(split[v].end(), ids[i].begin(), ids[i].end());
        ++file_count[v];
        byte_count[v] += sizes[i];
    }
    const bool wide = tok->vocab_size() > 65536;
    fs::create_directories(o.out);
    json meta = {{"writer", kWriter},
                 {"vocab", tok->vocab_size()},
                 {"tokenizer", tok->description()},
                 {"dtype", wide ? "uint32" : "uint16"},
                 {"format", wide ? "llm.c (header, uint32)" : "raw"},
                 {"files", {{"train", file_count[0]}, {"val", file_count[1]}}},
                 {"bytes", {{"train", byte_count[0]}, {"val", byte_count[1]}}},
                 {"tokens", {{"train", split[0].size()}, {"val", split[1].size()}}}};
    if (has_eot) meta["end_of_text"] = eot[0];
    for (const auto& [src, name] : copies)
        write_file_atomic((fs::path(o.out) / name).string(), src.empty() ? trained_json : read_text_file(src));
    write_file_atomic((fs::path(o.out) / "train.bin").string(), token_file_bytes(split[0], wide));
    write_file_atomic((fs::path(o.out) / "val.bin").string(), token_file_bytes(split[1], wide));
    write_file_atomic((fs::path(o.out) / "meta.json").string(), meta.dump(1) + "\n");
    const double s = std::max(now_s() - start, 1e-9);
    std::printf(
        "tokenize: %s: %zu training tokens from %zu files, %zu validation tokens from %zu files; vocabulary "
        "%u (%s); %.1f MB in %.2f s on %d threads\n",
        o.out.c_str(), split[0].size(), file_count[0], split[1].size(), file_count[1], tok->vocab_size(),
        tok->description().c_str(), double(byte_count[0] + byte_count[1]) / 1e6, s, threads);
    return kExitOk;
}

}  // namespace mirrored
