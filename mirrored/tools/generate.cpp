// `mirrored generate CHECKPOINT --prompt TEXT`: a language model's continuation of a prompt, token by
// token, printed as each comes. The model is the checkpoint's own (its embedded config), or a
// Hugging Face folder's (config.json, its weights and tokenizer.json: mirrored/hf_models.h); it runs on
// one CPU replica in f32. Each token is drawn from softmax(logits / temperature) over the top-k
// scores with a generator seeded by --seed, so the same command prints the same text.
//
// With the key/value cache (the default) the model is built a second time for sequences of one
// position, sharing the parameters, and each new token is one pass of it (Pass::decode): every
// attention keeps the keys and values of the positions so far. The prompt is read position by
// position the same way. Within the context both ways compute the same logits (the window way
// recomputes the whole window per token: --no-kv-cache); past it the window slides by a token per
// token, while the cache restarts from the last half context (read again), so the texts may part.
//
// --prompts FILE continues many prompts, --batch of them at a time: one pass takes a position of
// every sequence, so each layer's product is one matrix product instead of a matrix-vector product
// per prompt. The sequences go in step (at pass s each reads its token s: its prompt's while it
// lasts, then its own draws), each drawing from its own generator seeded by --seed, so a prompt
// continues as `--prompt` alone continues it. Each continuation is a JSON line, in the file's order.
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "base/error.h"
#include "data/tokenizer.h"
#include "kernels/buffer.h"
#include "mirrored/adaptation.h"
#include "mirrored/checkpoint.h"
#include "mirrored/config.h"
#include "mirrored/hf_models.h"
#include "mirrored/layers/layer.h"
#include "mirrored/model.h"
#include "mirrored/tools/tools.h"
#include "mirrored/util.h"

namespace mirrored {

namespace {

// The checkpoint's model, as its embedded config describes it, and its parameters.
struct LoadedModel {
    Config config;
    std::unique_ptr<Model> model;
    std::vector<float> params;
};

// A Hugging Face model folder (model.init_from's kind), built for `context` positions (0: its
// own longest, at most 2048).
LoadedModel load_hf_model(const std::string& dir, int context) {
    const HfModelConfig hf = hf_model_config(dir);
    if (context == 0) context = std::min(hf.max_positions, 2048);
    std::string quoted;  // YAML's single-quoted scalar: a quote doubled
    for (char ch : std::filesystem::absolute(dir).string())
        quoted += ch == '\'' ? std::string("''") : std::string(1, ch);
    LoadedModel m;
    m.config = load_config_text("model: {init_from: '" + quoted + "', input_shape: [" + std::to_string(context) + "]}",
                                dir + "/config.json", {});
    const Config& c = m.config;
    m.model = build_model(c);
    m.params.assign(m.model->flat_size(), 0.0f);
    read_hf_weights(c.model.init_from, *m.model, m.params.data());
    return m;
}

LoadedModel load_model(const std::string& path, int context) {
    std::error_code ec;
    if (std::filesystem::is_directory(path, ec)) {
        if (!std::filesystem::exists(path + "/config.json", ec))
            throw CheckpointError(path +
                                  ": expected a regular file (a checkpoint), or a Hugging Face model folder "
                                  "(config.json, model.safetensors)");
        return load_hf_model(path, context);
    }
    if (context) throw ConfigError("--context: a checkpoint's model has its own (a Hugging Face folder takes one)");
    const auto meta = read_checkpoint_metadata(path);  // an unreadable file says why
    const auto it = meta.find("config");
    if (it == meta.end()) throw CheckpointError(path + ": no embedded config: not a mirrored checkpoint");
    LoadedModel m;
    try {
        m.config = load_config_text(it->second, path, {});
    } catch (const ConfigError& e) {
        throw CheckpointError(path + ": its embedded config does not load: " + e.what());
    }
    const Config& c = m.config;
    m.model = build_model(c);
    m.params = read_checkpoint(path, *m.model, model_config_hash(c), model_config_summary(c)).params;
    return m;
}

// Index of the next token: argmax at temperature 0, else a draw from the tempered softmax over the
// k best (all when k is 0), cut to the fewest most likely whose probabilities reach top_p (nucleus
// sampling). Over every token the draw takes them in index order: the same distribution, no sort.
int sample(const std::vector<float>& logits, const GenerateOptions& o, std::mt19937_64& rng) {
    const int n = int(logits.size());
    const int best = int(std::max_element(logits.begin(), logits.end()) - logits.begin());
    if (o.temperature == 0) return best;
    const double top = logits[size_t(best)];
    const auto weight = [&](int i) { return std::exp((logits[size_t(i)] - top) / o.temperature); };
    const auto draw = [&](double sum) { return double(rng() >> 11) * 0x1.0p-53 * sum; };  // the same on every machine
    int k = o.top_k > 0 ? std::min(o.top_k, n) : n;
    if (k == n && o.top_p >= 1) {
        std::vector<double> w(static_cast<size_t>(n));
        double sum = 0;
        for (int i = 0; i < n; ++i) sum += w[size_t(i)] = weight(i);
        const double u = draw(sum);
        double acc = 0;
        for (int i = 0; i < n; ++i)
            if ((acc += w[size_t(i)]) > u) return i;
        return best;  // rounding: u at the very end
    }
    std::vector<int> order(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) order[size_t(i)] = i;
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      [&](int a, int b) { return logits[size_t(a)] > logits[size_t(b)]; });
    std::vector<double> w(static_cast<size_t>(k));
    double sum = 0;
    for (int i = 0; i < k; ++i) sum += w[size_t(i)] = weight(order[size_t(i)]);
    if (o.top_p < 1) {  // the most likely first: keep them until their share reaches top_p
        double kept = 0;
        int i = 0;
        while (i < k && kept < o.top_p * sum) kept += w[size_t(i++)];
        k = std::max(i, 1);
        sum = kept > 0 ? kept : w[0];
    }
    const double u = draw(sum);
    double acc = 0;
    for (int i = 0; i < k; ++i)
        if ((acc += w[size_t(i)]) > u) return order[size_t(i)];
    return order[size_t(k - 1)];
}

// --prompts: one prompt per line, empty lines skipped; in a .jsonl file each line is a JSON string
// or an object with a "prompt" string (prompts with newlines or tabs).
struct Prompt {
    int line = 0;  // in the file, for messages
    std::string text;
};
std::vector<Prompt> read_prompts(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::error_code ec;
    if (!in || std::filesystem::is_directory(path, ec))
        throw ConfigError("--prompts " + path + ": cannot read it (expected a text file of prompts, one per line)");
    const bool json_lines = path.ends_with(".jsonl");
    std::vector<Prompt> prompts;
    int line_number = 0;
    for (std::string line; std::getline(in, line);) {
        ++line_number;
        if (!line.empty() && line.back() == '\r') line.pop_back();
        if (line_number == 1 && line.starts_with("\xEF\xBB\xBF")) line.erase(0, 3);  // a byte-order mark
        if (line.empty()) continue;
        if (!json_lines) {
            prompts.push_back({line_number, line});
            continue;
        }
        const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
        if (j.is_string()) prompts.push_back({line_number, j.get<std::string>()});
        else if (j.is_object() && j.contains("prompt") && j["prompt"].is_string())
            prompts.push_back({line_number, j["prompt"].get<std::string>()});
        else
            throw ConfigError(path + ":" + std::to_string(line_number) +
                              ": expected a JSON string or an object with a \"prompt\" string (a .jsonl file of "
                              "prompts)");
    }
    if (in.bad()) throw ConfigError("--prompts " + path + ": read failed: " + std::strerror(errno));
    if (prompts.empty()) throw ConfigError("--prompts " + path + ": no prompts (expected one per line)");
    return prompts;
}

// What a prompt reads as: the tokenizer's ids (after <s> where the model starts texts so), or bytes.
struct PromptReader {
    const Tokenizer* tok = nullptr;
    int vocab = 0;
    std::vector<int> ids(const std::string& text, const std::string& key) const {
        std::vector<int> tokens;
        const std::string& prompt = text.empty() ? std::string("\n") : text;
        if (tok) {
            std::vector<uint32_t> ids = tok->encode(prompt);
            if (tok->begin_of_text()) ids.insert(ids.begin(), *tok->begin_of_text());
            for (uint32_t id : ids) {
                if (id >= uint32_t(vocab))
                    throw ConfigError(key + ": its token " + std::to_string(id) +
                                      " is outside the model's vocabulary of " + std::to_string(vocab) +
                                      " (another tokenizer than the run's?)");
                tokens.push_back(int(id));
            }
            return tokens;
        }
        for (unsigned char ch : prompt) {
            if (ch >= vocab)
                throw ConfigError(key + ": byte " + std::to_string(int(ch)) + " is outside the model's vocabulary of " +
                                  std::to_string(vocab) + " (generate reads prompts as byte-level tokens)");
            tokens.push_back(ch);
        }
        return tokens;
    }
    // The continuation's text: decoded with its prompt (SentencePiece writes a piece's space by what
    // comes before it), the prompt's text cut off; an id the tokenizer lacks as [id].
    std::string text(const std::vector<int>& prompt, const std::vector<int>& drawn) const {
        std::string s;
        if (!tok) {
            for (int id : drawn) s += char(id);
            return s;
        }
        const std::vector<uint32_t> before(prompt.begin(), prompt.end());
        std::vector<uint32_t> all = before;
        all.insert(all.end(), drawn.begin(), drawn.end());
        try {
            const std::string head = tok->decode(before), whole = tok->decode(all);
            if (whole.starts_with(head)) return whole.substr(head.size());
        } catch (const DataError&) {}
        std::vector<uint32_t> known;  // id by id: the known ids' text, [id] for an id without bytes
        for (int id : drawn) {
            try {
                (void)tok->decode(std::vector<uint32_t>{uint32_t(id)});
                known.push_back(uint32_t(id));
            } catch (const DataError&) {
                s += tok->decode(known) + "[" + std::to_string(id) + "]";
                known.clear();
            }
        }
        return s + tok->decode(known);
    }
};

// A forward pass of `rows` sequences on one CPU replica in f32.
Pass inference_pass(Device& d, const float* params, Activations& acts, int rows) {
    Pass p;
    p.dev = &d;
    p.stream = d.compute_stream();
    p.rows = p.global_rows = rows;
    p.training = false;
    p.params = params;
    p.weights = params;
    p.acts = &acts;
    return p;
}

// One CPU replica on every hardware thread, holding the model's parameters.
struct CpuDecoder {
    explicit CpuDecoder(const LoadedModel& m) : device(make_cpu_device(0)), params(*device, m.model->flat_size()) {
        cpu_set_blas_threads(int(std::max(1u, std::thread::hardware_concurrency())));
        device->copy_to_device(device->compute_stream(), params.data(), m.params.data(),
                               m.params.size() * sizeof(float));
    }
    std::unique_ptr<Device> device;
    DeviceBuffer<float> params;
};

// The model built for one position per pass (the key/value cache's): its parameters are laid out
// as the checkpoint's.
std::unique_ptr<Model> one_position_model(const LoadedModel& m) {
    std::unique_ptr<Model> one = build_model(m.config, {1});
    if (one->flat_size() != m.model->flat_size())
        throw std::logic_error("generate: the one-position model's parameters differ from the checkpoint's");
    return one;
}

// --prompts: every prompt's continuation, o.batch sequences decoded together (see the top).
int generate_batch(const GenerateOptions& o, const LoadedModel& m, const PromptReader& reader,
                   std::optional<int> end_of_text) {
    if (!o.kv_cache)
        throw ConfigError("--prompts: decodes with the key/value cache (--no-kv-cache takes one --prompt)");
    const std::vector<Prompt> prompts = read_prompts(o.prompts);
    struct Sequence {
        std::vector<int> tokens;  // the prompt's (its last context's worth), then the draws
        size_t prompt = 0, fed = 0;
        int drawn = 0;
        bool done = false, stopped = false;
        std::mt19937_64 rng;
    };
    std::vector<Sequence> seqs(prompts.size());
    const int t = m.model->input_features(), scores = m.model->output_classes();
    for (size_t i = 0; i < prompts.size(); ++i) {
        Sequence& q = seqs[i];
        q.tokens = reader.ids(prompts[i].text, o.prompts + ":" + std::to_string(prompts[i].line));
        if (q.tokens.size() > size_t(t)) q.tokens.erase(q.tokens.begin(), q.tokens.end() - t);
        q.prompt = q.tokens.size();
        q.rng.seed(o.seed);
    }
    const int batch = int(std::min<size_t>(size_t(o.batch), prompts.size()));
    const CpuDecoder decoder(m);
    Device& d = *decoder.device;
    const float* params = decoder.params.data();
    const std::unique_ptr<Model> one = one_position_model(m);
    Activations acts = one->make_activations(d, batch);
    DeviceBuffer<float> ids(d, size_t(batch));
    std::vector<float> host_ids(static_cast<size_t>(batch)), logits(size_t(batch) * size_t(scores));
    std::vector<float> row(static_cast<size_t>(reader.vocab));

    long total = 0;
    const double start = now_s();
    for (size_t first = 0; first < seqs.size(); first += size_t(batch)) {
        const int rows = int(std::min<size_t>(size_t(batch), seqs.size() - first));
        Sequence* group = &seqs[first];
        DecodeState cache(d, t, rows);
        // one pass: sequence r reads token_of(r) at cache.position (a finished one reads 0, unused)
        const auto forward = [&](const auto& token_of) {
            for (int r = 0; r < rows; ++r) host_ids[size_t(r)] = group[r].done ? 0.0f : float(token_of(group[r]));
            d.copy_to_device(d.compute_stream(), ids.data(), host_ids.data(), size_t(rows) * sizeof(float));
            Pass p = inference_pass(d, params, acts, rows);
            p.decode = &cache;
            d.copy_to_host(d.compute_stream(), logits.data(), one->forward(p, ids.data()),
                           size_t(rows) * size_t(scores) * sizeof(float));
            ++cache.position;
        };
        for (bool going = true; going;) {
            if (cache.position < t) {
                forward([](Sequence& q) { return q.tokens[q.fed++]; });
            } else {  // full: each sequence's last half context again, from position 0 (every prompt has
                      // been read: a prompt is at most a context long)
                const size_t keep = size_t(std::max(t / 2, 1));
                cache.position = 0;
                for (size_t k = 0; k < keep; ++k)
                    forward([&](const Sequence& q) { return q.tokens[q.tokens.size() - keep + k]; });
                for (int r = 0; r < rows; ++r) group[r].fed = group[r].tokens.size();
            }
            for (int r = 0; r < rows; ++r) {
                Sequence& q = group[r];
                if (q.done || q.fed < q.tokens.size()) continue;  // finished, or still reading its prompt
                std::copy_n(logits.begin() + long(r) * scores, row.size(), row.begin());
                const int next = sample(row, o, q.rng);
                if (o.stop_at_end && end_of_text == next) {
                    q.done = q.stopped = true;
                    continue;
                }
                q.tokens.push_back(next);
                ++total;
                q.done = ++q.drawn == o.tokens;
            }
            going = std::any_of(group, group + rows, [](const Sequence& q) { return !q.done; });
        }
        for (int r = 0; r < rows; ++r) {  // printed as each batch ends
            const Sequence& q = group[r];
            const std::vector<int> prompt(q.tokens.begin(), q.tokens.begin() + long(q.prompt)),
                drawn(q.tokens.begin() + long(q.prompt), q.tokens.end());
            const nlohmann::ordered_json line = {{"prompt", prompts[first + size_t(r)].text},
                                                 {"text", reader.text(prompt, drawn)},
                                                 {"ids", drawn},
                                                 {"stopped_at_end_of_text", q.stopped}};
            const std::string s = line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
            std::fwrite(s.data(), 1, s.size(), stdout);
        }
        if (std::fflush(stdout) != 0) break;  // said below
    }
    const double seconds = now_s() - start;
    if (std::fflush(stdout) != 0 || std::ferror(stdout))
        throw CheckpointError(std::string("generate: standard output: write failed: ") + std::strerror(errno));
    if (!o.json.path.empty()) {
        const nlohmann::json j = {{"prompts", prompts.size()},
                                  {"batch", batch},
                                  {"tokens", total},
                                  {"seconds", seconds},
                                  {"tokens_per_sec", seconds > 0 ? double(total) / seconds : 0.0},
                                  {"kv_cache", true}};
        write_output(o.json, j.dump(2) + "\n");
        std::fprintf(stderr, "wrote %s\n", o.json.path.c_str());
    }
    return kExitOk;
}

}  // namespace

int generate(const GenerateOptions& o) {
    if (!(o.temperature >= 0)) throw ConfigError("--temperature: expected 0 (greedy) or more");
    LoadedModel m = load_model(o.checkpoint, o.context);
    const Model& model = *m.model;
    if (!model.reads_token_ids() || model.output_positions() != model.input_features())
        throw ConfigError(o.checkpoint +
                          ": generate needs a language model (an embedding first, a score per position last)");
    const int t = model.input_features(), scores = model.output_classes();
    // an id needs its embedding row and its score: the smaller table bounds the prompt and the draws
    // (an untied head larger than the embedding scores ids the model could not read back)
    const int vocab = std::min(scores, std::max(model.token_vocab(), 1));
    std::vector<int> tokens;
    if (o.prompt_ids_given) {
        std::istringstream in(o.prompt_ids);
        for (std::string word; in >> word;) {
            char* end = nullptr;
            errno = 0;
            const long id = std::strtol(word.c_str(), &end, 10);
            if (*end || errno || id < 0 || id >= vocab)
                throw ConfigError("--prompt-ids: '" + word + "' is not a token id of the model's vocabulary [0, " +
                                  std::to_string(vocab) + ")");
            tokens.push_back(int(id));
        }
        if (tokens.empty()) throw ConfigError("--prompt-ids: no ids (expected ids separated by spaces)");
    }
    // text in and out through the run's tokenizer (--tokenizer), else as bytes where the vocabulary is
    // (a Hugging Face folder's own tokenizer.json where it has one, or that of the folder the run
    // started from: model.init_from)
    const std::string hf_folder = std::filesystem::is_directory(o.checkpoint) ? o.checkpoint : m.config.model.init_from;
    std::string tokenizer = o.tokenizer;
    std::error_code ec;
    for (const char* f : {"tokenizer.model", "tokenizer.json", "vocab.json"})
        if (tokenizer.empty() && !hf_folder.empty() && std::filesystem::is_regular_file(hf_folder + "/" + f, ec))
            tokenizer = hf_folder;
    // else the one the run kept beside its checkpoints (<run>/tokenizer, from its token files' folder)
    const std::filesystem::path kept =
        std::filesystem::absolute(o.checkpoint).parent_path().parent_path() / "tokenizer";
    if (tokenizer.empty() && hf_folder.empty() && std::filesystem::is_directory(kept, ec)) tokenizer = kept.string();
    const std::unique_ptr<Tokenizer> tok = tokenizer.empty() ? nullptr : load_tokenizer(tokenizer);
    // where the text ends: the tokenizer's end-of-text token, or config.json's eos_token_id
    std::optional<int> end_of_text;
    if (tok && tok->end_of_text()) end_of_text = int(*tok->end_of_text());
    else if (!hf_folder.empty() && std::filesystem::is_regular_file(hf_folder + "/config.json", ec))
        end_of_text = hf_end_of_text(hf_folder);
    const bool bytes = vocab <= 256 && !tok, text = bytes || tok;
    if (!o.prompt_ids_given && !text)
        throw ConfigError(std::string(!o.prompts.empty() ? "--prompts"
                                      : o.prompt.empty() ? "generate"
                                                         : "--prompt") +
                          ": the model's vocabulary has " + std::to_string(vocab) +
                          " tokens, not bytes: text needs the tokenizer it was trained with (--tokenizer, e.g. the "
                          "token files' folder that mirrored tokenize wrote)" +
                          std::string(o.prompts.empty() ? ", or the prompt's ids (--prompt-ids)" : ""));
    const PromptReader reader{tok.get(), vocab};
    if (!o.prompts.empty()) return generate_batch(o, m, reader, end_of_text);
    if (tokens.empty()) tokens = reader.ids(o.prompt, "--prompt");
    const CpuDecoder decoder(m);
    Device& d = *decoder.device;
    const float* params = decoder.params.data();
    const auto pass = [&](Activations& acts) { return inference_pass(d, params, acts, 1); };
    std::vector<float> logits(static_cast<size_t>(vocab));
    const auto read_logits = [&](const void* out, int position) {
        d.copy_to_host(d.compute_stream(), logits.data(), static_cast<const float*>(out) + size_t(position) * scores,
                       logits.size() * sizeof(float));
    };

    // the window way: the last t tokens from position 0, the whole window each time; later
    // positions hold zeros that causal attention keeps from the positions before them
    std::unique_ptr<Activations> acts;
    std::unique_ptr<DeviceBuffer<float>> ids;
    std::vector<float> window(static_cast<size_t>(t), 0.0f);
    const auto window_logits = [&] {
        const int len = std::min<int>(int(tokens.size()), t);
        std::fill(window.begin(), window.end(), 0.0f);
        for (int i = 0; i < len; ++i) window[size_t(i)] = float(tokens[tokens.size() - size_t(len) + size_t(i)]);
        d.copy_to_device(d.compute_stream(), ids->data(), window.data(), window.size() * sizeof(float));
        Pass p = pass(*acts);
        read_logits(model.forward(p, ids->data()), len - 1);
    };

    // the cached way: one position per pass of the model built for sequences of one
    std::unique_ptr<Model> one;
    std::unique_ptr<DecodeState> cache;
    DeviceBuffer<float> id(d, 1);
    if (o.kv_cache) {
        one = one_position_model(m);
        acts = std::make_unique<Activations>(one->make_activations(d, 1));
        cache = std::make_unique<DecodeState>(d, t);
    } else {  // only the way taken gets its buffers
        acts = std::make_unique<Activations>(model.make_activations(d, 1));
        ids = std::make_unique<DeviceBuffer<float>>(d, size_t(t));
    }
    const auto decode_one = [&](int token) {  // at cache->position, then one further
        const float f = float(token);
        d.copy_to_device(d.compute_stream(), id.data(), &f, sizeof f);
        Pass p = pass(*acts);
        p.decode = cache.get();
        read_logits(one->forward(p, id.data()), 0);
        ++cache->position;
    };
    // the cache filled with the last `keep` tokens, from position 0 (its buffers kept)
    const auto refill = [&](int keep) {
        cache->position = 0;
        for (size_t i = tokens.size() - size_t(keep); i < tokens.size(); ++i) decode_one(tokens[i]);
    };

    std::mt19937_64 rng(o.seed);
    if (o.echo && !o.prompt_ids_given) std::fwrite(o.prompt.data(), 1, o.prompt.size(), stdout);
    if (o.echo && o.prompt_ids_given && tok) {  // ids in, text out: the prompt's text first
        const std::vector<uint32_t> ids(tokens.begin(), tokens.end());
        const std::string s = tok->decode(ids);  // ids the tokenizer lacks: the DataError says which
        std::fwrite(s.data(), 1, s.size(), stdout);
    }
    if (o.echo && o.prompt_ids_given && !text)  // ids in, ids out: the prompt's first, as given
        for (size_t i = 0; i < tokens.size(); ++i) std::printf("%d ", tokens[i]);
    const size_t prompt_tokens = tokens.size();
    const double start = now_s();
    if (o.kv_cache) refill(std::min<int>(int(tokens.size()), t));
    // what the tokenizer has decoded (the prompt's ids, then each new one) and how much is printed
    std::vector<uint32_t> shown;
    size_t printed = 0;
    if (tok) {
        for (int id : tokens)
            if (uint32_t(id) < tok->vocab_size()) shown.push_back(uint32_t(id));
        try {
            printed = tok->decode(shown).size();
        } catch (const DataError&) {
            shown.clear();  // ids the tokenizer lacks: decode the continuation on its own
        }
    }
    int n = 0;
    bool stopped = false;
    for (; n < o.tokens; ++n) {
        if (!o.kv_cache) window_logits();
        const int next = sample(logits, o, rng);
        if (o.stop_at_end && end_of_text == next) {
            stopped = true;
            break;
        }
        tokens.push_back(next);
        if (bytes) {
            std::fputc(next, stdout);
        } else if (tok) {
            // the text decoded whole (prompt included: SentencePiece writes a piece's space by what
            // comes before it), printed from where it was printed to; a character still incomplete
            // (U+FFFD at the end) waits for its next token
            shown.push_back(uint32_t(next));
            std::string text;
            try {
                text = tok->decode(shown);
            } catch (const DataError&) {
                shown.pop_back();
                std::printf("[%d]", next);  // an id the model scores but the tokenizer lacks
            }
            const bool incomplete = text.size() >= 3 && text.compare(text.size() - 3, 3, "\xEF\xBF\xBD") == 0;
            if (!incomplete && text.size() > printed) {
                std::fwrite(text.data() + printed, 1, text.size() - printed, stdout);
                printed = text.size();
            }
        } else {
            std::printf("%s%d", n ? " " : "", next);
        }
        if (std::fflush(stdout) != 0) break;  // said below
        if (o.kv_cache && n + 1 < o.tokens) {
            if (cache->position == t) refill(std::max(t / 2, 1));  // full: the last half context again
            else decode_one(next);
        }
    }
    const double seconds = now_s() - start;
    if (tok && !shown.empty()) {  // what an incomplete character held back
        const std::string text = tok->decode(shown);
        if (text.size() > printed) std::fwrite(text.data() + printed, 1, text.size() - printed, stdout);
    }
    std::fputc('\n', stdout);
    // a full disk or a closed pipe: the text is lost, and the exit status says so
    if (std::fflush(stdout) != 0 || std::ferror(stdout))
        throw CheckpointError(std::string("generate: standard output: write failed: ") + std::strerror(errno));
    if (!o.json.path.empty()) {  // said on stderr: stdout is the text
        const nlohmann::json j = {
            {"tokens", n},
            {"seconds", seconds},
            {"tokens_per_sec", seconds > 0 ? n / seconds : 0.0},
            {"kv_cache", o.kv_cache},
            {"stopped_at_end_of_text", stopped},
            {"prompt_ids", std::vector<int>(tokens.begin(), tokens.begin() + long(prompt_tokens))},
            {"ids", std::vector<int>(tokens.begin() + long(prompt_tokens), tokens.end())}};
        write_output(o.json, j.dump(2) + "\n");
        std::fprintf(stderr, "wrote %s\n", o.json.path.c_str());
    }
    return kExitOk;
}

}  // namespace mirrored
