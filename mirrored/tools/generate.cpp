// `mirrored generate CHECKPOINT --prompt TEXT`: a language model's continuation of a prompt, token by
// token, printed as each comes. The model is the checkpoint's own (its embedded config); it runs on
// one CPU replica in f32. Each token is drawn from softmax(logits / temperature) over the top-k
// scores with a generator seeded by --seed, so the same command prints the same text.
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <sstream>
#include <thread>

#include "base/error.h"
#include "kernels/buffer.h"
#include "mirrored/checkpoint.h"
#include "mirrored/config.h"
#include "mirrored/model.h"
#include "mirrored/tools/tools.h"

namespace mirrored {

namespace {

// The checkpoint's model, as its embedded config describes it, and its parameters.
struct LoadedModel {
    Config config;
    std::unique_ptr<Model> model;
    std::vector<float> params;
};

LoadedModel load_model(const std::string& path) {
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
    m.model = std::make_unique<Model>(c.model.input_shape, c.model.layers, c.run.seed);
    if (!m.model->reads_token_ids() || m.model->output_positions() != m.model->input_features())
        throw ConfigError(path + ": generate needs a language model (an embedding first, a score per position last)");
    m.params = read_checkpoint(path, *m.model, model_config_hash(c), model_config_summary(c)).params;
    return m;
}

// Index of the next token: argmax at temperature 0, else a draw from the tempered softmax over the
// k best (all when k is 0).
int sample(std::vector<float> logits, const GenerateOptions& o, std::mt19937_64& rng) {
    const int n = int(logits.size());
    if (o.temperature == 0) return int(std::max_element(logits.begin(), logits.end()) - logits.begin());
    std::vector<int> order(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) order[size_t(i)] = i;
    const int k = o.top_k > 0 ? std::min(o.top_k, n) : n;
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      [&](int a, int b) { return logits[size_t(a)] > logits[size_t(b)]; });
    const double top = logits[size_t(order[0])];
    std::vector<double> w(static_cast<size_t>(k));
    double sum = 0;
    for (int i = 0; i < k; ++i)
        sum += w[size_t(i)] = std::exp((logits[size_t(order[size_t(i)])] - top) / o.temperature);
    const double u = double(rng() >> 11) * 0x1.0p-53 * sum;  // the same draw on every machine
    double acc = 0;
    for (int i = 0; i < k; ++i)
        if ((acc += w[size_t(i)]) > u) return order[size_t(i)];
    return order[size_t(k - 1)];
}

}  // namespace

int generate(const GenerateOptions& o) {
    if (!(o.temperature >= 0)) throw ConfigError("--temperature: expected 0 (greedy) or more");
    LoadedModel m = load_model(o.checkpoint);
    const Model& model = *m.model;
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
    const bool bytes = vocab <= 256;
    if (!o.prompt_ids_given && !bytes)
        throw ConfigError(std::string(o.prompt.empty() ? "generate" : "--prompt") + ": the model's vocabulary has " +
                          std::to_string(vocab) +
                          " tokens, not bytes: text needs the tokenizer it was trained with; give the prompt's ids "
                          "with --prompt-ids (scripts/prepare_text.py --encode makes them)");
    for (unsigned char ch : !tokens.empty() ? std::string() : o.prompt.empty() ? std::string("\n") : o.prompt) {
        if (ch >= vocab)
            throw ConfigError("--prompt: byte " + std::to_string(int(ch)) + " is outside the model's vocabulary of " +
                              std::to_string(vocab) + " (generate reads prompts as byte-level tokens)");
        tokens.push_back(ch);
    }
    cpu_set_blas_threads(int(std::max(1u, std::thread::hardware_concurrency())));
    auto dev = make_cpu_device(0);
    Device& d = *dev;
    DeviceBuffer<float> params(d, model.flat_size()), ids(d, size_t(t));
    d.copy_to_device(d.compute_stream(), params.data(), m.params.data(), m.params.size() * sizeof(float));
    Activations acts = model.make_activations(d, 1);
    std::mt19937_64 rng(o.seed);
    std::vector<float> window(static_cast<size_t>(t), 0.0f), logits(static_cast<size_t>(vocab));
    if (o.echo && !o.prompt_ids_given) std::fwrite(o.prompt.data(), 1, o.prompt.size(), stdout);
    if (o.echo && o.prompt_ids_given && !bytes)  // ids in, ids out: the prompt's first, as given
        for (size_t i = 0; i < tokens.size(); ++i) std::printf("%d ", tokens[i]);
    for (int n = 0; n < o.tokens; ++n) {
        // the last t tokens from position 0; later positions hold zeros that causal attention
        // keeps from the positions before them
        const int len = std::min<int>(int(tokens.size()), t);
        std::fill(window.begin(), window.end(), 0.0f);
        for (int i = 0; i < len; ++i) window[size_t(i)] = float(tokens[tokens.size() - size_t(len) + size_t(i)]);
        d.copy_to_device(d.compute_stream(), ids.data(), window.data(), window.size() * sizeof(float));
        Pass p;
        p.dev = &d;
        p.stream = d.compute_stream();
        p.rows = p.global_rows = 1;
        p.training = false;
        p.params = params.data();
        p.weights = params.data();
        p.acts = &acts;
        const void* out = model.forward(p, ids.data());
        d.copy_to_host(d.compute_stream(), logits.data(), static_cast<const float*>(out) + size_t(len - 1) * scores,
                       logits.size() * sizeof(float));
        const int next = sample(logits, o, rng);
        tokens.push_back(next);
        if (bytes) std::fputc(next, stdout);
        else std::printf("%s%d", n ? " " : "", next);
        if (std::fflush(stdout) != 0) break;  // said below
    }
    std::fputc('\n', stdout);
    // a full disk or a closed pipe: the text is lost, and the exit status says so
    if (std::fflush(stdout) != 0 || std::ferror(stdout))
        throw CheckpointError(std::string("generate: standard output: write failed: ") + std::strerror(errno));
    return kExitOk;
}

}  // namespace mirrored
