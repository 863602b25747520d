// Language models: the sequence ops against double-precision references (causal softmax and its
// backward by finite differences, embeddings, batched products) on every backend; the transformer
// layers' gradients by finite differences; the block equal to its list form; token files (nanoGPT
// and llm.c layouts, bad ones refused); a byte-level GPT trained from token files with N replicas
// equal to one, an exact resume, and step-for-step equality with an independent PyTorch model.
#include <doctest/doctest.h>
#include <sys/stat.h>

#include <array>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>

#include "base/error.h"
#include "data/datasets.h"
#include "data/loader.h"
#include "kernels/ops/attention.h"
#include "kernels/ops/embedding.h"
#include "kernels/ops/gemm.h"
#include "kernels/ops/losses.h"
#include "kernels/sim/sim.h"
#include "kernels/ops/flat.h"
#include "mirrored/adaptation.h"
#include "mirrored/checkpoint.h"
#include "mirrored/config.h"
#include "mirrored/model.h"
#include "mirrored/optimizer.h"
#include "mirrored/planner.h"
#include "mirrored/replica_set.h"
#include "mirrored/trainer.h"
#include "tests/cli.h"
#include "tests/helpers.h"
#include "tests/layers.h"
#include "tests/run_folder.h"

using namespace mirrored;
using namespace mirrored::test;
namespace fs = std::filesystem;

namespace {

// ---- the ops ---------------------------------------------------------------------------------

std::vector<double> softmax_ref(const std::vector<float>& s, int batches, int t, double scale) {
    std::vector<double> p(s.size(), 0.0);
    for (int64_t r = 0; r < int64_t(batches) * t; ++r) {
        const int keep = int(r % t) + 1;
        double mx = -1e300, sum = 0;
        for (int j = 0; j < keep; ++j) mx = std::max(mx, double(s[size_t(r * t + j)]));
        for (int j = 0; j < keep; ++j) sum += std::exp(scale * (s[size_t(r * t + j)] - mx));
        for (int j = 0; j < keep; ++j) p[size_t(r * t + j)] = std::exp(scale * (s[size_t(r * t + j)] - mx)) / sum;
    }
    return p;
}

// Causal attention in double with explicit probabilities: out from qkv, and with dout the
// gradient dqkv (the layouts of attention_forward/backward, grouped-query heads included).
struct AttentionRef {
    std::vector<double> out, dqkv;
};
AttentionRef attention_ref(const std::vector<float>& qkv, const std::vector<float>& dout, int samples, int t,
                           const AttentionHeads& a, double scale) {
    const int d = a.d;
    const size_t ow = a.out_width();
    AttentionRef r{std::vector<double>(size_t(samples) * t * ow, 0.0), std::vector<double>(qkv.size(), 0.0)};
    auto at = [&](int n, int i, size_t col) { return (size_t(n) * t + i) * a.qkv_width() + col; };
    auto o_at = [&](int n, int i, int h, int e) { return (size_t(n) * t + i) * ow + size_t(h * d + e); };
    for (int n = 0; n < samples; ++n)
        for (int h = 0; h < a.heads; ++h) {
            const size_t q0 = size_t(h) * d, k0 = size_t(a.heads + h / (a.heads / a.kv_heads)) * d,
                         v0 = k0 + size_t(a.kv_heads) * d;
            for (int i = 0; i < t; ++i) {
                std::vector<double> p(size_t(i) + 1);
                double mx = -1e300, sum = 0;
                for (int j = 0; j <= i; ++j) {
                    double s = 0;
                    for (int e = 0; e < d; ++e) s += double(qkv[at(n, i, q0 + e)]) * qkv[at(n, j, k0 + e)];
                    p[size_t(j)] = scale * s;
                    mx = std::max(mx, p[size_t(j)]);
                }
                for (double& v : p) sum += (v = std::exp(v - mx));
                for (double& v : p) v /= sum;
                // out_i = sum_j p_ij v_j; dp_ij = dout_i . v_j; ds = p (dp - sum_j p dp)
                std::vector<double> dp(p.size());
                double pdp = 0;
                for (int j = 0; j <= i; ++j) {
                    double g = 0;
                    for (int e = 0; e < d; ++e) {
                        r.out[o_at(n, i, h, e)] += p[size_t(j)] * qkv[at(n, j, v0 + e)];
                        g += double(dout[o_at(n, i, h, e)]) * qkv[at(n, j, v0 + e)];
                    }
                    dp[size_t(j)] = g;
                    pdp += p[size_t(j)] * g;
                }
                for (int j = 0; j <= i; ++j) {
                    const double ds = scale * p[size_t(j)] * (dp[size_t(j)] - pdp);
                    for (int e = 0; e < d; ++e) {
                        r.dqkv[at(n, i, q0 + e)] += ds * qkv[at(n, j, k0 + e)];
                        r.dqkv[at(n, j, k0 + e)] += ds * qkv[at(n, i, q0 + e)];
                        r.dqkv[at(n, j, v0 + e)] += p[size_t(j)] * dout[o_at(n, i, h, e)];
                    }
                }
            }
        }
    return r;
}

void check_sequence_ops(Device& d) {
    CAPTURE(d.name());
    Rng rng(base_seed() + 31);
    const Stream s = d.compute_stream();
    // causal softmax: against the double reference, in place as the attention layer calls it
    const int batches = 3, t = 7;
    const float scale = 0.37f;
    const std::vector<float> scores = rng.uniform(size_t(batches) * t * t, -4.0f, 4.0f);
    DeviceBuffer<float> p = upload(d, scores);
    causal_softmax(d, s, batches, t, scale, p.data(), p.data());
    const std::vector<float> probs = download(d, p);
    const std::vector<double> want = softmax_ref(scores, batches, t, scale);
    CHECK(rel_error(probs, want) < 1e-6);
    // backward: L = sum(w * probs) has dL/dscores = backward(probs, w), checked by central differences
    const std::vector<float> w = rng.uniform(scores.size(), -1.0f, 1.0f);
    DeviceBuffer<float> dw = upload(d, w);
    causal_softmax_backward(d, s, batches, t, scale, p.data(), dw.data(), dw.data());
    const std::vector<float> grad = download(d, dw);
    std::vector<double> fd(scores.size());
    for (size_t i = 0; i < scores.size(); ++i) {
        std::vector<float> up = scores, down = scores;
        const float eps = 1e-3f;
        up[i] += eps;
        down[i] -= eps;
        const auto pu = softmax_ref(up, batches, t, scale), pd = softmax_ref(down, batches, t, scale);
        double lu = 0, ld = 0;
        for (size_t j = 0; j < w.size(); ++j) lu += w[j] * pu[j], ld += w[j] * pd[j];
        fd[i] = (lu - ld) / (2.0 * eps);
    }
    CHECK(rel_error(grad, fd, 1e-4) < 1e-4);
    for (int64_t r = 0; r < int64_t(batches) * t; ++r)  // above the diagonal: nothing, both ways
        for (int j = int(r % t) + 1; j < t; ++j) {
            CHECK(probs[size_t(r * t + j)] == 0.0f);
            CHECK(grad[size_t(r * t + j)] == 0.0f);
        }

    // fused attention against the double reference, forward and backward, for head widths that
    // fill 1 to 4 elements of each lane (d = 4, 40, 100, 128), and grouped-query heads (3 query
    // heads per key/value head; one key/value head for all)
    for (const auto& [samples, len, heads, kv_heads, hd] : std::vector<std::array<int, 5>>{{2, 7, 3, 3, 4},
                                                                                           {3, 9, 2, 2, 40},
                                                                                           {1, 6, 2, 2, 100},
                                                                                           {1, 33, 1, 1, 128},
                                                                                           {2, 8, 6, 2, 8},
                                                                                           {1, 5, 4, 1, 36}}) {
        const AttentionHeads a{heads, kv_heads, hd};
        CAPTURE(hd);
        CAPTURE(kv_heads);
        const float sc = 1.0f / std::sqrt(float(hd));
        const std::vector<float> qkv = rng.uniform(size_t(samples) * len * a.qkv_width(), -1.5f, 1.5f);
        const std::vector<float> dout = rng.uniform(size_t(samples) * len * a.out_width(), -1.0f, 1.0f);
        const AttentionRef ref = attention_ref(qkv, dout, samples, len, a, sc);
        DeviceBuffer<float> dq = upload(d, qkv), dgo = upload(d, dout);
        DeviceBuffer<float> out = poisoned(d, size_t(samples) * len * a.out_width());
        DeviceBuffer<float> lse = poisoned(d, size_t(samples) * heads * len), delta(d, size_t(samples) * heads * len);
        DeviceBuffer<float> dqkv = poisoned(d, qkv.size());
        attention_forward(d, s, samples, len, a, sc, dq.data(), out.data(), lse.data());
        CHECK(rel_error(download(d, out), ref.out) < 1e-5);
        attention_backward(d, s, samples, len, a, sc, dq.data(), out.data(), dgo.data(), lse.data(), delta.data(),
                           dqkv.data());
        CHECK(rel_error(download(d, dqkv), ref.dqkv) < 1e-5);
        // decoding (generation's key/value cache): sample 0's last query alone over its rows
        DeviceBuffer<float> one = poisoned(d, a.out_width());
        attention_decode(d, s, len, a, sc, dq.data(), one.data());
        const size_t last = size_t(len - 1) * a.out_width();
        CHECK(rel_error(download(d, one), std::vector<double>(ref.out.begin() + long(last),
                                                              ref.out.begin() + long(last + a.out_width()))) < 1e-5);
    }

    // embeddings: rows of the table; an id out of range gives zeros; backward adds repeated ids
    const int vocab = 11, dim = 5, tokens = 9;
    const std::vector<float> ids = {3, 0, 10, 3, 7, 3, 11, -1, 0};
    const std::vector<float> table = rng.uniform(size_t(vocab) * dim, -1.0f, 1.0f);
    DeviceBuffer<float> did = upload(d, ids), dtab = upload(d, table), y = poisoned(d, size_t(tokens) * dim);
    embedding_forward(d, s, tokens, vocab, dim, did.data(), dtab.data(), y.data());
    const std::vector<float> got = download(d, y);
    for (int i = 0; i < tokens; ++i)
        for (int j = 0; j < dim; ++j) {
            const int id = int(ids[size_t(i)]);
            CHECK(got[size_t(i) * dim + j] == (id >= 0 && id < vocab ? table[size_t(id) * dim + j] : 0.0f));
        }
    const std::vector<float> dy = rng.uniform(size_t(tokens) * dim, -1.0f, 1.0f);
    std::vector<double> dref(table.size(), 0.5);
    DeviceBuffer<float> ddy = upload(d, dy), dtable = upload(d, std::vector<float>(table.size(), 0.5f));
    for (int i = 0; i < tokens; ++i) {
        const int id = int(ids[size_t(i)]);
        if (id >= 0 && id < vocab)
            for (int j = 0; j < dim; ++j) dref[size_t(id) * dim + j] += dy[size_t(i) * dim + j];
    }
    embedding_backward(d, s, tokens, vocab, dim, did.data(), ddy.data(), dtable.data());
    CHECK(rel_error(download(d, dtable), dref) < 1e-6);

    // batched products with operands inside wider rows (a head's columns of qkv), both layouts
    for (bool ta : {false, true})
        for (bool tb : {false, true}) {
            CAPTURE(ta);
            CAPTURE(tb);
            const int m = 4, n = 3, k = 5, nb = 3, lda = 9, ldb = 8, ldc = 6;
            const int64_t sa = 40, sb = 45, sc = 30;
            const std::vector<float> a = rng.uniform(size_t(sa) * nb, -1.0f, 1.0f);
            const std::vector<float> b = rng.uniform(size_t(sb) * nb, -1.0f, 1.0f);
            std::vector<float> c0 = rng.uniform(size_t(sc) * nb, -1.0f, 1.0f);
            std::vector<double> ref(c0.begin(), c0.end());
            for (int q = 0; q < nb; ++q)
                for (int i = 0; i < m; ++i)
                    for (int j = 0; j < n; ++j) {
                        double acc = 0;
                        for (int l = 0; l < k; ++l)
                            acc += double(a[size_t(q * sa + (ta ? l * lda + i : i * lda + l))]) *
                                   b[size_t(q * sb + (tb ? j * ldb + l : l * ldb + j))];
                        ref[size_t(q * sc + i * ldc + j)] = 0.5 * acc;
                    }
            DeviceBuffer<float> da = upload(d, a), db = upload(d, b), dc = upload(d, c0);
            gemm_batched(d, s, ta, tb, m, n, k, 0.5f, da.data(), lda, sa, db.data(), ldb, sb, 0.0f, dc.data(), ldc, sc,
                         nb);
            CHECK(rel_error(download(d, dc), ref) < 1e-5);
        }
}

// ---- the layers ------------------------------------------------------------------------------

LayerSpec layer(const std::string& type, const Fields& keys = {}, std::vector<LayerSpec> sub = {}) {
    return make_layer_spec(type, keys, std::move(sub));
}

std::vector<LayerSpec> gpt(int vocab, int dim, int t, int blocks, int heads, bool tie) {
    std::vector<LayerSpec> l = {layer("embedding", {{"vocab", std::to_string(vocab)}, {"dim", std::to_string(dim)}}),
                                layer("position_embedding", {{"max_len", std::to_string(t + 1)}})};
    for (int b = 0; b < blocks; ++b) l.push_back(layer("transformer_block", {{"heads", std::to_string(heads)}}));
    l.push_back(layer("layernorm"));
    l.push_back(tie ? layer("lm_head")
                    : layer("lm_head", {{"tie_weights", "false"}, {"units", std::to_string(vocab)}}));
    return l;
}

// A language model on one device: random ids in, random next tokens as labels.
struct TokenHarness {
    Device& d;
    const Model& m;
    int rows, t, vocab;
    DeviceBuffer<float> x, params, grads;
    DeviceBuffer<int32_t> y;
    DeviceBuffer<double> metrics;
    Activations acts;
    std::vector<int32_t> labels;

    TokenHarness(Device& dev, const Model& model, int r, uint64_t salt)
        : d(dev),
          m(model),
          rows(r),
          t(model.output_positions()),
          vocab(model.output_classes()),
          params(dev, model.flat_size()),
          grads(dev, model.flat_size()),
          metrics(dev, kMetricSlots),
          acts(model.make_activations(dev, r)) {
        Rng rng(salt);
        std::vector<float> ids(size_t(rows) * t);
        for (float& id : ids) id = float(rng.integer(0, vocab - 1));
        labels = rng.labels(rows * t, vocab);
        x = upload(d, ids);
        y = upload(d, labels);
        m.init_params(d, d.compute_stream(), params.data());
    }
    Pass pass() { return training_pass(d, rows, params.data(), grads.data(), acts, base_seed()); }
    std::vector<float> logits(const std::vector<float>& p_host) {
        d.copy_to_device(d.compute_stream(), params.data(), p_host.data(), p_host.size() * sizeof(float));
        Pass p = pass();
        const void* z = m.forward(p, x.data());
        std::vector<float> out(size_t(rows) * t * vocab);
        d.copy_to_host(d.compute_stream(), out.data(), z, out.size() * 4);
        d.synchronize();
        return out;
    }
    // the mean cross-entropy over every position, in double
    double loss(const std::vector<float>& p_host) {
        const std::vector<float> z = logits(p_host);
        double loss = 0;
        for (int i = 0; i < rows * t; ++i) {
            const float* r = &z[size_t(i) * vocab];
            double mx = r[0], sum = 0;
            for (int j = 1; j < vocab; ++j) mx = std::max(mx, double(r[j]));
            for (int j = 0; j < vocab; ++j) sum += std::exp(r[j] - mx);
            loss += std::log(sum) + mx - r[labels[size_t(i)]];
        }
        return loss / (rows * t);
    }
    std::vector<float> backprop(std::vector<int>* units = nullptr) {
        fill_floats(d, d.compute_stream(), 2 * kMetricSlots, 0.0f, reinterpret_cast<float*>(metrics.data()));
        Pass p = pass();
        const void* z = m.forward(p, x.data());
        void* dl = m.dlogits_buffer(acts);
        softmax_xent(d, d.compute_stream(), rows * t, vocab, z, y.data(), 1.0f / float(rows * t), nullptr, dl,
                     metrics.data());
        m.backward(p, dl, units ? [units](int unit) { units->push_back(unit); } : std::function<void(int)>());
        return download(d, grads);
    }
};

// Backprop against finite differences at a sample of every trainable tensor's entries. recompute,
// piece_floats and adaptation (LoRA, frozen tensors): Model's.
void check_gradients(Device& d, const std::vector<LayerSpec>& layers, int t, int rows, bool recompute = false,
                     size_t piece_floats = 0, const Adaptation& adaptation = {}) {
    const Model m({t}, layers, base_seed(), recompute, piece_floats, adaptation);
    TokenHarness h(d, m, rows, base_seed() + 7);
    Rng rng(base_seed() + 8);
    std::vector<float> p = download(d, h.params);
    for (const auto& info : m.tensors())  // no gamma exactly 1, no bias exactly 0
        for (size_t i = 0; i < info.count; ++i) p[info.offset + i] += 0.05f * rng.normal(1)[0];
    d.copy_to_device(d.compute_stream(), h.params.data(), p.data(), p.size() * 4);
    std::vector<int> units;
    const std::vector<float> g = h.backprop(&units);
    CHECK(reported_every_unit(m, units));  // an LM head tied to the embedding reports as a unit of its own
    int checked = 0, trainable = 0;
    for (const auto& info : m.tensors()) {
        CAPTURE(info.name);
        if (!info.trainable) continue;  // frozen: no gradient
        ++trainable;
        for (int s = 0; s < 6; ++s) {
            const size_t k = info.offset + size_t(rng.integer(0, int(info.count) - 1));
            // central differences at eps and eps / 2, extrapolated (Richardson): a layernorm over
            // small embeddings bends within a step of 1e-2, and smaller steps drown in float noise
            auto central = [&](float eps) {
                const float orig = p[k];
                p[k] = orig + eps;
                const double up = h.loss(p);
                p[k] = orig - eps;
                const double down = h.loss(p);
                p[k] = orig;
                return (up - down) / (2.0 * double(eps));
            };
            const double fd = (4.0 * central(2e-3f) - central(4e-3f)) / 3.0;
            CAPTURE(g[k]);
            CAPTURE(fd);
            CHECK(std::abs(g[k] - fd) <= 2e-4 + 2e-2 * std::abs(fd));
            ++checked;
        }
    }
    CHECK(checked == 6 * trainable);
    CHECK(trainable > 0);
}

}  // namespace

TEST_CASE("sequence ops against double references: causal softmax and its backward, embeddings, batched GEMMs") {
    check_sequence_ops(*make_cpu_device(0));
    SimScope sim(20);
    check_sequence_ops(*make_sim_device(0));
}

TEST_CASE("cuda: sequence ops against double references" * doctest::test_suite("cuda")) {
    SKIP_WITHOUT_CUDA();
    check_sequence_ops(*make_cuda_device(0));
}

TEST_CASE("gradients match finite differences: embedding, position embedding, attention, block, tied/untied head") {
    auto d = make_cpu_device(0);
    SUBCASE("tied head, two blocks") { check_gradients(*d, gpt(13, 8, 5, 2, 2, true), 5, 3); }
    SUBCASE("untied head, one head of the full width") { check_gradients(*d, gpt(9, 6, 4, 1, 1, false), 4, 2); }
    SUBCASE("shard: gradients' blocks of 8 rows: an untied head's and the MLP's first weight, recomputed") {
        const std::vector<LayerSpec> l = gpt(13, 8, 5, 1, 2, false);
        REQUIRE(Model({5}, l, 1, true, 16).gradient_units() == Model({5}, l, 1).gradient_units() + 1 + 3);
        check_gradients(*d, l, 5, 3, true, 16);
    }
    SUBCASE("the block as a list: residual layers of layernorm, attention and dense") {
        std::vector<LayerSpec> l = {
            layer("embedding", {{"vocab", "10"}, {"dim", "8"}}),
            layer("residual", {}, {layer("layernorm"), layer("attention", {{"heads", "4"}})}),
            layer("residual", {},
                  {layer("layernorm"), layer("dense", {{"units", "16"}, {"activation", "gelu"}}),
                   layer("dense", {{"units", "8"}})}),
            layer("lm_head")};
        check_gradients(*d, l, 6, 2);
    }
    SUBCASE("fused attention (the online softmax, probabilities recomputed in backward)") {
        const std::vector<LayerSpec> l = {
            layer("embedding", {{"vocab", "11"}, {"dim", "8"}}),
            layer("transformer_block", {{"heads", "2"}, {"fused_attention", "true"}, {"dropout", "0.2"}}),
            layer("attention", {{"heads", "4"}, {"fused", "true"}}), layer("lm_head")};
        check_gradients(*d, l, 5, 3);
    }
    SUBCASE("Llama: RMSNorm, grouped-query attention with RoPE, SwiGLU, untied head; fused and unfused") {
        const std::vector<LayerSpec> l = {
            layer("embedding", {{"vocab", "11"}, {"dim", "16"}}),
            layer("llama_block", {{"heads", "4"}, {"kv_heads", "2"}, {"intermediate_size", "24"}, {"rope_theta", "7"}}),
            layer("llama_block", {{"heads", "2"},
                                  {"kv_heads", "1"},
                                  {"intermediate_size", "8"},
                                  {"bias", "true"},
                                  {"fused_attention", "true"},
                                  {"rope_theta", "100"}}),
            layer("rmsnorm"), layer("lm_head", {{"tie_weights", "false"}, {"units", "11"}})};
        check_gradients(*d, l, 6, 3);
        check_gradients(*d, l, 6, 2, true);       // recomputed
        check_gradients(*d, l, 6, 2, false, 64);  // shard: gradients' blocks of rows
    }
    SUBCASE("LoRA with dropout on a Qwen2-style block (q, k, v biases, none on o) with Llama 3.1's rope_scaling") {
        ModelConfig mc;
        mc.layers = {layer("embedding", {{"vocab", "11"}, {"dim", "16"}}),
                     layer("llama_block", {{"heads", "4"},
                                           {"kv_heads", "2"},
                                           {"intermediate_size", "24"},
                                           {"rope_theta", "1000"},
                                           {"rope_scaling", "llama3"},
                                           {"rope_factor", "8"},
                                           {"rope_original_max_positions", "16"},
                                           {"bias", "true"},
                                           {"out_bias", "false"}}),
                     layer("rmsnorm"), layer("lm_head", {{"tie_weights", "false"}, {"units", "11"}})};
        CHECK(Model({6}, mc.layers, 1).find("layers.1.self_attn.o_proj.bias") == nullptr);
        check_gradients(*d, mc.layers, 6, 3);  // every tensor trained: the biases' gradients too
        mc.lora = {2, 4, 0.3, {"q_proj", "v_proj", "o_proj", "down_proj"}};
        const Adaptation a = make_adaptation(mc, {6}, 1);
        REQUIRE(a.lora_dropout == 0.3);
        check_gradients(*d, mc.layers, 6, 3, false, 0, a);
        check_gradients(*d, mc.layers, 6, 2, true, 0, a);  // recomputed: the same masks again
    }
    SUBCASE("the Llama block's parts as layers: attention with kv_heads, rope_theta, no bias; swiglu") {
        const std::vector<LayerSpec> l = {
            layer("embedding", {{"vocab", "9"}, {"dim", "12"}}),
            layer("attention", {{"heads", "3"}, {"kv_heads", "1"}, {"rope_theta", "10000"}, {"bias", "false"}}),
            layer("dense", {{"units", "10"}}), layer("swiglu"),
            layer("lm_head", {{"tie_weights", "false"}, {"units", "9"}})};
        check_gradients(*d, l, 5, 3);
    }
    SUBCASE("dropout on the probabilities and both branches (masks fixed per step), GPT-2's tanh GELU") {
        const std::vector<LayerSpec> l = {
            layer("embedding", {{"vocab", "11"}, {"dim", "8"}}),
            layer("transformer_block", {{"heads", "2"}, {"dropout", "0.3"}, {"activation", "gelu_tanh"}}),
            layer("attention", {{"heads", "4"}, {"dropout", "0.5"}}), layer("lm_head")};
        check_gradients(*d, l, 5, 3);
    }
}

TEST_CASE("shard: gradients - a GPT's staging slots do not grow with its depth: each sub-layer frees its buckets") {
    // Every tensor its own bucket. In use at most: the tied embedding's (the head writes it first,
    // the embedding last) and the attention's four (one unit), and one spare - 6 at any depth;
    // were a block's buckets freed only when the whole block is done, 14.
    for (int blocks : {1, 2, 4}) {
        CAPTURE(blocks);
        const Model m({8}, gpt(16, 16, 8, blocks, 2, true), 1);
        const GradientStaging g = plan_gradient_staging(m, make_buckets(m, 1e-6));
        CHECK(g.slots == 6);
        CHECK(m.gradient_units() == 4 + 5 * blocks);  // embeddings, blocks' five sub-layers, layernorm, head
    }
}

TEST_CASE("planner: a transformer block's buckets are ready as its sub-layers finish, not at the block's end") {
    const Model m({8}, gpt(16, 16, 8, 1, 2, true), 1);
    StrategyConfig sc;
    sc.bucket_mb = 1e-6;  // every tensor its own bucket
    const CommPlan c = comm_plan(m, sc);
    const std::vector<Bucket> b = make_buckets(m, sc.bucket_mb);
    REQUIRE(c.buckets.size() == b.size());
    std::set<double> in_block;
    for (size_t k = 0; k < b.size(); ++k) {
        CAPTURE(k);
        CHECK(c.buckets[k].ready > 0);
        CHECK(c.buckets[k].ready <= 1);
        if (k > 0) CHECK(c.buckets[k].ready >= c.buckets[k - 1].ready);  // reverse layer order: later in backward
        if (m.unit_layer(b[k].ready_after_unit) == 2) in_block.insert(c.buckets[k].ready);
    }
    CHECK(in_block.size() == 5);  // c_proj, c_fc, ln_2, the attention, ln_1: each when it is done
}

TEST_CASE("transformer_block equals its list form: residual(layernorm, attention), residual(layernorm, mlp)") {
    auto d = make_cpu_device(0);
    const int t = 6, vocab = 17;
    std::vector<LayerSpec> block = {layer("embedding", {{"vocab", "17"}, {"dim", "12"}}),
                                    layer("transformer_block", {{"heads", "3"}}), layer("lm_head")};
    std::vector<LayerSpec> list = {block[0],
                                   layer("residual", {}, {layer("layernorm"), layer("attention", {{"heads", "3"}})}),
                                   layer("residual", {},
                                         {layer("layernorm"), layer("dense", {{"units", "48"}, {"activation", "gelu"}}),
                                          layer("dense", {{"units", "12"}})}),
                                   block[2]};
    const Model a({t}, block, 5), b({t}, list, 5);
    REQUIRE(a.flat_size() == b.flat_size());
    CHECK(a.find("layers.1.attn.c_attn.weight") != nullptr);
    CHECK(a.find("layers.1.mlp.c_fc.weight") != nullptr);
    CHECK(b.find("layers.1.layers.1.c_attn.weight") != nullptr);
    TokenHarness ha(*d, a, 3, 11), hb(*d, b, 3, 11);
    const std::vector<float> pa = download(*d, ha.params), pb = download(*d, hb.params);
    CHECK(pa == pb);  // the same tensors in the same order draw the same initial values
    CHECK(ha.logits(pa) == hb.logits(pb));
    const std::vector<float> ga = ha.backprop(), gb = hb.backprop();
    for (size_t i = 0; i < a.tensors().size(); ++i) {
        const TensorInfo &x = a.tensors()[i], &y = b.tensors()[i];
        CAPTURE(x.name);
        CHECK(std::vector<float>(ga.begin() + long(x.offset), ga.begin() + long(x.offset + x.count)) ==
              std::vector<float>(gb.begin() + long(y.offset), gb.begin() + long(y.offset + y.count)));
    }
    CHECK(a.output_positions() == t);
    CHECK(a.output_classes() == vocab);
}

TEST_CASE("weight_decay_on: matrices decays weights and embeddings only, in pieces that add up to one update") {
    auto d = make_cpu_device(0);
    const Model m({5}, gpt(13, 8, 5, 2, 1, false), 3);
    const auto ranges = m.matrix_ranges();
    for (const TensorInfo& t : m.tensors()) {  // each tensor's entries inside a range exactly when it is a matrix
        CAPTURE(t.name);
        bool inside = false;
        for (const auto& [b, e] : ranges) inside |= t.offset >= b && t.offset + t.count <= e;
        CHECK(inside == (t.shape.size() >= 2));
    }
    for (const char* type : {"adamw", "sgd"}) {
        CAPTURE(type);
        OptimizerConfig c = make_optimizer_config(type);
        c.lr = 0.1;
        c.weight_decay = 0.5;
        const size_t n = m.trainable_size();
        const std::vector<float> p0 = Rng(4).uniform(n, -1.0f, 1.0f);
        // zero gradients: only the decay moves a parameter, by lr * wd * p
        auto step = [&](bool matrices, std::vector<size_t> cuts) {
            auto opt = make_optimizer(*d, c, n);
            if (matrices) opt->decay_only(ranges);
            DeviceBuffer<float> p = upload(*d, p0), g(*d, n);
            fill_floats(*d, d->compute_stream(), n, 0.0f, g.data());
            cuts.push_back(n);
            size_t at = 0;  // slices as replicas sharing one parameter copy update them
            for (size_t cut : cuts) {
                opt->apply_range(*d, d->compute_stream(), p.data(), g.data() + at, at, cut, 0, float(c.lr), nullptr,
                                 nullptr, false);
                at = cut;
            }
            return download(*d, p);
        };
        const std::vector<float> all = step(false, {}), some = step(true, {}), sliced = step(true, {7, n / 2, n - 3});
        CHECK(sliced == some);
        for (const TensorInfo& t : m.tensors()) {
            CAPTURE(t.name);
            const size_t k = t.offset + t.count / 2;
            CHECK(all[k] == doctest::Approx(p0[k] * 0.95f));
            CHECK(some[k] == (t.shape.size() >= 2 ? all[k] : p0[k]));
        }
    }
    CHECK_THROWS_AS(make_optimizer(*d, make_optimizer_config("adamw"), 10)->decay_only({{4, 8}, {6, 9}}), Error);
}

TEST_CASE("transformer config errors name the key") {
    auto build = [](std::vector<LayerSpec> l, std::vector<int> in) { return Model(std::move(in), std::move(l), 1); };
    CHECK_THROWS_WITH_AS(build({layer("embedding", {{"vocab", "10"}, {"dim", "8"}}),
                                layer("transformer_block", {{"heads", "3"}}), layer("lm_head")},
                               {4}),
                         doctest::Contains("does not divide the width 8"), ConfigError);
    CHECK_THROWS_WITH_AS(build({layer("embedding", {{"vocab", "10"}, {"dim", "8"}}),
                                layer("position_embedding", {{"max_len", "4"}}), layer("lm_head")},
                               {5}),
                         doctest::Contains("more than max_len 4"), ConfigError);
    CHECK_THROWS_WITH_AS(build({layer("dense", {{"units", "8"}}), layer("lm_head")}, {4}),
                         doctest::Contains("needs an embedding layer"), ConfigError);
    CHECK_THROWS_WITH_AS(build({layer("embedding", {{"vocab", "10"}, {"dim", "8"}}), layer("lm_head")}, {2, 2}),
                         doctest::Contains("embedding reads a vector of token ids"), ConfigError);
}

// ---- token files and training ----------------------------------------------------------------

namespace {

void write_bytes(const std::string& path, const std::string& bytes) { std::ofstream(path, std::ios::binary) << bytes; }

// ids as uint16 little-endian (nanoGPT's train.bin)
std::string u16(const std::vector<uint32_t>& ids) {
    std::string s;
    for (uint32_t id : ids) s += char(id & 0xff), s += char(id >> 8);
    return s;
}

std::string llmc(const std::vector<uint32_t>& ids, int version = 1) {
    std::string h(1024, '\0');
    const int32_t head[3] = {20240520, version, int32_t(ids.size())};
    std::memcpy(h.data(), head, sizeof head);
    if (version == 1) return h + u16(ids);
    for (uint32_t id : ids) h.append(reinterpret_cast<const char*>(&id), 4);
    return h;
}

// Text a small model can learn: lines of a tiny language with a little variation.
std::string corpus(int lines, uint64_t seed) {
    Rng rng(seed);
    const char* words[] = {"def", "return", "self", "value", "if", "else", "for", "in", "range", "print"};
    std::string s;
    for (int i = 0; i < lines; ++i) {
        s += std::string(words[rng.integer(0, 9)]) + " " + words[rng.integer(0, 9)] + "(x" +
             std::to_string(rng.integer(0, 9)) + "):\n";
    }
    return s;
}

std::vector<uint32_t> bytes_of(const std::string& text) { return std::vector<uint32_t>(text.begin(), text.end()); }

// Every window of a token data set, epoch e: features and labels, flat.
std::pair<std::vector<float>, std::vector<int32_t>> windows(const Dataset& d, int64_t epoch = 0) {
    const size_t t = d.feature_size();
    std::vector<float> x(d.count() * t);
    std::vector<int32_t> y(d.count() * t);
    for (size_t i = 0; i < d.count(); ++i) read_sample(d, i, epoch, x.data() + i * t, y.data() + i * t);
    return {x, y};
}

DataConfig tokens_config(const std::string& root, int context, const Fields& extra = {}) {
    Fields keys = {{"train", "train.bin"}, {"test", "val.bin"}, {"context", std::to_string(context)}};
    keys.insert(keys.end(), extra.begin(), extra.end());
    DataConfig c = make_data_config("tokens", keys);
    c.root = root;
    return c;
}

const char* kGpt = R"(run: {name: gpt, seed: 5}
strategy: {devices: "cpu:1", bucket_mb: 0.01}
data: {dataset: tokens, root: ROOT, train: train.bin, test: val.bin, context: 16, vocab: 128}
model:
  layers:
    - {type: embedding, vocab: 128, dim: 32}
    - {type: position_embedding, max_len: 16}
    - {type: transformer_block, heads: 4, dropout: 0.1}
    - {type: transformer_block, heads: 4}
    - {type: layernorm}
    - {type: lm_head}
optimizer: {type: adamw, lr: 0.01, weight_decay: 0.01, grad_clip_norm: 1.0, schedule: {type: cosine, warmup_steps: 3}}
train: {epochs: 0, steps: 8, global_batch_size: 12, log_every_steps: 2}
checkpoint: {every_steps: 4, keep: 3}
)";

// A Llama-style model of the same size: grouped-query attention with RoPE, SwiGLU, RMSNorm, no
// biases, an untied head.
const char* kLlama = R"(run: {name: llama, seed: 5}
strategy: {devices: "cpu:1", bucket_mb: 0.01}
data: {dataset: tokens, root: ROOT, train: train.bin, test: val.bin, context: 16, vocab: 128}
model:
  layers:
    - {type: embedding, vocab: 128, dim: 32}
    - {type: llama_block, heads: 4, kv_heads: 2, intermediate_size: 64}
    - {type: llama_block, heads: 4, kv_heads: 2, intermediate_size: 64, fused_attention: false}
    - {type: rmsnorm}
    - {type: lm_head, tie_weights: false, units: 128}
optimizer: {type: adamw, lr: 0.01, weight_decay: 0.01, grad_clip_norm: 1.0, schedule: {type: cosine, warmup_steps: 3}}
train: {epochs: 0, steps: 8, global_batch_size: 12, log_every_steps: 2}
checkpoint: {every_steps: 4, keep: 3}
)";

struct GptRun : TempDir {
    std::string root;
    std::string model = kGpt;  // the config train() writes
    GptRun() {
        root = *this / "data";
        fs::create_directories(root);
        write_bytes(root + "/train.bin", u16(bytes_of(corpus(400, 1))));
        write_bytes(root + "/val.bin", u16(bytes_of(corpus(60, 2))));
    }
    std::string config(std::string text = kGpt) const {
        text.replace(text.find("ROOT"), 4, root);
        return write("gpt.yaml", text);
    }
    int train(const std::string& out, std::vector<std::string> sets = {}) const {
        sets.push_back("run.output_dir=" + out);
        static std::FILE* quiet = std::fopen("/dev/null", "w");
        return run_training(load_config(config(model), sets), nullptr,
                            std::getenv("MIRRORED_TEST_VERBOSE") ? stdout : quiet);
    }
    // the newest checkpoint's trainable tensors, flat in name order
    static std::vector<float> params(const std::string& out) {
        const auto files = list_checkpoints(out + "/checkpoints");
        REQUIRE(!files.empty());
        const SafetensorsFile f = read_safetensors(files.front(), true);
        std::vector<float> v;
        for (const auto& [name, t] : f.tensors)
            if (name.rfind("optimizer.", 0) != 0) v.insert(v.end(), t.second.begin(), t.second.end());
        return v;
    }
};

// Stopped after step 5 (between checkpoints), then resumed: the same run as `one`, bit for bit.
void expect_stop_and_resume_exact(const GptRun& g, const std::string& one) {
    const std::string stopped = g / "stopped";
    ::setenv("MIRRORED_TEST_STOP_AFTER_STEP", "5", 1);
    CHECK(g.train(stopped) == kExitInterrupted);
    ::unsetenv("MIRRORED_TEST_STOP_AFTER_STEP");
    CHECK(g.train(stopped) == kExitOk);
    expect_same_run(one, stopped);
}

}  // namespace

TEST_CASE("token files: nanoGPT's raw uint16, llm.c's header; windows of context + 1; bad files refused") {
    TempDir dir;
    const std::string root = dir.path();
    const std::vector<uint32_t> ids = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
    write_bytes(root + "/train.bin", u16(ids));
    write_bytes(root + "/val.bin", llmc(ids));
    Datasets d = load_datasets(tokens_config(root, 4, {{"vocab", "12"}}), "", 1);
    CHECK(d.train.count() == 2);  // (11 - 1) / 4 windows
    CHECK(d.train.shape == std::vector<int>{4});
    CHECK(d.train.label_size == 4);
    CHECK((d.train.source && d.train.features.empty() && d.train.labels.empty()));   // mapped, not copied
    CHECK(windows(d.train).first == std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8});     // ids, not normalised
    CHECK(windows(d.train).second == std::vector<int32_t>{2, 3, 4, 5, 6, 7, 8, 9});  // each position's next token
    CHECK(windows(d.test) == windows(d.train));
    CHECK(fingerprint(d.test) == fingerprint(d.train));  // the same ids, header or not
    // version 2: uint32 ids; raw uint32 with dtype
    std::vector<uint32_t> big = ids;
    big[5] = 70000;
    write_bytes(root + "/val.bin", llmc(big, 2));
    write_bytes(root + "/train.bin", std::string(reinterpret_cast<const char*>(big.data()), big.size() * 4));
    d = load_datasets(tokens_config(root, 4, {{"vocab", "70001"}, {"dtype", "uint32"}}), "", 1);
    CHECK(windows(d.train).first[5] == 70000.0f);
    CHECK(windows(d.test) == windows(d.train));
    // a raw file whose first id looks like gzip's magic bytes (0x8b1f) is read as it is
    write_bytes(root + "/train.bin", u16({0x8b1f, 1, 2, 3, 4}));
    write_bytes(root + "/val.bin", u16(ids));
    d = load_datasets(tokens_config(root, 4, {{"vocab", "40000"}}), "", 1);
    CHECK(windows(d.train).first == std::vector<float>{0x8b1f, 1, 2, 3});

    auto refused = [&](const std::string& train, const std::string& what, const Fields& keys = {{"vocab", "12"}}) {
        write_bytes(root + "/train.bin", train);
        write_bytes(root + "/val.bin", u16(ids));
        CHECK_THROWS_WITH_AS(load_datasets(tokens_config(root, 4, keys), "", 1),
                             doctest::Contains((root + "/train.bin: " + what).c_str()), DataError);
    };
    std::vector<uint32_t> bad = ids;
    bad[6] = 12;
    refused(u16(bad), "token 12 at byte offset 12 is outside the vocabulary [0, 12)");
    refused(u16({1, 2, 3, 4}), "4 tokens, shorter than one window of data.context + 1 = 5");
    refused(llmc(ids).substr(0, 600), "an llm.c token file (magic 20240520) whose header is cut short");
    refused(llmc(ids).substr(0, 1024 + 7), "the header says 11 tokens");
    // a version llm.c does not write: not its header, so raw ids (the magic's halves, 55432 and 308)
    refused(llmc(ids, 3), "token 55432 at byte offset 0 is outside the vocabulary [0, 12)");
    refused(u16(ids) + "x", "23 bytes is not a whole number of 2-byte token ids");
    write_bytes(root + "/train.bin.gz", u16(ids));  // mapped files are read as they are: no gzip
    DataConfig gz = make_data_config("tokens", {{"train", "train.bin.gz"}, {"test", "val.bin"}, {"context", "4"}});
    gz.root = root;
    CHECK_THROWS_WITH_AS(load_datasets(gz, "", 1),
                         doctest::Contains("train.bin.gz: a gzip file; token files are read uncompressed"), DataError);
    // a raw file whose first two ids spell llm.c's magic (20240520 = 308 << 16 | 55432) is raw
    std::vector<uint32_t> magic_ids = {55432, 308, 1, 0, 5, 0, 7, 55432, 308, 2, 9, 11, 4000, 0, 0, 1, 2, 3};
    write_bytes(root + "/train.bin", u16(magic_ids));
    const Datasets raw = load_datasets(tokens_config(root, 4, {{"vocab", "65536"}}), "", 1);
    CHECK(raw.train.count() == (magic_ids.size() - 1) / 4);
    // a link that loops is said as what it is (exit 3), never an internal filesystem error
    std::filesystem::create_symlink("loop-b", root + "/loop-a");
    std::filesystem::create_symlink("loop-a", root + "/loop-b");
    DataConfig loop = make_data_config("tokens", {{"train", "loop-a"}, {"test", "val.bin"}, {"context", "4"}});
    loop.root = root;
    CHECK_THROWS_WITH_AS(load_datasets(loop, "", 1), doctest::Contains("loop-a: cannot be read: Too many levels"),
                         DataError);
}

// An embedding smaller than the data's vocabulary (beside an untied head that scores them all)
// would read no row for the ids past it: refused naming the key; generate neither takes nor draws
// an id the embedding lacks.
TEST_CASE("an embedding without rows for every id of data.vocab is refused; generate keeps to its rows") {
    GptRun g;
    std::string text = kGpt;
    const std::string tied = "    - {type: embedding, vocab: 128, dim: 32}", head = "    - {type: lm_head}";
    text.replace(text.find(tied), tied.size(), "    - {type: embedding, vocab: 121, dim: 32}");  // 'x' is 120
    text.replace(text.find(head), head.size(), "    - {type: lm_head, tie_weights: false, units: 128}");
    const std::string cfg = g.config(text);
    std::string err;
    CHECK(run_cli({"train", cfg, "--output", g / "small"}, {}, -1, &err) == kExitUsage);
    CHECK(err.find("model.layers.0.vocab: the embedding has rows for ids 0 to 120, but the data's ids go up to 127") !=
          std::string::npos);
    // the same model on data of 121 ids trains; its head still scores 128
    REQUIRE(run_cli({"train", cfg, "--output", g / "fits", "--set", "data.vocab=121"}, {}, -1, &err) == kExitOk);
    const std::string ckpt = list_checkpoints(g / "fits/checkpoints").front();
    CHECK(run_cli({"generate", ckpt, "--prompt-ids", "3 125"}, {}, -1, &err) == kExitUsage);
    CHECK(err.find("'125' is not a token id of the model's vocabulary [0, 121)") != std::string::npos);
    const std::string out = g / "generated.txt";
    REQUIRE(run_cli({"generate", ckpt, "--prompt", "def ", "--tokens", "200", "--temperature", "5", "--no-echo"}, {},
                    -1, &err, Stdout::file, out) == kExitOk);
    for (unsigned char ch : read_text(out)) CHECK(ch < 121);
    // a classifier on token windows (one score row per sample for a label per position), and a
    // normalisation of ids, are refused rather than trained into nothing
    const std::string classifier = g.write("cls.yaml", R"(run: {name: cls, seed: 1}
strategy: {devices: "cpu:1"}
data: {dataset: tokens, root: )" + g.root + R"(, train: train.bin, test: val.bin, context: 16, vocab: 128}
model: {layers: [{type: embedding, vocab: 128, dim: 8}, {type: flatten}, {type: dense, units: 128}]}
train: {epochs: 0, steps: 2, global_batch_size: 4}
)");
    CHECK(run_cli({"train", classifier, "--output", g / "cls"}, {}, -1, &err) == kExitUsage);
    CHECK(err.find("model.layers: the data has a label per position (16 per sample") != std::string::npos);
    CHECK(err.find("1 score row(s) per sample: a language model ends in lm_head") != std::string::npos);
    CHECK(run_cli({"train", g.config(), "--output", g / "norm", "--set", "data.normalize={mean: [0.5], std: [2]}"}, {},
                  -1, &err) == kExitUsage);
    CHECK(err.find("data.normalize: token ids are indexes, not values to normalise") != std::string::npos);
}

TEST_CASE("a byte-level GPT trains from token files; N replicas match one (cpu, sim); resume is exact") {
    GptRun g;
    const std::string one = g / "one";
    REQUIRE(g.train(one) == kExitOk);
    const auto m = metrics(one);
    const nlohmann::json s = summary(one);
    CHECK(s["status"] == "completed");
    CHECK(s["test_loss"].get<double>() < std::log(128.0));  // better than uniform over the vocabulary
    CHECK(s["test_bits_per_token"].get<double>() == doctest::Approx(s["test_loss"].get<double>() / std::log(2.0)));
    const std::vector<float> p1 = GptRun::params(one);
    // AdamW divides by the gradients' root mean square, so the replicas' other summation order
    // (rounding at 1e-7) moves a few parameters by up to ~1e-5 of the largest over 8 steps
    for (const std::string devices : {"cpu:2", "cpu:3"}) {
        CAPTURE(devices);
        const std::string out = g / ("n" + devices);
        REQUIRE(g.train(out, {"strategy.devices=" + devices}) == kExitOk);
        CHECK(rel_error(GptRun::params(out), p1) < 1e-4);
        CHECK(summary(out)["replica_checksums"].size() == std::stoul(devices.substr(4)));
        CHECK(summary(out)["train_loss"].get<double>() ==
              doctest::Approx(summary(one)["train_loss"].get<double>()).epsilon(1e-5));
    }
    {
        SimScope sim(30);
        const std::string out = g / "sim";
        REQUIRE(g.train(out, {"strategy.devices=sim:0,0"}) == kExitOk);
        CHECK(rel_error(GptRun::params(out), p1) < 1e-4);
    }
    // strategy.shard: gradients, the head tied to the embedding: the embedding's bucket is written
    // first (the head) and last (the embedding), so it keeps its slot through backward. The
    // clipping norm is summed chunk by chunk as with the optimizer state sharded alone: the same bits
    {
        const std::string zero1 = g / "zero1", zero2 = g / "zero2";
        REQUIRE(g.train(zero1, {"strategy.devices=cpu:3", "strategy.bucket_mb=0.02", "strategy.shard=optimizer"}) ==
                kExitOk);
        REQUIRE(g.train(zero2, {"strategy.devices=cpu:3", "strategy.bucket_mb=0.02", "strategy.shard=gradients"}) ==
                kExitOk);
        CHECK(summary(zero2)["shard"] == "gradients");
        CHECK(GptRun::params(zero2) == GptRun::params(zero1));
        CHECK(rel_error(GptRun::params(zero2), p1) < 1e-4);
    }
    // bf16 (rounded on the CPU as a GPU stores it) and accumulation train too
    const std::string bf = g / "bf16";
    REQUIRE(g.train(bf, {"train.precision=bf16", "train.grad_accumulation_steps=2"}) == kExitOk);
    CHECK(summary(bf)["test_loss"].get<double>() < std::log(128.0));
    // stop after step 5 (between checkpoints), resume: the same run bit for bit
    expect_stop_and_resume_exact(g, one);
}

TEST_CASE("a language model evaluates every N steps, in bits per byte where meta.json says; tokens/s") {
    GptRun g;
    const size_t val_tokens = fs::file_size(g.root + "/val.bin") / 2;
    g.write("data/meta.json", R"({"bytes": {"val": )" + std::to_string(3 * val_tokens) + R"(}, "tokens": {"val": )" +
                                  std::to_string(val_tokens) + "}}");
    const std::string out = g / "run";
    REQUIRE(g.train(out, {"train.eval_every_steps=3"}) == kExitOk);
    std::vector<int64_t> evals;
    std::ifstream log(out + "/metrics.jsonl");
    for (std::string line; std::getline(log, line);)
        if (const nlohmann::json j = nlohmann::json::parse(line); j["type"] == "eval") {
            evals.push_back(j["step"].get<int64_t>());
            CHECK(j["test_bits_per_byte"].get<double>() ==
                  doctest::Approx(j["test_bits_per_token"].get<double>() / 3.0));
        } else if (j["type"] == "train") {
            CHECK(j["tokens_per_sec"].get<double>() == doctest::Approx(16.0 * j["samples_per_sec"].get<double>()));
        }
    CHECK(evals == std::vector<int64_t>{3, 6, 8});  // every 3 steps, and at the end
    const nlohmann::json s = summary(out);
    CHECK(s["test_bits_per_byte"].get<double>() == doctest::Approx(s["test_bits_per_token"].get<double>() / 3.0));
    CHECK(s["tokens_per_sec"].get<double>() == doctest::Approx(16.0 * s["samples_per_sec"].get<double>()));
    // a meta.json of other files (another token count) says nothing; one that is not JSON is refused
    g.write("data/meta.json", R"({"bytes": {"val": 100}, "tokens": {"val": 7}})");
    REQUIRE(g.train(g / "stale") == kExitOk);
    CHECK(summary(g / "stale")["test_bits_per_byte"].is_null());
    g.write("data/meta.json", "{\"bytes\": ");
    std::string err;
    CHECK(run_cli({"train", g.config(kGpt), "--output", g / "bad"}, {}, -1, &err) == kExitData);
    CHECK(err.find("meta.json: not a JSON object") != std::string::npos);
}

TEST_CASE("a Llama-style model trains; N replicas match one (cpu, sim); recompute, ZeRO, fused, resume") {
    GptRun g;
    g.model = kLlama;
    const std::string one = g / "one";
    REQUIRE(g.train(one) == kExitOk);
    CHECK(summary(one)["status"] == "completed");
    CHECK(summary(one)["test_loss"].get<double>() < std::log(128.0));
    const std::vector<float> p1 = GptRun::params(one);
    const std::string two = g / "two";
    REQUIRE(g.train(two, {"strategy.devices=cpu:2"}) == kExitOk);
    CHECK(rel_error(GptRun::params(two), p1) < 1e-4);  // AdamW over another summation order (see the GPT's)
    {
        SimScope sim(30);
        const std::string out = g / "sim";
        REQUIRE(g.train(out, {"strategy.devices=sim:0,0"}) == kExitOk);
        CHECK(rel_error(GptRun::params(out), p1) < 1e-4);
    }
    // recomputing the blocks: the same bits in less memory
    const std::string again = g / "recompute";
    REQUIRE(g.train(again, {"strategy.devices=cpu:2", "train.recompute=blocks"}) == kExitOk);
    CHECK(GptRun::params(again) == GptRun::params(two));
    CHECK(summary(again)["memory_plan_bytes"].get<uint64_t>() < summary(two)["memory_plan_bytes"].get<uint64_t>());
    // ZeRO-1 and ZeRO-2: the same bits where ZeRO-2 writes each tensor's gradient whole (buckets of
    // 0.02 MB); in smaller buckets the stacked gate/up weight's gradient is written in blocks of
    // rows, each its own product (another order of the GEMM's sums)
    for (const std::string mb : {"0.02", "0.01"}) {
        CAPTURE(mb);
        const std::string zero1 = g / ("zero1-" + mb), zero2 = g / ("zero2-" + mb);
        REQUIRE(g.train(zero1, {"strategy.devices=cpu:3", "strategy.shard=optimizer", "strategy.bucket_mb=" + mb}) ==
                kExitOk);
        REQUIRE(g.train(zero2, {"strategy.devices=cpu:3", "strategy.shard=gradients", "strategy.bucket_mb=" + mb}) ==
                kExitOk);
        if (mb == "0.02") CHECK(GptRun::params(zero2) == GptRun::params(zero1));
        CHECK(rel_error(GptRun::params(zero2), GptRun::params(zero1)) < 1e-4);
        CHECK(rel_error(GptRun::params(zero2), p1) < 1e-4);
    }
    // the fused attention (grouped heads read in place) trains as the unfused one
    const std::string fused = g / "fused";
    {
        GptRun f;
        f.root = g.root;
        f.model = kLlama;
        f.model.replace(f.model.find("fused_attention: false"), 22, "fused_attention: true");
        REQUIRE(f.train(fused) == kExitOk);
    }
    CHECK(rel_error(GptRun::params(fused), p1) < 1e-3);
    // bf16 trains; stop after step 5, resume: the same run bit for bit
    const std::string bf = g / "bf16";
    REQUIRE(g.train(bf, {"train.precision=bf16"}) == kExitOk);
    CHECK(summary(bf)["test_loss"].get<double>() < std::log(128.0));
    expect_stop_and_resume_exact(g, one);
}

TEST_CASE("the memory plan: simulated replicas allocate it to the byte; CPU replicas stay within it, scratch counted") {
    GptRun g;
    const auto plan_and_measured = [&](const std::string& name, std::vector<std::string> sets) {
        sets.push_back("train.steps=2");
        // on a thread of its own, as a run's process starts: replica 0 computes on the caller's
        // thread, whose kernels' scratch earlier tests grew
        int rc = -1;
        std::thread([&] { rc = g.train(g / name, sets); }).join();
        REQUIRE(rc == kExitOk);
        const nlohmann::json s = summary(g / name);
        return std::pair{s["memory_plan_bytes"].get<double>(), s["memory_per_replica_bytes"].get<double>()};
    };
    {
        SimScope sim(0);
        for (const std::vector<std::string>& sets :
             {std::vector<std::string>{"strategy.devices=sim:0,1"},
              {"strategy.devices=sim:0,1", "train.recompute=blocks", "train.grad_accumulation_steps=2"},
              {"strategy.devices=sim:0,0", "strategy.shared_parameters=true"},
              {"strategy.devices=sim:0,1", "train.precision=bf16", "strategy.cuda_graph=true"}}) {
            CAPTURE(sets.back());
            const auto [plan, measured] = plan_and_measured("sim" + std::to_string(sets.size()) + sets.back(), sets);
            CHECK(plan == measured);
        }
    }
    // CPU replicas: the kernels' per-thread scratch is part of what each holds; the plan bounds it
    // (the per-shape kernel choice rarely needs the whole bound) and stays within it by a few MiB
    for (const char* devices : {"cpu:1", "cpu:2"}) {
        CAPTURE(devices);
        const auto [plan, measured] =
            plan_and_measured(std::string("cpu") + devices[4], {std::string("strategy.devices=") + devices});
        CHECK(measured <= plan);
        CHECK(measured >= plan - 3.0 * 1048576);
    }
}

TEST_CASE("train.recompute: blocks trains bit for bit as keeping every activation, in less activation memory") {
    GptRun g;
    // the GPT (dropout in its first block), 2 CPU replicas, accumulation; then simulated GPUs in bf16
    for (const std::vector<std::string>& sets :
         {std::vector<std::string>{"strategy.devices=cpu:2", "train.grad_accumulation_steps=2"},
          std::vector<std::string>{"strategy.devices=sim:0,0", "train.precision=bf16"}}) {
        CAPTURE(sets.front());
        SimScope sim(sets.front().find("sim") != std::string::npos ? 20 : 0);
        const std::string keep = g / (sets.front().substr(std::strlen("strategy.devices="), 3) + "-keep");
        const std::string again = keep + "-recompute";
        REQUIRE(g.train(keep, sets) == kExitOk);
        std::vector<std::string> with = sets;
        with.push_back("train.recompute=blocks");
        REQUIRE(g.train(again, with) == kExitOk);
        CHECK(GptRun::params(again) == GptRun::params(keep));
        expect_same_run(keep, again);
        CHECK(summary(again)["memory_plan_bytes"].get<uint64_t>() < summary(keep)["memory_plan_bytes"].get<uint64_t>());
    }
    // The activations: a block keeps its output (and its input's pointer); one block's inner
    // buffers serve all. Four blocks of width 64 over a context of 32.
    const std::vector<LayerSpec> layers = gpt(128, 64, 32, 4, 4, true);
    const Model kept({32}, layers, 1), recomputed({32}, layers, 1, true);
    const uint64_t a = kept.activation_bytes(16, 4, 1 << 20), b = recomputed.activation_bytes(16, 4, 1 << 20);
    MESSAGE("activations for 16 rows: " << a << " bytes kept, " << b << " recomputed");
    CHECK(double(b) < 0.45 * double(a));

    // residual blocks with batchnorm (running statistics counted once; synchronised statistics
    // exchanged again in backward) and dropout, 2 replicas on CPUs and on simulated GPUs
    TempDir t;
    const std::string cnn = t.write("cnn.yaml", R"(run: {name: cnn, seed: 4}
strategy: {devices: "cpu:2", bucket_mb: 0.001}
data: {dataset: synthetic, input_shape: [6, 6, 3], classes: 3, train_samples: 96, test_samples: 24}
model:
  layers:
    - {type: conv2d, filters: 4, kernel_size: 3, padding: same}
    - type: residual
      activation: relu
      layers:
        - {type: conv2d, filters: 4, kernel_size: 3, padding: same, bias: false}
        - {type: batchnorm, activation: relu, sync: true}
        - {type: dropout, rate: 0.2}
        - {type: conv2d, filters: 4, kernel_size: 3, padding: same, bias: false}
        - {type: batchnorm}
    - type: residual
      shortcut: conv1x1
      activation: gelu
      layers:
        - {type: conv2d, filters: 8, kernel_size: 3, stride: 2, padding: same, bias: false}
        - {type: batchnorm}
    - {type: global_avgpool}
    - {type: dense, units: 3}
optimizer: {type: sgd, lr: 0.05, momentum: 0.9}
train: {epochs: 2, global_batch_size: 16, log_every_steps: 3, grad_accumulation_steps: 2}
checkpoint: {every_steps: 6, keep: 1}
)");
    static std::FILE* quiet = std::fopen("/dev/null", "w");
    for (const std::string devices : {"cpu:2", "sim:0,1"}) {
        CAPTURE(devices);
        SimScope sim(devices == "cpu:2" ? 0 : 20);
        for (const std::string recompute : {"none", "blocks"})
            REQUIRE(run_training(load_config(cnn, {"run.output_dir=" + (t / (devices + recompute)),
                                                   "train.recompute=" + recompute, "strategy.devices=" + devices}),
                                 nullptr, quiet) == kExitOk);
        // running statistics included
        CHECK(GptRun::params(t / (devices + "blocks")) == GptRun::params(t / (devices + "none")));
        expect_same_run(t / (devices + "none"), t / (devices + "blocks"));
    }
}

TEST_CASE("fused attention equals the unfused path: logits and gradients (cpu, sim), bf16 storage") {
    for (bool sim : {false, true}) {
        CAPTURE(sim);
        SimScope scope(sim ? 20 : 0);
        auto d = sim ? make_sim_device(0) : make_cpu_device(0);
        auto model = [](bool fused) {
            return std::vector<LayerSpec>{
                layer("embedding", {{"vocab", "19"}, {"dim", "24"}}),
                layer("position_embedding", {{"max_len", "9"}}),
                layer("transformer_block", {{"heads", "3"}, {"fused_attention", fused ? "true" : "false"}}),
                layer("transformer_block", {{"heads", "2"}, {"fused_attention", fused ? "true" : "false"}}),
                layer("layernorm"),
                layer("lm_head")};
        };
        const Model a({9}, model(false), 4), b({9}, model(true), 4);
        REQUIRE(a.flat_size() == b.flat_size());
        TokenHarness ha(*d, a, 5, 17), hb(*d, b, 5, 17);
        const std::vector<float> p = download(*d, ha.params);
        CHECK(rel_error(hb.logits(p), ha.logits(p)) < 1e-5);
        const std::vector<float> gb = hb.backprop(), ga = ha.backprop();
        for (const TensorInfo& t : a.tensors()) {
            CAPTURE(t.name);
            CHECK(rel_error(std::vector<float>(gb.begin() + long(t.offset), gb.begin() + long(t.offset + t.count)),
                            std::vector<float>(ga.begin() + long(t.offset), ga.begin() + long(t.offset + t.count))) <
                  1e-4);
        }
    }
    GptRun g;
    std::string text = kGpt;
    for (size_t at = 0; (at = text.find("heads: 4", at)) != std::string::npos; at += 8)
        text.replace(at, 8, "heads: 4, fused_attention: true");
    const std::string fused = g.config(text);
    REQUIRE(g.train(g / "unfused") == kExitOk);
    static std::FILE* quiet = std::fopen("/dev/null", "w");
    REQUIRE(run_training(load_config(fused, {"run.output_dir=" + (g / "fused")}), nullptr, quiet) == kExitOk);
    REQUIRE(run_training(load_config(fused, {"run.output_dir=" + (g / "fused2"), "strategy.devices=cpu:2"}), nullptr,
                         quiet) == kExitOk);
    CHECK(rel_error(GptRun::params(g / "fused"), GptRun::params(g / "unfused")) < 1e-3);
    CHECK(rel_error(GptRun::params(g / "fused2"), GptRun::params(g / "fused")) < 1e-4);
    // bf16 activations: q, k, v and the output stored in 16 bits, everything summed in f32
    REQUIRE(run_training(load_config(fused, {"run.output_dir=" + (g / "bf16"), "train.precision=bf16"}), nullptr,
                         quiet) == kExitOk);
    CHECK(summary(g / "bf16")["test_loss"].get<double>() < std::log(128.0));
    // the device ops check the head width themselves, before touching memory
    CHECK_THROWS_WITH_AS(
        attention_forward(*make_cpu_device(0), {}, 1, 2, AttentionHeads{2, 2, 130}, 1.0f, nullptr, nullptr, nullptr),
        doctest::Contains("2 heads (2 key/value heads) of width 130"), Error);
    CHECK_THROWS_WITH_AS(
        attention_forward(*make_cpu_device(0), {}, 1, 2, AttentionHeads{3, 2, 8}, 1.0f, nullptr, nullptr, nullptr),
        doctest::Contains("key/value heads must divide the heads"), Error);
    // what the fused kernel cannot do is refused, naming the key
    CHECK_THROWS_WITH_AS(
        Model({4},
              {layer("embedding", {{"vocab", "5"}, {"dim", "8"}}),
               layer("attention", {{"heads", "2"}, {"fused", "true"}, {"dropout", "0.1"}}), layer("lm_head")},
              1),
        doctest::Contains("fused attention drops no probabilities"), ConfigError);
    CHECK_THROWS_WITH_AS(Model({4},
                               {layer("embedding", {{"vocab", "5"}, {"dim", "260"}}),
                                layer("attention", {{"heads", "2"}, {"fused", "true"}}), layer("lm_head")},
                               1),
                         doctest::Contains("heads at most 128 wide; these are 130"), ConfigError);
}

TEST_CASE("attention in blocks (CPU: a cache's worth of samples, no keys above the diagonal) equals one block") {
    // 75 positions: query blocks of 64 and 11; 4 heads' probabilities, 90 KB a sample: blocks of 5
    // samples and 2 out of 7. The simulated GPU runs one block (all samples, every key).
    auto model = [](const char* dropout, bool fused) {
        return std::vector<LayerSpec>{
            layer("embedding", {{"vocab", "19"}, {"dim", "16"}}), layer("position_embedding", {{"max_len", "75"}}),
            layer("attention", {{"heads", "4"}, {"dropout", dropout}, {"fused", fused ? "true" : "false"}}),
            layer("lm_head")};
    };
    auto compare = [](Device& da, const Model& a, Device& db, const Model& b, double tolerance) {
        TokenHarness ha(da, a, 7, 23), hb(db, b, 7, 23);
        const std::vector<float> p = download(da, ha.params);
        CHECK(rel_error(hb.logits(p), ha.logits(p)) < tolerance);
        const std::vector<float> gb = hb.backprop(), ga = ha.backprop();
        for (const TensorInfo& t : a.tensors()) {  // the tensors, not the padding between them
            CAPTURE(t.name);
            auto part = [&](const std::vector<float>& g) {
                return std::vector<float>(g.begin() + long(t.offset), g.begin() + long(t.offset + t.count));
            };
            CHECK(rel_error(part(gb), part(ga)) < tolerance);
        }
    };
    auto cpu = make_cpu_device(0);
    REQUIRE(cpu->column_block_bytes() / (4 * 75 * 75 * 4) == 5);
    SUBCASE("against the fused path's row-by-row loops") {
        compare(*cpu, Model({75}, model("0", false), 7), *cpu, Model({75}, model("0", true), 7), 1e-5);
    }
    SUBCASE("against one block on the simulated GPU, dropout on the probabilities") {
        SimScope scope(20);
        auto sim = make_sim_device(0);
        REQUIRE(sim->column_block_bytes() == 0);
        const Model m({75}, model("0.3", false), 7);
        compare(*cpu, m, *sim, m, 1e-5);
    }
}

TEST_CASE("random token windows: anywhere in the file, a function of (seed, epoch, index); replicas and resume") {
    TempDir dir;
    const std::string root = dir.path();
    std::vector<uint32_t> ids(1000);
    for (uint32_t i = 0; i < ids.size(); ++i) ids[i] = i;
    write_bytes(root + "/train.bin", u16(ids));
    write_bytes(root + "/val.bin", u16(ids));
    const DataConfig c = tokens_config(root, 8, {{"vocab", "1000"}, {"windows", "random"}});
    const Datasets d = load_datasets(c, "", 7);
    REQUIRE(d.train.count() == 124);  // as many as tiled: (1000 - 1) / 8
    const auto e0 = windows(d.train, 0), e1 = windows(d.train, 1);
    int untiled = 0;
    for (size_t i = 0; i < d.train.count(); ++i) {
        const float start = e0.first[i * 8];
        CHECK(start >= 0.0f);
        CHECK(start <= 1000.0f - 9.0f);  // the window and its last label inside the file
        for (int k = 0; k < 8; ++k) {
            CHECK(e0.first[i * 8 + size_t(k)] == start + float(k));
            CHECK(e0.second[i * 8 + size_t(k)] == int32_t(start) + k + 1);
        }
        untiled += int(start) % 8 != 0;
    }
    CHECK(untiled > 60);                                     // about 7 in 8 start off the tiled grid
    CHECK(e0 != e1);                                         // another epoch, other windows
    CHECK(windows(load_datasets(c, "", 7).train, 1) == e1);  // the same seed and epoch: the same windows
    CHECK(windows(load_datasets(c, "", 8).train, 0) != e0);  // another seed
    CHECK(fingerprint(load_datasets(c, "", 8).train) != fingerprint(d.train));
    CHECK(windows(d.test).first[8] == 8.0f);  // the test split stays tiled

    GptRun g;
    const std::vector<std::string> random = {"data.windows=random", "train.steps=6", "checkpoint.every_steps=3"};
    auto with = [&](std::vector<std::string> v, const std::vector<std::string>& more) {
        v.insert(v.end(), more.begin(), more.end());
        return v;
    };
    REQUIRE(g.train(g / "one", random) == kExitOk);
    REQUIRE(g.train(g / "two", with(random, {"strategy.devices=cpu:2"})) == kExitOk);
    CHECK(rel_error(GptRun::params(g / "two"), GptRun::params(g / "one")) < 1e-4);
    REQUIRE(g.train(g / "tiled", {"train.steps=6", "checkpoint.every_steps=3"}) == kExitOk);
    CHECK(GptRun::params(g / "tiled") != GptRun::params(g / "one"));
    ::setenv("MIRRORED_TEST_STOP_AFTER_STEP", "4", 1);
    CHECK(g.train(g / "stopped", random) == kExitInterrupted);
    ::unsetenv("MIRRORED_TEST_STOP_AFTER_STEP");
    CHECK(g.train(g / "stopped", random) == kExitOk);
    expect_same_run(g / "one", g / "stopped");
}

namespace {

const char* kReference = R"(run: {name: equal, seed: 9}
strategy: {devices: "cpu:1"}
data: {dataset: tokens, root: ROOT, train: train.bin, test: train.bin, context: 16, vocab: 128}
model:
  input_shape: [16]
  layers:
    - {type: embedding, vocab: 128, dim: 32}
    - {type: position_embedding, max_len: 16}
    - {type: transformer_block, heads: 4}
    - {type: transformer_block, heads: 4}
    - {type: layernorm}
    - {type: lm_head}
optimizer: {type: adamw, lr: 0.001, weight_decay: 0.0}
train: {epochs: 0, steps: 10, global_batch_size: 4, log_every_steps: 1}
checkpoint: {every_steps: 0, resume: never}
)";

TEST_CASE("the learning-parity script draws the loader's windows in its order and the run's schedule") {
    // scripts/gpt_learning_parity.py trains the shipped GPT in PyTorch on the windows mirrored's
    // loader takes: its Philox and shuffle reimplemented, checked by its self-test against
    // Random123's known answers and against this permutation of the C++ loader's
    if (!python_has("numpy", "NumPy", "python3-numpy")) return;
    CHECK(Loader::permutation(10, 1, 0) == std::vector<uint32_t>{4, 3, 7, 9, 1, 8, 6, 2, 5, 0});
    CHECK(run_program(kPython, {repo_script("gpt_learning_parity.py"), "--self-test"}) == 0);
}

// The run `text` describes (its data a token file ROOT/train.bin of exactly one batch) against
// scripts/gpt_reference.py given `args`: every step-1 gradient within 1e-4, 10 AdamW losses within 1e-4.
void check_against_reference(std::string text, const std::vector<std::string>& args) {
    TempDir dir;
    const int batch = 4, t = 16;
    // exactly one batch of windows: every step trains on the same batch, as the reference does
    const std::vector<uint32_t> ids = bytes_of(corpus(40, 3).substr(0, size_t(batch) * t + 1));
    write_bytes(dir / "train.bin", u16(ids));
    text.replace(text.find("ROOT"), 4, dir.path());
    const Config cfg = load_config(dir.write("equal.yaml", text), {"run.output_dir=" + (dir / "run")});

    // the initial weights, as the run draws them, for the reference to start from
    auto d = make_cpu_device(0);
    const Model m(cfg.model.input_shape, cfg.model.layers, cfg.run.seed);
    std::vector<float> inputs(size_t(batch) * t);
    std::vector<int32_t> labels(inputs.size());
    for (size_t i = 0; i < inputs.size(); ++i) inputs[i] = float(ids[i]), labels[i] = int32_t(ids[i + 1]);
    TokenHarness h(*d, m, batch, 1);
    h.x = upload(*d, inputs);
    h.labels = labels;
    h.y = upload(*d, labels);
    const std::vector<float> p0 = download(*d, h.params), grads = h.backprop();
    SafetensorsFile init;
    for (const TensorInfo& info : m.tensors())
        init.tensors[info.name] = {info.shape, std::vector<float>(p0.begin() + long(info.offset),
                                                                  p0.begin() + long(info.offset + info.count))};
    write_safetensors(dir / "init.safetensors", init);

    std::vector<std::string> argv = {repo_script("gpt_reference.py"),
                                     "--weights",
                                     dir / "init.safetensors",
                                     "--tokens",
                                     dir / "train.bin",
                                     "--context",
                                     "16",
                                     "--batch",
                                     "4",
                                     "--steps",
                                     "10",
                                     "--lr",
                                     "0.001",
                                     "--out",
                                     dir / "ref.json",
                                     "--grads-out",
                                     dir / "ref_grads.safetensors"};
    argv.insert(argv.end(), args.begin(), args.end());
    std::string err;
    REQUIRE_MESSAGE(run_program(kPython, argv, &err) == 0, err);
    // step 1: every parameter's gradient
    const SafetensorsFile ref = read_safetensors(dir / "ref_grads.safetensors", false);
    REQUIRE(ref.tensors.size() == m.tensors().size());
    for (const TensorInfo& info : m.tensors()) {
        CAPTURE(info.name);
        const std::vector<float> mine(grads.begin() + long(info.offset),
                                      grads.begin() + long(info.offset + info.count));
        CHECK(rel_error(mine, ref.tensors.at(info.name).second) < 1e-4);
    }
    // 10 AdamW steps of the trainer itself
    REQUIRE(run_training(cfg, nullptr, std::fopen("/dev/null", "w")) == kExitOk);
    const nlohmann::json want = nlohmann::json::parse(read_text(dir / "ref.json"));
    std::vector<double> losses;
    for (const auto& j : metrics(dir / "run"))
        if (j["type"] == "train") losses.push_back(j["loss"]);
    REQUIRE(losses.size() == 10);
    for (size_t i = 0; i < losses.size(); ++i) {
        CAPTURE(i);
        CHECK(losses[i] == doctest::Approx(want["losses"][i].get<double>()).epsilon(1e-4));
    }
    CHECK(losses.back() < losses.front());
}

}  // namespace

TEST_CASE("a GPT equals an independent PyTorch model step for step: step-1 gradients, 10 AdamW losses") {
    if (!python_has("torch, numpy", "PyTorch", "python3-torch")) return;
    std::string gelu = "erf";  // the reference's name for the exact form
    SUBCASE("exact GELU") {}
    SUBCASE("GPT-2's tanh GELU, weight decay 5 on matrices only (nanoGPT's groups; 0.1 would not show)") {
        gelu = "tanh";
    }
    CAPTURE(gelu);
    std::string text = kReference;
    for (size_t at; gelu == "tanh" && (at = text.find("heads: 4}")) != std::string::npos;)
        text.replace(at, 9, "heads: 4, activation: gelu_tanh}");
    if (gelu == "tanh")
        text.replace(text.find("weight_decay: 0.0}"), 18, "weight_decay: 5.0, weight_decay_on: matrices}");
    check_against_reference(text, {"--heads", "4", "--gelu", gelu, "--weight-decay", gelu == "tanh" ? "5.0" : "0",
                                   "--decay-matrices-only"});
}

TEST_CASE("a Llama-style model equals an independent PyTorch Llama step for step: RoPE, GQA, SwiGLU, RMSNorm") {
    if (!python_has("torch, numpy", "PyTorch", "python3-torch")) return;
    std::string text = kReference;
    const size_t from = text.find("    - {type: position_embedding"), to = text.find("optimizer:");
    text.replace(from, to - from,
                 R"(    - {type: llama_block, heads: 4, kv_heads: 2, intermediate_size: 48, rope_theta: 500}
    - {type: llama_block, heads: 4, kv_heads: 2, intermediate_size: 48, rope_theta: 500}
    - {type: rmsnorm}
    - {type: lm_head, tie_weights: false, units: 128}
)");
    check_against_reference(text, {"--heads", "4", "--kv-heads", "2", "--rope-theta", "500", "--rms-eps", "1e-6"});
}

// `mirrored generate CKPT ARGS...`: its exit status, and its standard output (a file in dir) in *text.
static int generate_text(const TempDir& dir, const std::string& ckpt, std::vector<std::string> args, std::string* text,
                         std::string* err) {
    args.insert(args.begin(), {"generate", ckpt});
    const std::string path = dir / "generated.txt";
    const int rc = run_cli(args, {}, -1, err, Stdout::file, path);
    *text = read_text(path);
    return rc;
}

TEST_CASE("generate with the key/value cache: the window way's greedy text within the context, GPT and Llama") {
    for (const char* model : {kGpt, kLlama}) {
        GptRun g;
        g.model = model;
        CAPTURE(g.model.substr(0, 22));
        REQUIRE(g.train(g / "run") == kExitOk);
        const std::string ckpt = list_checkpoints(g / "run/checkpoints").front();
        auto gen = [&](std::vector<std::string> args, std::string* text, std::string* err = nullptr) {
            return generate_text(g, ckpt, std::move(args), text, err);
        };
        // a prompt of 3 and 13 tokens: positions 0..15, the context of 16
        std::string cached, window, err;
        REQUIRE(gen({"--prompt", "def", "--tokens", "13", "--temperature", "0", "--json", g / "stats.json"}, &cached) ==
                kExitOk);
        REQUIRE(gen({"--prompt", "def", "--tokens", "13", "--temperature", "0", "--no-kv-cache"}, &window) == kExitOk);
        CHECK(cached == window);
        CHECK(cached.size() == 3 + 13 + 1);
        const nlohmann::json stats = nlohmann::json::parse(read_text(g / "stats.json"));
        CHECK(stats["tokens"] == 13);
        CHECK(stats["kv_cache"] == true);
        CHECK(stats["tokens_per_sec"].get<double>() > 0);
        // past the context the cache restarts from the last half context; drawn text repeats for a seed
        std::string a, b;
        REQUIRE(gen({"--prompt", "def", "--tokens", "70", "--seed", "3"}, &a) == kExitOk);
        REQUIRE(gen({"--prompt", "def", "--tokens", "70", "--seed", "3"}, &b) == kExitOk);
        CHECK(a == b);
        CHECK(a.size() == 3 + 70 + 1);
        // a prompt longer than the context: its last 16 tokens, as the window way reads them
        const std::string long_prompt(40, 'a');
        REQUIRE(gen({"--prompt", long_prompt, "--tokens", "1", "--temperature", "0"}, &cached) == kExitOk);
        REQUIRE(gen({"--prompt", long_prompt, "--tokens", "1", "--temperature", "0", "--no-kv-cache"}, &window) ==
                kExitOk);
        CHECK(cached == window);
        // --json never replaces the checkpoint it reads
        CHECK(gen({"--tokens", "2", "--json", ckpt}, &a, &err) == kExitUsage);
        CHECK(err.find("the checkpoint") != std::string::npos);
    }
}

TEST_CASE("generate --prompts: each prompt continued as --prompt alone continues it, batched; bad files named") {
    for (const char* model : {kGpt, kLlama}) {
        GptRun g;
        g.model = model;
        CAPTURE(g.model.substr(0, 22));
        REQUIRE(g.train(g / "run") == kExitOk);
        const std::string ckpt = list_checkpoints(g / "run/checkpoints").front();
        auto gen = [&](std::vector<std::string> args, std::string* out, std::string* err = nullptr) {
            return generate_text(g, ckpt, std::move(args), out, err);
        };
        // prompts of 1 to 40 tokens (past the context of 16: its last 16), one a JSON string with a
        // newline; 40 draws each: past the context, where the cache restarts from the last half
        const std::vector<std::string> prompts = {"def", "x", std::string(40, 'a'), "class A:\n    pass", "import os"};
        const std::string file =
            g.write("prompts.jsonl", "\"def\"\n\"x\"\n\n\"" + prompts[2] +
                                         "\"\n{\"prompt\": \"class A:\\n    pass\"}\r\n\"import os\"\n");
        const std::vector<std::string> draws = {"--tokens", "40", "--temperature", "0.9", "--seed", "7"};
        std::vector<std::string> args = {"--prompts", file, "--batch", "3", "--json", g / "stats.json"};
        args.insert(args.end(), draws.begin(), draws.end());
        std::string batched, err;
        REQUIRE_MESSAGE(gen(args, &batched, &err) == kExitOk, err);
        std::vector<nlohmann::json> lines;
        std::istringstream in(batched);
        for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
        REQUIRE(lines.size() == prompts.size());
        size_t drawn = 0;
        for (size_t i = 0; i < prompts.size(); ++i) {
            CAPTURE(i);
            CHECK(lines[i]["prompt"] == prompts[i]);
            CHECK(lines[i]["ids"].size() == 40);
            CHECK(lines[i]["stopped_at_end_of_text"] == false);
            drawn += lines[i]["ids"].size();
            std::vector<std::string> one = {"--prompt", prompts[i], "--no-echo"};
            one.insert(one.end(), draws.begin(), draws.end());
            std::string alone;
            REQUIRE(gen(one, &alone) == kExitOk);
            CHECK(lines[i]["text"].get<std::string>() + "\n" == alone);
        }
        const nlohmann::json stats = nlohmann::json::parse(read_text(g / "stats.json"));
        CHECK(stats["prompts"] == prompts.size());
        CHECK(stats["batch"] == 3);
        CHECK(stats["tokens"] == drawn);
        // one at a time: the same lines
        args[3] = "1";
        std::string single;
        REQUIRE(gen(args, &single) == kExitOk);
        CHECK(single == batched);
        // refused, naming what and where
        CHECK(gen({"--prompts", file, "--no-kv-cache"}, &single, &err) == kExitUsage);
        CHECK(err.find("--prompts: decodes with the key/value cache") != std::string::npos);
        CHECK(gen({"--prompts", g / "missing.txt"}, &single, &err) == kExitUsage);
        CHECK(err.find("missing.txt: cannot read it") != std::string::npos);
        CHECK(gen({"--prompts", g.write("bad.jsonl", "\"def\"\n\"unterminated\n")}, &single, &err) == kExitUsage);
        CHECK(err.find("bad.jsonl:2: expected a JSON string or an object with a \"prompt\" string") !=
              std::string::npos);
        // a plain file's lines are prompts as they are: quotes included
        REQUIRE(gen({"--prompts", g.write("plain.txt", "\"\"\"Return\n\n{x}\n"), "--tokens", "2"}, &single) == kExitOk);
        CHECK(single.find("{\"prompt\":\"\\\"\\\"\\\"Return\",") == 0);
        CHECK(single.find("\n{\"prompt\":\"{x}\",") != std::string::npos);
        CHECK(gen({"--prompts", g.write("empty.txt", "\n\n")}, &single, &err) == kExitUsage);
        CHECK(err.find("empty.txt: no prompts") != std::string::npos);
        CHECK(gen({"--prompts", file, "--prompt", "x"}, &single, &err) == kExitUsage);
        CHECK(gen({"--prompts", file, "--batch", "0"}, &single, &err) == kExitUsage);
        CHECK(gen({"--batch", "2"}, &single, &err) == kExitUsage);  // only with --prompts
        // --json never replaces the file of prompts it reads
        CHECK(gen({"--prompts", file, "--json", file}, &single, &err) == kExitUsage);
        CHECK(err.find("the prompts file") != std::string::npos);
        CHECK(read_text(file).find("class A:") != std::string::npos);
    }
}

TEST_CASE("export --names hf: Llama and GPT-2 as Hugging Face folders; Hugging Face's forward gives our test loss") {
    if (!python_has("torch, numpy", "PyTorch", "python3-torch")) return;
    GptRun g;
    g.model = kLlama;
    REQUIRE(g.train(g / "run") == kExitOk);
    const std::string ckpt = list_checkpoints(g / "run/checkpoints").front();  // the last step's
    std::string err;
    REQUIRE(run_cli({"export", ckpt, "--names", "hf", "--out", g / "hf"}, {}, -1, &err) == kExitOk);
    const nlohmann::json config = nlohmann::json::parse(read_text(g / "hf/config.json"));
    CHECK(config["architectures"][0] == "LlamaForCausalLM");
    CHECK(config["num_attention_heads"] == 4);
    CHECK(config["num_key_value_heads"] == 2);
    CHECK(config["num_hidden_layers"] == 2);
    CHECK(config["intermediate_size"] == 64);
    CHECK(config["vocab_size"] == 128);
    CHECK(config["tie_word_embeddings"] == false);
    // every test window at once: the reference's loss is the run's test loss
    const size_t windows = (fs::file_size(g.root + "/val.bin") / 2 - 1) / 16;
    REQUIRE_MESSAGE(run_program(kPython,
                                {repo_script("hf_reference.py"), "logits", g / "hf", "--tokens", g.root + "/val.bin",
                                 "--context", "16", "--batch", std::to_string(windows), "--out", g / "ref.json"},
                                &err) == 0,
                    err);
    const double loss = nlohmann::json::parse(read_text(g / "ref.json"))["loss"];
    CHECK(loss == doctest::Approx(summary(g / "run")["test_loss"].get<double>()).epsilon(1e-5));
    // a second export replaces its files (as an export to a file does); --out must be a folder
    CHECK(run_cli({"export", ckpt, "--names", "hf", "--out", g / "hf"}, {}, -1, &err) == kExitOk);
    CHECK(run_cli({"export", ckpt, "--names", "hf", "--out", g / "hf/config.json"}, {}, -1, &err) == kExitUsage);
    CHECK(err.find("is not a folder") != std::string::npos);
    // a GPT as GPT2LMHeadModel (exact gelu; Conv1D's [in, out]): Hugging Face's forward gives its test loss
    g.model = kGpt;
    REQUIRE(g.train(g / "gpt") == kExitOk);
    REQUIRE_MESSAGE(
        run_cli({"export", list_checkpoints(g / "gpt/checkpoints").front(), "--names", "hf", "--out", g / "hf2"}, {},
                -1, &err) == kExitOk,
        err);
    const nlohmann::json gpt2 = nlohmann::json::parse(read_text(g / "hf2/config.json"));
    CHECK(gpt2["model_type"] == "gpt2");
    CHECK(gpt2["activation_function"] == "gelu");
    REQUIRE_MESSAGE(run_program(kPython,
                                {repo_script("hf_reference.py"), "logits", g / "hf2", "--tokens", g.root + "/val.bin",
                                 "--context", "16", "--batch", std::to_string(windows), "--out", g / "ref2.json"},
                                &err) == 0,
                    err);
    CHECK(nlohmann::json::parse(read_text(g / "ref2.json"))["loss"].get<double>() ==
          doctest::Approx(summary(g / "gpt")["test_loss"].get<double>()).epsilon(1e-5));
    // a model Hugging Face's classes do not hold: named, and nothing made for it
    g.model = kGpt;
    REQUIRE(g.train(g / "gpt_untied", {"model.layers.5.tie_weights=false", "model.layers.5.units=128"}) == kExitOk);
    CHECK(
        run_cli({"export", list_checkpoints(g / "gpt_untied/checkpoints").front(), "--names", "hf", "--out", g / "hf3"},
                {}, -1, &err) == kExitUsage);
    CHECK(err.find("GPT-2's lm_head is tied to the embedding") != std::string::npos);
    CHECK(!fs::exists(g / "hf3"));
}

TEST_CASE(
    "generate: a checkpoint's continuation of a prompt, the same for a seed; non-models and bad prompts refused") {
    GptRun g;
    const std::string out = g / "run";
    REQUIRE(g.train(out) == kExitOk);
    const std::string ckpt = list_checkpoints(out + "/checkpoints").front();
    auto gen = [&](std::vector<std::string> args, std::string* text, std::string* err = nullptr) {
        return generate_text(g, ckpt, std::move(args), text, err);
    };
    std::string a, b, c, greedy1, greedy2, err;
    REQUIRE(gen({"--prompt", "def ", "--tokens", "40", "--seed", "3"}, &a) == kExitOk);
    REQUIRE(gen({"--prompt", "def ", "--tokens", "40", "--seed", "3"}, &b) == kExitOk);
    REQUIRE(gen({"--prompt", "def ", "--tokens", "40", "--seed", "4", "--no-echo"}, &c) == kExitOk);
    CHECK(a == b);
    CHECK(a.rfind("def ", 0) == 0);
    CHECK(a.size() == 4 + 40 + 1);  // the prompt, one byte per token, a newline
    CHECK(c.size() == 40 + 1);
    REQUIRE(gen({"--prompt", "re", "--tokens", "30", "--temperature", "0", "--seed", "1"}, &greedy1) == kExitOk);
    REQUIRE(gen({"--prompt", "re", "--tokens", "30", "--temperature", "0", "--seed", "2"}, &greedy2) == kExitOk);
    CHECK(greedy1 == greedy2);                   // no draw at temperature 0
    for (unsigned char ch : a) CHECK(ch < 128);  // the vocabulary of the run's data
    // a byte the model never saw in its vocabulary
    CHECK(gen({"--prompt", "caf\xc3\xa9"}, &a, &err) == kExitUsage);
    CHECK(err.find("--prompt: byte 195 is outside the model's vocabulary of 128") != std::string::npos);
    // not a language model: the tiny classifier of the other tests
    const std::string mlp = g.write("mlp.yaml", R"(run: {name: mlp, seed: 1}
strategy: {devices: "cpu:1"}
data: {dataset: synthetic, input_shape: [6], classes: 3, train_samples: 64, test_samples: 16}
model: {layers: [{type: dense, units: 3}]}
optimizer: {type: sgd, lr: 0.1}
train: {steps: 2, global_batch_size: 8}
checkpoint: {every_steps: 2}
)");
    static std::FILE* quiet = std::fopen("/dev/null", "w");
    REQUIRE(run_training(load_config(mlp, {"run.output_dir=" + (g / "mlp")}), nullptr, quiet) == kExitOk);
    CHECK(run_cli({"generate", list_checkpoints(g / "mlp/checkpoints").front()}, {}, -1, &err) == kExitUsage);
    CHECK(err.find("generate needs a language model") != std::string::npos);
    // a seed past 2^64 - 1 or signed is refused, not clamped; an empty --prompt-ids is no prompt
    CHECK(gen({"--seed", "18446744073709551616"}, &a, &err) == kExitUsage);
    CHECK(err.find("--seed: expected a whole number from 0 to 18446744073709551615, got '18446744073709551616'") !=
          std::string::npos);
    CHECK(gen({"--seed", "-1"}, &a, &err) == kExitUsage);
    CHECK(gen({"--seed", "18446744073709551615", "--tokens", "2"}, &a, &err) == kExitOk);
    CHECK(gen({"--prompt-ids", ""}, &a, &err) == kExitUsage);
    CHECK(err.find("--prompt-ids: no ids") != std::string::npos);
    // a checkpoint that cannot be read says why (exit 4), not that it lacks a config
    const std::string fifo = g / "fifo.safetensors", empty = g.write("empty.safetensors", "");
    REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
    const std::string whole = read_text(ckpt), cut = g.write("cut.safetensors", whole.substr(0, whole.size() / 2));
    const std::string shortened = g.write("short.safetensors", whole.substr(0, 5));
    struct Unreadable {
        std::string path, says;
    };
    for (const Unreadable& u : {Unreadable{g / "missing.safetensors", "cannot open: No such file"},
                                Unreadable{g.path().string(), "expected a regular file"},
                                Unreadable{fifo, "expected a regular file"}, Unreadable{empty, "truncated (0 bytes)"},
                                Unreadable{shortened, "truncated (5 bytes)"}, Unreadable{cut, "truncated"}}) {
        CAPTURE(u.path);
        CHECK(run_cli({"generate", u.path}, {}, -1, &err) == kExitCheckpoint);
        CHECK(err.find(u.says) != std::string::npos);
        CHECK(err.find("no embedded config") == std::string::npos);
    }
    // standard output on a full device: the text is lost, and the exit status says so
    CHECK(run_cli({"generate", ckpt, "--tokens", "8"}, {}, -1, &err, Stdout::file, "/dev/full") == kExitCheckpoint);
    CHECK(err.find("standard output: write failed: No space left on device") != std::string::npos);
}

TEST_CASE("export --names nanogpt: nanoGPT's state-dict names; a nanoGPT-laid-out PyTorch GPT gives our logits") {
    GptRun g;
    const std::string out = g / "run";
    REQUIRE(g.train(out) == kExitOk);
    const std::string ckpt = list_checkpoints(out + "/checkpoints").front();
    std::string err;
    REQUIRE(run_cli({"export", ckpt, "--out", g / "gpt.safetensors", "--names", "nanogpt"}, {}, -1, &err) == kExitOk);
    const SafetensorsFile f = read_safetensors(g / "gpt.safetensors", false);
    std::vector<std::string> names;
    for (const auto& [name, t] : f.tensors) names.push_back(name);
    CHECK(names.size() == 2 + 2 * 12 + 2 + 1);  // wte, wpe, 12 per block, ln_f, the tied head under its own name
    for (const char* name : {"transformer.wte.weight", "transformer.wpe.weight", "transformer.h.0.ln_1.weight",
                             "transformer.h.1.attn.c_attn.weight", "transformer.h.1.mlp.c_proj.bias",
                             "transformer.ln_f.bias", "lm_head.weight"})
        CHECK_MESSAGE(f.tensors.count(name), name);
    CHECK(f.tensors.at("lm_head.weight") == f.tensors.at("transformer.wte.weight"));
    CHECK(f.tensors.at("transformer.h.1.attn.c_attn.weight") ==
          read_safetensors(ckpt, true).tensors.at("layers.3.attn.c_attn.weight"));

    // a model nanoGPT cannot hold is refused, naming why
    std::string text = kGpt;
    text.replace(text.find("{type: transformer_block, heads: 4}"), 35,
                 "{type: transformer_block, heads: 4, activation: gelu_tanh}");
    GptRun t;
    REQUIRE(run_training(load_config(t.config(text), {"run.output_dir=" + (t / "run")}), nullptr,
                         std::fopen("/dev/null", "w")) == kExitOk);
    CHECK(run_cli({"export", list_checkpoints(t / "run/checkpoints").front(), "--out", t / "x.safetensors", "--names",
                   "nanogpt"},
                  {}, -1, &err) == kExitUsage);
    CHECK(err.find("model.layers.3: activation gelu_tanh; nanoGPT's GPT is") != std::string::npos);
    CHECK(!fs::exists(t / "x.safetensors"));
    text = kGpt;  // an untied head: nanoGPT's would take one tensor for both
    text.replace(text.find("{type: lm_head}"), 15, "{type: lm_head, tie_weights: false, units: 128}");
    GptRun u;
    REQUIRE(run_training(load_config(u.config(text), {"run.output_dir=" + (u / "run")}), nullptr,
                         std::fopen("/dev/null", "w")) == kExitOk);
    CHECK(run_cli({"export", list_checkpoints(u / "run/checkpoints").front(), "--out", u / "x.safetensors", "--names",
                   "nanogpt"},
                  {}, -1, &err) == kExitUsage);
    CHECK(err.find("tie_weights false (nanoGPT ties lm_head to wte)") != std::string::npos);

    if (!python_has("torch, numpy", "PyTorch", "python3-torch")) return;
    REQUIRE(run_cli({"eval", g.config(), "--checkpoint", ckpt, "--dump-inputs", g / "x.npy", "--dump-logits",
                     g / "y.npy", "--limit", "16"},
                    {}, -1, &err) == kExitOk);
    CHECK_MESSAGE(run_program(kPython,
                              {repo_script("check_export_nanogpt.py"), g / "gpt.safetensors", g / "x.npy", g / "y.npy",
                               "--heads", "4"},
                              &err) == 0,
                  err);
}

TEST_CASE("prepare_text.py: byte tokens, a BPE vocabulary (sentencepiece); a BPE model trains and generates ids") {
    const std::string python = "/usr/bin/python3";
    const std::string script =
        fs::read_symlink("/proc/self/exe").parent_path().parent_path() / "scripts/prepare_text.py";
    TempDir dir;
    std::vector<std::string> files;
    for (int i = 0; i < 10; ++i) files.push_back(dir.write("text" + std::to_string(i) + ".txt", corpus(300, 10 + i)));
    std::vector<std::string> args = {script, "--out", dir / "bytes", "--val-every", "5"};
    args.insert(args.end(), files.begin(), files.end());
    std::string err;
    REQUIRE_MESSAGE(run_program(python, args, &err) == 0, err);
    auto meta = nlohmann::json::parse(read_text(dir / "bytes/meta.json"));
    CHECK(meta["vocab"] == 256);
    CHECK(meta["files"]["val"] == 2);  // files 4 and 9
    CHECK(fs::file_size(dir / "bytes/train.bin") == 2 * meta["bytes"]["train"].get<size_t>());

    if (run_program(python, {"-c", "import sentencepiece"}) != 0) {
        mark_skipped("sentencepiece is not installed (Debian and Ubuntu: python3-sentencepiece)");
        return;
    }
    args[2] = dir / "bpe";
    args.insert(args.begin() + 3, {"--bpe", "320"});
    REQUIRE_MESSAGE(run_program(python, args, &err) == 0, err);
    meta = nlohmann::json::parse(read_text(dir / "bpe/meta.json"));
    CHECK(meta["vocab"] == 320);
    CHECK(meta["tokens"]["train"].get<size_t>() < meta["bytes"]["train"].get<size_t>() / 2);  // pieces, not bytes
    CHECK(fs::exists(dir / "bpe/tokenizer.model"));
    // a second run replaces its own files; a folder of someone else's is refused
    REQUIRE(run_program(python, args, &err) == 0);
    fs::create_directories(dir / "theirs");
    dir.write("theirs/train.bin", "x");
    args[2] = dir / "theirs";
    CHECK(run_program(python, args, &err) == 4);

    std::string text = kGpt;
    for (const char* from : {"vocab: 128", "vocab: 128"}) text.replace(text.find(from), 10, "vocab: 320");
    text.replace(text.find("ROOT"), 4, dir / "bpe");
    const std::string cfg = dir.write("bpe.yaml", text);
    static std::FILE* quiet = std::fopen("/dev/null", "w");
    REQUIRE(run_training(load_config(cfg, {"run.output_dir=" + (dir / "run")}), nullptr, quiet) == kExitOk);
    CHECK(summary(dir / "run")["test_loss"].get<double>() < std::log(320.0));
    // the run kept the data's SentencePiece model: text in, text out
    const std::string kept = dir / "kept.txt";
    REQUIRE(run_cli({"generate", list_checkpoints(dir / "run/checkpoints").front(), "--prompt", "def value", "--tokens",
                     "12", "--seed", "2"},
                    {}, -1, &err, Stdout::file, kept) == kExitOk);
    CHECK(read_text(kept).rfind("def value", 0) == 0);
    fs::remove_all(dir / "run/tokenizer");  // without it: ids
    // the prompt through the tokenizer, ids out, back through it
    const std::string encoded = dir / "encoded.txt";
    {
        TempDir tmp;
        const std::string in = tmp.write("prompt.txt", "def value");
        REQUIRE(
            wait_status_within(spawn_program("/bin/sh",
                                             {"-c", python + " " + script + " --encode " +
                                                        (dir / "bpe/tokenizer.model") + " < " + in + " > " + encoded},
                                             {}, tmp / "err"),
                               60) == 0);
    }
    std::string ids = read_text(encoded);
    while (!ids.empty() && ids.back() == '\n') ids.pop_back();
    REQUIRE(!ids.empty());
    const std::string out = dir / "generated.txt";
    REQUIRE(run_cli({"generate", list_checkpoints(dir / "run/checkpoints").front(), "--prompt-ids", ids, "--tokens",
                     "12", "--seed", "2"},
                    {}, -1, &err, Stdout::file, out) == kExitOk);
    std::istringstream words(read_text(out));
    int n = 0;
    for (long id; words >> id; ++n) CHECK((id >= 0 && id < 320));
    CHECK(n == int(std::count(ids.begin(), ids.end(), ' ')) + 1 + 12);  // the prompt echoed, then 12
    CHECK(run_cli({"generate", list_checkpoints(dir / "run/checkpoints").front(), "--prompt-ids", "3 999"}, {}, -1,
                  &err) == kExitUsage);
    CHECK(err.find("'999' is not a token id of the model's vocabulary [0, 320)") != std::string::npos);
    // text without the tokenizer: bytes are not this vocabulary's ids
    CHECK(run_cli({"generate", list_checkpoints(dir / "run/checkpoints").front(), "--prompt", "def"}, {}, -1, &err) ==
          kExitUsage);
    CHECK(err.find("--prompt: the model's vocabulary has 320 tokens, not bytes") != std::string::npos);
    TempDir tmp;
    CHECK(wait_status_within(spawn_program("/bin/sh",
                                           {"-c", python + " " + script + " --decode " + (dir / "bpe/tokenizer.model") +
                                                      " < " + out + " > " + (tmp / "text")},
                                           {}, tmp / "err"),
                             60) == 0);
    CHECK(read_text(tmp / "text").rfind("def value", 0) == 0);  // the prompt decodes back as it was
}

TEST_CASE("plan and bench-step take a language model; synthetic token windows over a vocabulary") {
    DataConfig c = make_data_config(
        "synthetic", {{"input_shape", "[8]"}, {"vocab", "50"}, {"train_samples", "5"}, {"test_samples", "2"}});
    const Datasets d = load_datasets(c, "", 3);
    CHECK(d.train.count() == 5);
    CHECK(d.train.label_size == 8);
    CHECK(d.train.classes == 50);
    for (size_t i = 0; i + 1 < d.train.features.size(); ++i) {
        CHECK(d.train.features[i] >= 0.0f);
        CHECK(d.train.features[i] < 50.0f);
        CHECK(float(d.train.labels[i]) == d.train.features[i + 1]);  // each position's next token
    }
    GptRun g;
    const std::string out = g / "plan.txt";
    REQUIRE(run_cli({"plan", g.config(), "--gpu", "h200", "--gpus", "1,2"}, {}, -1, nullptr, Stdout::file, out) ==
            kExitOk);
    CHECK(read_text(out).find("GPUs batch/GPU") != std::string::npos);
    CHECK(run_cli({"bench-step", g.config(), "--devices", "cpu:1", "--steps", "2", "--warmup", "1"}) == kExitOk);
    // memory for recomputed blocks but not for kept activations: the planner says to recompute
    const std::string js = g / "plan.json";
    REQUIRE(run_cli({"plan", g.config(), "--gpus", "1", "--per-replica-batch", "64", "--json", js}) == kExitOk);
    const nlohmann::json full = nlohmann::json::parse(read_text(js))["results"][0];
    const double need = full["memory_bytes"].get<double>(), saved = full["recompute_saving_bytes"].get<double>();
    CHECK(saved > 0.3 * full["memory"]["activations"].get<double>());
    CHECK(full["recompute_step_ms"].get<double>() > full["step_ms"].get<double>());
    char gb[32];
    std::snprintf(gb, sizeof gb, "%.9f", (need - saved / 2 + 1073741824.0) / 1e9);  // less the CUDA context's GiB
    REQUIRE(run_cli({"plan", g.config(), "--gpus", "1", "--per-replica-batch", "64", "--memory-gb", gb, "--json",
                     js}) == kExitOk);
    const nlohmann::json tight = nlohmann::json::parse(read_text(js))["results"][0];
    CHECK(tight["fits"] == false);
    CHECK(tight["recommendation"].get<std::string>().rfind("train.recompute: blocks (", 0) == 0);
    // with train.recompute: blocks the plan's memory is the recomputed one, and nothing more to save
    REQUIRE(run_cli({"plan", g.config(), "--gpus", "1", "--per-replica-batch", "64", "--json", js, "--set",
                     "train.recompute=blocks"}) == kExitOk);
    const nlohmann::json taken = nlohmann::json::parse(read_text(js))["results"][0];
    CHECK(taken["memory_bytes"].get<double>() == doctest::Approx(need - saved));
    CHECK(taken["recompute_saving_bytes"] == 0.0);
}

TEST_CASE("cuda: a Llama-style model trains on GPU 0 as on the CPU, unfused and fused; bf16 learns" *
          doctest::test_suite("cuda")) {
    SKIP_WITHOUT_CUDA();
    GptRun g;
    g.model = kLlama;
    REQUIRE(g.train(g / "cpu") == kExitOk);
    REQUIRE(g.train(g / "gpu", {"strategy.devices=cuda:0"}) == kExitOk);
    CHECK(rel_error(GptRun::params(g / "gpu"), GptRun::params(g / "cpu")) < 1e-3);  // as the GPT's
    REQUIRE(g.train(g / "bf16", {"strategy.devices=cuda:0,0", "train.precision=bf16", "train.recompute=blocks"}) ==
            kExitOk);
    CHECK(summary(g / "bf16")["test_loss"].get<double>() < std::log(128.0));
    g.model.replace(g.model.find("fused_attention: false"), 22, "fused_attention: true");
    REQUIRE(g.train(g / "fcpu") == kExitOk);
    REQUIRE(g.train(g / "fgpu", {"strategy.devices=cuda:0"}) == kExitOk);
    CHECK(rel_error(GptRun::params(g / "fgpu"), GptRun::params(g / "fcpu")) < 1e-3);
}

TEST_CASE("cuda: a byte-level GPT trains on GPU 0 as on the CPU; replicas sharing GPU 0 match one; bf16 learns" *
          doctest::test_suite("cuda")) {
    SKIP_WITHOUT_CUDA();
    GptRun g;
    REQUIRE(g.train(g / "cpu") == kExitOk);
    REQUIRE(g.train(g / "gpu", {"strategy.devices=cuda:0"}) == kExitOk);
    const std::vector<float> gpu = GptRun::params(g / "gpu");
    CHECK(rel_error(gpu, GptRun::params(g / "cpu")) < 1e-3);  // cuBLAS's own summation order, then 8 AdamW steps
    REQUIRE(g.train(g / "two", {"strategy.devices=cuda:0,0"}) == kExitOk);
    CHECK(rel_error(GptRun::params(g / "two"), gpu) < 1e-4);
    REQUIRE(g.train(g / "bf16", {"strategy.devices=cuda:0", "train.precision=bf16"}) == kExitOk);
    CHECK(summary(g / "bf16")["test_loss"].get<double>() < std::log(128.0));
    // the fused attention kernels (one warp per row, online softmax) as the CPU's fused loops
    std::string text = kGpt;
    for (size_t at = 0; (at = text.find("heads: 4", at)) != std::string::npos; at += 8)
        text.replace(at, 8, "heads: 4, fused_attention: true");
    const std::string fused = g.config(text);
    static std::FILE* quiet = std::fopen("/dev/null", "w");
    REQUIRE(run_training(load_config(fused, {"run.output_dir=" + (g / "fcpu")}), nullptr, quiet) == kExitOk);
    REQUIRE(run_training(load_config(fused, {"run.output_dir=" + (g / "fgpu"), "strategy.devices=cuda:0"}), nullptr,
                         quiet) == kExitOk);
    CHECK(rel_error(GptRun::params(g / "fgpu"), GptRun::params(g / "fcpu")) < 1e-3);
    REQUIRE(run_training(load_config(fused, {"run.output_dir=" + (g / "fbf16"), "strategy.devices=cuda:0",
                                             "train.precision=bf16"}),
                         nullptr, quiet) == kExitOk);
    CHECK(summary(g / "fbf16")["test_loss"].get<double>() < std::log(128.0));
}
