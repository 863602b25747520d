// `mirrored tokenize --tokenizer T --out DIR INPUTS...`: text files and folders to a language model's
// token files. Files (a folder's, recursively, in name order; hidden ones left out; gzip ones read
// unzipped) are encoded on every core, each followed by the tokenizer's <|endoftext|> where it has
// one, and written in file order as they come (memory holds a few files' ids per thread, not the
// corpus's); every Nth file is held out for validation, so no file is split. DIR gets train.bin and
// val.bin - nanoGPT's raw uint16 where the vocabulary fits, llm.c's header and uint32 ids above
// 65,536 - meta.json (tokens and text bytes per file: bits per byte in training) and the
// tokenizer's own files, so the folder carries what made it. Nothing in DIR is replaced that this
// command did not write.
#include <algorithm>
#include <condition_variable>
#include <mutex>
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
    const int threads = std::max(1, o.threads > 0 ? o.threads : int(std::thread::hardware_concurrency()));
    const bool wide = tok->vocab_size() > 65536;
    fs::create_directories(o.out);
    for (const std::string& n : names) remove_stale_temporaries((fs::path(o.out) / n).string());  // a killed run's
    // Files are encoded on `threads` threads at most `window` files ahead of the one written next;
    // the token files are written in file order as the ids come, so memory holds a window of
    // files' ids, not the corpus's.
    const size_t window = size_t(threads) * 4;
    struct Encoded {
        bool ready = false;
        std::vector<uint32_t> ids;
        size_t bytes = 0;
        std::string error;
    };
    std::vector<Encoded> encoded(files.size());
    std::mutex mu;
    std::condition_variable cv;
    size_t next = 0, written = 0;
    bool stop = false;
    const auto encode_files = [&] {
        for (;;) {
            size_t i;
            {
                std::unique_lock<std::mutex> lock(mu);
                cv.wait(lock, [&] { return stop || next >= files.size() || next < written + window; });
                if (stop || next >= files.size()) return;
                i = next++;
            }
            Encoded e;
            try {
                const std::string text = read_text_file(files[i]);
                e.ids = tok->encode(text);
                if (has_eot) e.ids.push_back(eot[0]);
                e.bytes = text.size();
            } catch (const std::exception& x) {
                e.error = x.what();
            }
            e.ready = true;
            std::lock_guard<std::mutex> lock(mu);
            encoded[i] = std::move(e);
            cv.notify_all();
        }
    };
    size_t file_count[2] = {0, 0}, byte_count[2] = {0, 0}, token_count[2] = {0, 0};
    const double start = now_s();
    const bool terminal = ::isatty(2);
    const auto write_split = [&](int train_fd, const std::string& train_tmp, int val_fd, const std::string& val_tmp) {
        TokenFileWriter out[2] = {{train_fd, (fs::path(o.out) / "train.bin").string(), train_tmp, wide},
                                  {val_fd, (fs::path(o.out) / "val.bin").string(), val_tmp, wide}};
        std::vector<std::thread> pool;
        struct Join {  // however this ends, the encoders stop and are joined
            std::vector<std::thread>& pool;
            std::mutex& mu;
            std::condition_variable& cv;
            bool& stop;
            ~Join() {
                {
                    std::lock_guard<std::mutex> lock(mu);
                    stop = true;
                }
                cv.notify_all();
                for (auto& t : pool) t.join();
            }
        } join{pool, mu, cv, stop};
        for (int t = 0; t < threads; ++t) pool.emplace_back(encode_files);
        double shown = 0;
        for (size_t i = 0; i < files.size(); ++i) {
            Encoded e;
            {
                std::unique_lock<std::mutex> lock(mu);
                while (!encoded[i].ready) {
                    cv.wait_for(lock, std::chrono::milliseconds(200));
                    if (terminal && now_s() - shown >= 0.2) {  // progress on a terminal, a line rewritten in place
                        shown = now_s();
                        const double mb = double(byte_count[0] + byte_count[1]) / 1e6;
                        std::fprintf(stderr, "\rtokenize: %zu/%zu files, %.1f MB, %.1f MB/s", i, files.size(), mb,
                                     mb / std::max(shown - start, 1e-9));
                    }
                }
                e = std::move(encoded[i]);
                encoded[i] = Encoded{true, {}, 0, {}};
                ++written;
            }
            cv.notify_all();
            if (!e.error.empty()) throw DataError(e.error);
            const int v = int(i % size_t(o.val_every) == size_t(o.val_every) - 1);
            out[v].append(e.ids);
            ++file_count[v];
            byte_count[v] += e.bytes;
            token_count[v] += e.ids.size();
        }
        out[0].finish();
        out[1].finish();
        if (terminal) std::fprintf(stderr, "\n");
    };
    write_file_atomic((fs::path(o.out) / "train.bin").string(), [&](int train_fd, const std::string& train_tmp) {
        write_file_atomic((fs::path(o.out) / "val.bin").string(), [&](int val_fd, const std::string& val_tmp) {
            write_split(train_fd, train_tmp, val_fd, val_tmp);
        });
    });
    json meta = {{"writer", kWriter},
                 {"vocab", tok->vocab_size()},
                 {"tokenizer", tok->description()},
                 {"dtype", wide ? "uint32" : "uint16"},
                 {"format", wide ? "llm.c (header, uint32)" : "raw"},
                 {"files", {{"train", file_count[0]}, {"val", file_count[1]}}},
                 {"bytes", {{"train", byte_count[0]}, {"val", byte_count[1]}}},
                 {"tokens", {{"train", token_count[0]}, {"val", token_count[1]}}}};
    if (has_eot) meta["end_of_text"] = eot[0];
    for (const auto& [src, name] : copies)
        write_file_atomic((fs::path(o.out) / name).string(), src.empty() ? trained_json : read_text_file(src));
    write_file_atomic((fs::path(o.out) / "meta.json").string(), meta.dump(1) + "\n");
    const double s = std::max(now_s() - start, 1e-9);
    std::printf(
        "tokenize: %s: %zu training tokens from %zu files, %zu validation tokens from %zu files; vocabulary "
        "%u (%s); %.1f MB in %.2f s on %d threads\n",
        o.out.c_str(), token_count[0], file_count[0], token_count[1], file_count[1], tok->vocab_size(),
        tok->description().c_str(), double(byte_count[0] + byte_count[1]) / 1e6, s, threads);
    return kExitOk;
}

}  // namespace mirrored
