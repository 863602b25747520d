// Hugging Face model folders (mirrored/hf_models.h): model.init_from builds the model config.json
// describes and starts from its weights - GPT-2's Conv1D layout and stacked c_attn, Llama's split
// q/k/v and gate/up, f32/bf16/f16, one file or shards, the hub's bare GPT-2 names and buffers -
// checked against an independent PyTorch forward of Hugging Face's modules (scripts/hf_reference.py);
// export writes the same folder back; fine-tuning runs on every strategy; folders that lie are
// refused, named.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "base/error.h"
#include "data/tokenizer.h"
#include "kernels/op_math.h"
#include "mirrored/adaptation.h"
#include "mirrored/config.h"
#include "mirrored/hf_models.h"
#include "mirrored/safetensors.h"
#include "mirrored/trainer.h"
#include "tests/cli.h"
#include "tests/helpers.h"
#include "tests/run_folder.h"

using namespace mirrored;
using namespace mirrored::test;
namespace fs = std::filesystem;

namespace {

constexpr const char* kLlamaLayers =
    "[{type: embedding, vocab: 96, dim: 32},"
    " {type: llama_block, heads: 4, kv_heads: 2, intermediate_size: 40, rope_theta: 500000, epsilon: 1e-05},"
    " {type: llama_block, heads: 4, kv_heads: 2, intermediate_size: 40, rope_theta: 500000, epsilon: 1e-05},"
    " {type: rmsnorm, epsilon: 1e-05}, {type: lm_head, tie_weights: false, units: 96}]";
// Qwen2's attention (biases on q, k and v, none on o_proj), Llama 3.1's rope_scaling, a tied head
constexpr const char* kQwen2Layers =
    "[{type: embedding, vocab: 96, dim: 32},"
    " {type: llama_block, heads: 4, kv_heads: 2, intermediate_size: 40, rope_theta: 1000000, epsilon: 1e-06,"
    "  bias: true, out_bias: false, rope_scaling: llama3, rope_factor: 8, rope_original_max_positions: 512},"
    " {type: llama_block, heads: 4, kv_heads: 2, intermediate_size: 40, rope_theta: 1000000, epsilon: 1e-06,"
    "  bias: true, out_bias: false, rope_scaling: llama3, rope_factor: 8, rope_original_max_positions: 512},"
    " {type: rmsnorm, epsilon: 1e-06}, {type: lm_head, tie_weights: true}]";
constexpr const char* kGpt2Layers =
    "[{type: embedding, vocab: 96, dim: 32}, {type: position_embedding, max_len: 64},"
    " {type: transformer_block, heads: 4, activation: gelu_tanh},"
    " {type: transformer_block, heads: 4, activation: gelu_tanh},"
    " {type: layernorm}, {type: lm_head}]";

Config model_config(const std::string& layers, int context = 32) {
    return load_config_text("model: {input_shape: [" + std::to_string(context) + "], layers: " + layers + "}",
                            "model.yaml", {});
}

// A model's parameters drawn at random (norms near 1), in its flat layout.
std::vector<float> random_params(const Model& m, uint64_t seed) {
    std::vector<float> p(m.flat_size(), 0.0f);
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> n(0.0f, 0.05f);
    for (const TensorInfo& t : m.tensors())
        for (size_t i = 0; i < t.count; ++i) p[t.offset + i] = (t.shape.size() == 1 ? 1.0f : 0.0f) + n(rng);
    return p;
}

// The folder hf_model_files describes, written as Hugging Face writes one: F32, BF16 (rounded to
// nearest even) or F16, in `shards` files with an index. edit: a last change to the tensors.
using Tensors = std::map<std::string, std::pair<std::vector<int>, std::vector<float>>>;
void write_folder(const std::string& dir, const HfModelFiles& files, const std::string& dtype = "F32", int shards = 1,
                  const std::function<void(Tensors&)>& edit = {}) {
    fs::create_directories(dir);
    std::ofstream(dir + "/config.json") << files.config_json;
    Tensors tensors = files.weights.tensors;
    if (edit) edit(tensors);
    nlohmann::json index = {{"metadata", nlohmann::json::object()}, {"weight_map", nlohmann::json::object()}};
    std::vector<SafetensorsBuilder> parts(static_cast<size_t>(shards));
    size_t k = 0;
    for (const auto& [name, t] : tensors) {
        SafetensorsBuilder& b = parts[k++ % size_t(shards)];
        if (dtype == "F32") {
            b.add(name, t.first, t.second.data(), t.second.size());
        } else {
            std::vector<uint16_t> half(t.second.size());
            for (size_t i = 0; i < half.size(); ++i) half[i] = bf16_bits(t.second[i]);
            b.add_bytes(name, "BF16", t.first, half.data(), half.size() * 2);
        }
        const std::string file = "model-0000" + std::to_string((k - 1) % size_t(shards) + 1) + ".safetensors";
        index["weight_map"][name] = file;
    }
    for (int s = 0; s < shards; ++s) {
        const std::string file =
            shards == 1 ? "model.safetensors" : "model-0000" + std::to_string(s + 1) + ".safetensors";
        std::ofstream out(dir + "/" + file, std::ios::binary);
        const SafetensorsBuilder& b = parts[size_t(s)];
        out << b.header({{"format", "pt"}});
        out.write(reinterpret_cast<const char*>(b.data.data()), std::streamsize(b.data.size()));
    }
    if (shards > 1) std::ofstream(dir + "/model.safetensors.index.json") << index.dump(1);
}

std::vector<float> imported(const std::string& dir, const Model& m) {
    std::vector<float> p(m.flat_size(), 0.0f);
    read_hf_weights(dir, m, p.data());
    return p;
}

// Token files of ids below 96 and a config that trains from model.init_from.
struct HfRun : TempDir {
    HfRun() {
        std::mt19937 rng(7);
        for (const char* f : {"train.bin", "val.bin"}) {
            std::vector<uint16_t> ids(std::string(f) == "val.bin" ? 1200 : 6000);
            for (auto& id : ids) id = uint16_t(rng() % 96);
            std::ofstream(*this / f, std::ios::binary)
                .write(reinterpret_cast<const char*>(ids.data()), std::streamsize(ids.size() * 2));
        }
    }
    std::string config(const std::string& folder) const {
        return write("run.yaml", "run: {name: hf, output_dir: " + *this / "run" +
                                     "}\n"
                                     "data: {dataset: tokens, root: " +
                                     path().string() +
                                     ", train: train.bin, test: val.bin, context: 32, vocab: 96}\n"
                                     "model: {init_from: " +
                                     folder +
                                     "}\n"
                                     "optimizer: {type: adamw, lr: 0.001}\n"
                                     "train: {steps: 6, global_batch_size: 8, log_every_steps: 1}\n"
                                     "checkpoint: {every_steps: 3}\n");
    }
};

}  // namespace

TEST_CASE("Hugging Face folders: what export writes, import reads back exactly (f32 bit for bit, bf16 values)") {
    TempDir t;
    for (const char* layers : {kLlamaLayers, kQwen2Layers, kGpt2Layers}) {
        const Config c = model_config(layers);
        const Model m(c.model.input_shape, c.model.layers, 1);
        const std::vector<float> p = random_params(m, 3);
        const HfModelFiles files = hf_model_files(m, p.data());
        const nlohmann::json config = nlohmann::json::parse(files.config_json);
        CAPTURE(config.dump());
        // config.json alone builds the same layers
        const std::string dir = t / ("f32_" + config["model_type"].get<std::string>());
        write_folder(dir, files);
        const std::vector<LayerSpec> built =
            load_config_text("model: {init_from: " + dir + "}", "x.yaml", {}).model.layers;
        CHECK(built == m.layers());
        const std::vector<float> back = imported(dir, m);
        for (const TensorInfo& ti : m.tensors())
            CHECK_MESSAGE(std::memcmp(back.data() + ti.offset, p.data() + ti.offset, ti.count * 4) == 0, ti.name);
        // bf16 in two shards: each value the bf16 rounding of ours; and export gives those values again
        write_folder(dir + "_bf16", files, "BF16", 2);
        const std::vector<float> half = imported(dir + "_bf16", m);
        size_t differ = 0;
        for (const TensorInfo& ti : m.tensors())
            for (size_t i = 0; i < ti.count; ++i)
                differ += half[ti.offset + i] != bf16_value(bf16_bits(p[ti.offset + i]));
        CHECK(differ == 0);
        const HfModelFiles again = hf_model_files(m, half.data());
        for (const auto& [name, v] : again.weights.tensors)
            for (size_t i = 0; i < v.second.size(); ++i)
                REQUIRE(v.second[i] == bf16_value(bf16_bits(files.weights.tensors.at(name).second[i])));
    }
    {  // a bias on o_proj alone has no Hugging Face architecture: refused, not dropped
        const Config odd = model_config(
            "[{type: embedding, vocab: 96, dim: 32}, {type: llama_block, heads: 4, intermediate_size: 40, out_bias: "
            "true}, {type: rmsnorm}, {type: lm_head, tie_weights: false, units: 96}]");
        const Model m(odd.model.input_shape, odd.model.layers, 1);
        CHECK_THROWS_WITH_AS(hf_model_files(m, random_params(m, 3).data()), doctest::Contains("o_proj alone"),
                             ConfigError);
    }
    // GPT-2's weights are stored [in, out] (Conv1D): c_attn's first row is q, k and v of input 0
    const Config c = model_config(kGpt2Layers);
    const Model m(c.model.input_shape, c.model.layers, 1);
    const std::vector<float> p = random_params(m, 4);
    const HfModelFiles files = hf_model_files(m, p.data());
    const auto& c_attn = files.weights.tensors.at("transformer.h.0.attn.c_attn.weight");
    CHECK(c_attn.first == std::vector<int>{32, 96});
    const TensorInfo& ours = *m.find("layers.2.attn.c_attn.weight");
    CHECK(ours.shape == std::vector<int>{96, 32});
    CHECK(c_attn.second[1] == p[ours.offset + 32]);  // [in 0, out 1] = ours [out 1, in 0]
}

TEST_CASE("model.init_from: GPT-2, Llama (3.1) and Qwen2 folders give an independent Hugging Face forward's logits") {
    if (!python_has("torch, numpy", "PyTorch", "python3-torch python3-numpy")) return;
    HfRun r;
    struct Case {
        std::vector<std::string> make;
    };
    const std::vector<Case> cases = {
        {{"--arch", "llama", "--intermediate", "48", "--kv-heads", "2", "--dtype", "bf16", "--shards", "2"}},
        {{"--arch", "llama", "--intermediate", "40", "--tied", "--dtype", "f32"}},
        {{"--arch", "qwen2", "--intermediate", "48", "--kv-heads", "2", "--tied", "--dtype", "bf16"}},
        {{"--arch", "llama", "--intermediate", "40", "--rope-scaling", "llama3", "--shards", "2"}},
        {{"--arch", "llama", "--intermediate", "40", "--rope-scaling", "linear"}},
        {{"--arch", "gpt2", "--hub-names", "--dtype", "f16"}},
        {{"--arch", "gpt2", "--shards", "3"}},
    };
    const size_t windows = (1200 - 1) / 32;
    int k = 0;
    for (const Case& c : cases) {
        const std::string dir = r / ("hf" + std::to_string(k++));
        std::vector<std::string> args = {repo_script("hf_reference.py"), "make", dir};
        args.insert(args.end(), c.make.begin(), c.make.end());
        std::string err;
        REQUIRE_MESSAGE(run_program(kPython, args, &err) == 0, err);
        CAPTURE(args);
        REQUIRE(run_cli({"eval", r.config(dir), "--devices", "cpu:1", "--dump-logits", r / "ours.npy", "--limit", "4",
                         "--force"},
                        {}, -1, &err, Stdout::file, r / "eval.txt") == kExitOk);
        REQUIRE_MESSAGE(
            run_program(kPython,
                        {repo_script("hf_reference.py"), "logits", dir, "--tokens", r / "val.bin", "--context", "32",
                         "--batch", std::to_string(windows), "--compare", r / "ours.npy", "--out", r / "ref.json"},
                        &err) == 0,
            err);
        const nlohmann::json ref = nlohmann::json::parse(read_text(r / "ref.json"));
        CHECK(ref["compared"] == 4 * 32 * 96);
        CHECK(ref["max_rel_diff"].get<double>() <= 1e-5);  // f32 arithmetic on the same stored values
        const std::string printed = read_text(r / "eval.txt");
        const double loss = std::stod(printed.substr(printed.find("test loss ") + 10));
        CHECK(loss == doctest::Approx(ref["loss"].get<double>()).epsilon(1e-5));
        // generate on the folder: Hugging Face's greedy loop with its key/value cache picks the same ids
        REQUIRE(run_cli({"generate", dir, "--prompt-ids", "5 17 42", "--tokens", "8", "--temperature", "0", "--context",
                         "64", "--no-echo"},
                        {}, -1, &err, Stdout::file, r / "gen.txt") == kExitOk);
        REQUIRE_MESSAGE(run_program(kPython,
                                    {repo_script("hf_reference.py"), "generate", dir, "--prompt-ids", "5 17 42",
                                     "--tokens", "8", "--threads", "1", "--out", r / "gen.json"},
                                    &err) == 0,
                        err);
        const nlohmann::json gen = nlohmann::json::parse(read_text(r / "gen.json"));
        std::string want;  // a vocabulary of 96 prints as bytes
        for (const auto& id : gen["ids"]) want += char(id.get<int>());
        CHECK(read_text(r / "gen.txt").substr(0, 8) == want);
    }
}

TEST_CASE("fine-tuning from model.init_from: 2 replicas equal 1, ZeRO and resume alike; export is read back") {
    HfRun r;
    const Config c = model_config(kLlamaLayers);
    const Model m(c.model.input_shape, c.model.layers, 1);
    write_folder(r / "hf", hf_model_files(m, random_params(m, 5).data()), "BF16", 2);
    const std::string cfg = r.config(r / "hf");
    std::string err;
    const auto train = [&](const std::string& out, std::vector<std::string> sets) {
        std::vector<std::string> args = {"train", cfg, "--output", r / out};
        for (const std::string& s : sets) args.insert(args.end(), {"--set", s});
        const int rc = run_cli(args, {}, -1, &err);
        CHECK_MESSAGE(rc == kExitOk, err);
        return summary(r / out);
    };
    const nlohmann::json one = train("one", {"strategy.devices=cpu:1"}), two = train("two", {"strategy.devices=cpu:2"}),
                         zero = train("zero", {"strategy.devices=cpu:2", "strategy.shard=gradients"});
    CHECK(two["test_loss"].get<double>() == doctest::Approx(one["test_loss"].get<double>()).epsilon(1e-5));
    CHECK(zero["test_loss"].get<double>() == doctest::Approx(one["test_loss"].get<double>()).epsilon(1e-5));
    // the run starts from the folder's weights: its first loss is the pretrained model's on that batch,
    // near the test loss of the weights as they are
    REQUIRE(run_cli({"eval", cfg, "--devices", "cpu:1"}, {}, -1, &err, Stdout::file, r / "eval.txt") == kExitOk);
    const std::string printed = read_text(r / "eval.txt");
    CHECK(printed.find("(pretrained)") != std::string::npos);
    // the checkpoint's model exported is the fine-tuned one, and import reads it back exactly
    const std::string ckpt = list_checkpoints(r / "one/checkpoints").front();
    REQUIRE(run_cli({"export", ckpt, "--names", "hf", "--out", r / "back"}, {}, -1, &err) == kExitOk);
    const std::vector<float> back = imported(r / "back", m);
    const Config run_cfg = load_config_text(read_checkpoint_metadata(ckpt).at("config"), ckpt, {});
    const CheckpointData d = read_checkpoint(ckpt, m, model_config_hash(run_cfg), model_config_summary(run_cfg));
    for (const TensorInfo& ti : m.tensors())
        CHECK(std::memcmp(back.data() + ti.offset, d.params.data() + ti.offset, ti.count * 4) == 0);
    // a resumed run (from step 3) ends where the uninterrupted one did
    fs::create_directories(r / "resumed/checkpoints");
    fs::copy_file(checkpoint_path(r / "one/checkpoints", 3), checkpoint_path(r / "resumed/checkpoints", 3));
    const nlohmann::json resumed = train("resumed", {"strategy.devices=cpu:1"});
    CHECK(resumed["test_loss"].get<double>() == one["test_loss"].get<double>());
}

TEST_CASE("model.init_from: a folder that lies is refused, naming the file, tensor or key; nothing else read") {
    HfRun r;
    const Config c = model_config(kLlamaLayers);
    const Model m(c.model.input_shape, c.model.layers, 1);
    const HfModelFiles files = hf_model_files(m, random_params(m, 6).data());
    const auto refused = [&](const std::string& name, const std::function<void(const std::string& dir)>& make, int code,
                             const std::string& says) {
        const std::string dir = r / name;
        make(dir);
        std::string err;
        CHECK_MESSAGE(run_cli({"eval", r.config(dir), "--devices", "cpu:1"}, {}, -1, &err) == code, name);
        CHECK_MESSAGE(err.find(says) != std::string::npos, (name + ": " + err));
        CHECK_MESSAGE(err.find("internal") == std::string::npos, err);
    };
    const auto edited = [&](const std::function<void(Tensors&)>& edit, int shards = 1) {
        return [&, edit, shards](const std::string& dir) { write_folder(dir, files, "F32", shards, edit); };
    };
    const auto with_config = [&](const std::function<void(nlohmann::json&)>& edit) {
        return [&, edit](const std::string& dir) {
            write_folder(dir, files);
            nlohmann::json j = nlohmann::json::parse(files.config_json);
            edit(j);
            std::ofstream(dir + "/config.json") << j.dump();
        };
    };
    refused("missing", edited([](Tensors& t) { t.erase("model.layers.1.mlp.up_proj.weight"); }), kExitCheckpoint,
            "tensor model.layers.1.mlp.up_proj.weight [40, 32] is missing");
    refused("extra", edited([](Tensors& t) {
                t["model.layers.2.mlp.up_proj.weight"] = {{1}, {0.0f}};
            }),
            kExitCheckpoint, "tensor model.layers.2.mlp.up_proj.weight belongs to no layer");
    refused("shape", edited([](Tensors& t) {
                t["model.norm.weight"] = {{33}, std::vector<float>(33, 1.0f)};
            }),
            kExitCheckpoint, "tensor model.norm.weight is [33], config.json's model has [32]");
    refused("nan", edited([](Tensors& t) { t["model.norm.weight"].second[5] = std::nanf(""); }), kExitCheckpoint,
            "tensor model.norm.weight holds a non-finite value");
    refused("arch", with_config([](nlohmann::json& j) { j["model_type"] = "bert"; }), kExitUsage,
            "model_type: 'bert': mirrored builds gpt2, llama, mistral and qwen2 models");
    refused("qwen2_window", with_config([](nlohmann::json& j) {
                j["model_type"] = "qwen2";
                j["use_sliding_window"] = true;
            }),
            kExitUsage, "use_sliding_window: sliding-window attention is not supported");
    refused("rope_yarn", with_config([](nlohmann::json& j) {
                j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
            }),
            kExitUsage, "config.json: rope_scaling: rope_type 'yarn' is not supported");
    refused("rope_factor", with_config([](nlohmann::json& j) {
                j["rope_scaling"] = {{"rope_type", "llama3"}};
            }),
            kExitUsage, "config.json: rope_scaling: factor: missing");
    refused("rope_bands", with_config([](nlohmann::json& j) {
                j["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 4.0}};
            }),
            kExitUsage, "rope_high_freq_factor: must be above rope_low_freq_factor");
    refused("heads", with_config([](nlohmann::json& j) { j["num_key_value_heads"] = 3; }), kExitUsage,
            "num_key_value_heads: num_attention_heads is not a multiple of it");
    refused("layers", with_config([](nlohmann::json& j) { j["num_hidden_layers"] = "2"; }), kExitUsage,
            "num_hidden_layers: expected an integer in [1, 4096], got \"2\"");
    refused(
        "no_config", [&](const std::string& dir) { fs::create_directories(dir); }, kExitUsage, "config.json");
    refused("good", with_config([](nlohmann::json&) {}), kExitOk, "");  // the control: unedited, it loads
    refused(
        "truncated",
        [&](const std::string& dir) {
            write_folder(dir, files, "F32", 2);
            fs::resize_file(dir + "/model-00002.safetensors", fs::file_size(dir + "/model-00002.safetensors") - 6);
        },
        kExitCheckpoint, "model-00002.safetensors: truncated");
    refused(
        "shard_missing",
        [&](const std::string& dir) {
            write_folder(dir, files, "F32", 2);
            fs::remove(dir + "/model-00002.safetensors");
        },
        kExitCheckpoint, "model-00002.safetensors, which is missing");
    refused(
        "no_weights",
        [&](const std::string& dir) {
            write_folder(dir, files);
            fs::remove(dir + "/model.safetensors");
        },
        kExitCheckpoint, "no model.safetensors nor model.safetensors.index.json");
    // a tied head saved anyway is read when it is the embedding, refused when it is not
    Config tied_cfg = model_config(
        "[{type: embedding, vocab: 96, dim: 32}, {type: llama_block, heads: 4, intermediate_size: 40},"
        " {type: rmsnorm}, {type: lm_head}]");
    const Model tied(tied_cfg.model.input_shape, tied_cfg.model.layers, 1);
    const HfModelFiles tied_files = hf_model_files(tied, random_params(tied, 7).data());
    write_folder(r / "tied_ok", tied_files, "F32", 1,
                 [](Tensors& t) { t["lm_head.weight"] = t.at("model.embed_tokens.weight"); });
    CHECK_NOTHROW(imported(r / "tied_ok", tied));
    write_folder(r / "tied_bad", tied_files, "F32", 1, [](Tensors& t) {
        t["lm_head.weight"] = t.at("model.embed_tokens.weight");
        t["lm_head.weight"].second[0] += 1;
    });
    CHECK_THROWS_WITH_AS(imported(r / "tied_bad", tied), doctest::Contains("lm_head.weight differs from the embedding"),
                         CheckpointError);
}

namespace {

// A model's initial adapters (LoRA's A and B, as init_params draws them) under mirrored's names.
SafetensorsFile initial_adapters(const Model& m) {
    auto dev = make_cpu_device(0);
    DeviceBuffer<float> p(*dev, m.flat_size());
    m.init_params(*dev, dev->compute_stream(), p.data());
    dev->synchronize();
    const std::vector<float> host = download(*dev, p);
    SafetensorsFile f;
    for (const TensorInfo& t : m.tensors())
        if (t.name.find(".lora_") != std::string::npos)
            f.tensors[t.name] = {
                t.shape, std::vector<float>(host.begin() + long(t.offset), host.begin() + long(t.offset + t.count))};
    return f;
}

}  // namespace

TEST_CASE("LoRA equals PEFT's arithmetic step for step (PyTorch); only the adapters train, the base stays bit-exact") {
    if (!python_has("torch, numpy", "PyTorch", "python3-torch python3-numpy")) return;
    for (const char* layers : {kLlamaLayers, kGpt2Layers}) {
        const bool gpt2 = std::string(layers) == kGpt2Layers;
        CAPTURE(gpt2);
        HfRun r;
        // one batch of 4 windows is the whole training set: every step sees the same batch
        std::mt19937 rng(3);
        std::vector<uint16_t> ids(4 * 32 + 1);
        for (auto& id : ids) id = uint16_t(rng() % 96);
        std::ofstream(r / "train.bin", std::ios::binary)
            .write(reinterpret_cast<const char*>(ids.data()), std::streamsize(ids.size() * 2));
        const Config c = model_config(layers);
        const Model m(c.model.input_shape, c.model.layers, 1);
        const std::vector<float> base = random_params(m, 8);
        write_folder(r / "hf", hf_model_files(m, base.data()));
        const std::string targets = gpt2 ? "[c_attn, c_proj]" : "[q_proj, v_proj, down_proj]";
        std::string text = read_text(r.config(r / "hf"));
        text.replace(text.find("model: {init_from: "), 19,
                     "model: {lora: {rank: 4, alpha: 8, targets: " + targets + "}, init_from: ");
        text.replace(text.find("steps: 6, global_batch_size: 8"), 30, "steps: 20, global_batch_size: 4");
        text.replace(text.find("lr: 0.001"), 9, "lr: 0.01");
        const std::string cfg_path = r.write("lora.yaml", text);
        const Config cfg = load_config(cfg_path, {"model.input_shape=[32]"});
        const auto lora = build_model(cfg);
        CHECK(lora->trainable_size() < m.trainable_size() / 4);
        write_safetensors(r / "adapters.safetensors", initial_adapters(*lora));
        std::string err;
        REQUIRE_MESSAGE(run_cli({"train", cfg_path, "--devices", "cpu:1"}, {}, -1, &err) == kExitOk, err);
        REQUIRE_MESSAGE(run_program(kPython,
                                    {repo_script("hf_reference.py"),
                                     "lora",
                                     r / "hf",
                                     "--adapters",
                                     r / "adapters.safetensors",
                                     "--tokens",
                                     r / "train.bin",
                                     "--context",
                                     "32",
                                     "--batch",
                                     "4",
                                     "--steps",
                                     "20",
                                     "--rank",
                                     "4",
                                     "--alpha",
                                     "8",
                                     "--lr",
                                     "0.01",
                                     "--out",
                                     r / "ref.json"},
                                    &err) == 0,
                        err);
        const nlohmann::json want = nlohmann::json::parse(read_text(r / "ref.json"));
        CHECK(want["adapters"] == 6);
        std::vector<double> losses;
        for (const auto& j : metrics(r / "run"))
            if (j["type"] == "train") losses.push_back(j["loss"]);
        REQUIRE(losses.size() == 20);
        for (size_t i = 0; i < losses.size(); ++i) {
            CAPTURE(i);
            CHECK(losses[i] == doctest::Approx(want["losses"][i].get<double>()).epsilon(1e-4));
        }
        CHECK(losses.back() < losses.front() - 0.05);  // it learns
        // the checkpoint: the base as the folder holds it, bit for bit; optimizer state for the adapters only
        const std::string ckpt = list_checkpoints(r / "run/checkpoints").front();
        const SafetensorsFile f = read_safetensors(ckpt, true);
        for (const TensorInfo& t : m.tensors())
            CHECK_MESSAGE(std::memcmp(f.tensors.at(t.name).second.data(), base.data() + t.offset, t.count * 4) == 0,
                          t.name);
        size_t states = 0;
        for (const auto& [name, t] : f.tensors)
            if (name.rfind("optimizer.", 0) == 0) {
                CHECK_MESSAGE(name.find(".lora_") != std::string::npos, name);
                ++states;
            }
        CHECK(states == 2 * 2 * 6);  // exp_avg and exp_avg_sq of A and B, three modules x two layers
        // export: PEFT's adapter files, or the adapters merged into a whole model that scores as the run
        REQUIRE(run_cli({"export", ckpt, "--names", "hf", "--out", r / "peft"}, {}, -1, &err) == kExitOk);
        const nlohmann::json adapter_config = nlohmann::json::parse(read_text(r / "peft/adapter_config.json"));
        CHECK(adapter_config["r"] == 4);
        CHECK(adapter_config["lora_alpha"] == 8.0);
        CHECK(adapter_config["fan_in_fan_out"] == gpt2);
        CHECK(adapter_config["base_model_name_or_path"] == r / "hf");
        const SafetensorsFile peft = read_safetensors(r / "peft/adapter_model.safetensors", false);
        CHECK(peft.tensors.size() == 12);
        const std::string q = gpt2 ? "base_model.model.transformer.h.1.attn.c_attn.lora_A.weight"
                                   : "base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight";
        REQUIRE(peft.tensors.count(q));
        CHECK(peft.tensors.at(q).first == std::vector<int>{4, 32});
        CHECK(peft.tensors.at(q).second ==
              f.tensors.at(gpt2 ? "layers.3.attn.c_attn.lora_A.weight" : "layers.2.self_attn.q_proj.lora_A.weight")
                  .second);
        REQUIRE(run_cli({"export", ckpt, "--names", "hf", "--merge", "--out", r / "merged"}, {}, -1, &err) == kExitOk);
        const std::vector<float> merged = imported(r / "merged", m);
        size_t changed = 0, off = 0;
        for (const auto& [weight, slices] : lora->adaptation().lora)
            for (const LoraSlice& sl : slices) {
                const TensorInfo& w = *m.find(weight);
                const auto& A = f.tensors.at(sl.name + ".lora_A.weight").second;
                const auto& B = f.tensors.at(sl.name + ".lora_B.weight").second;
                const size_t in = w.count / size_t(w.shape[0]);
                for (size_t i = 0; i < size_t(sl.rows); ++i)
                    for (size_t j = 0; j < in; ++j) {
                        double ba = 0;
                        for (size_t k = 0; k < 4; ++k) ba += double(B[i * 4 + k]) * A[k * in + j];
                        const size_t at = w.offset + (size_t(sl.row) + i) * in + j;
                        const double want_w = base[at] + 2.0 * ba;  // alpha / rank = 2
                        off += std::abs(merged[at] - want_w) > 1e-6 * (1 + std::abs(want_w));
                        changed += merged[at] != base[at];
                    }
            }
        CHECK(off == 0);
        CHECK(changed > 0);
        // the merged folder scores as the adapted model: its own run's test loss
        std::string merged_cfg = read_text(r.config(r / "merged"));
        REQUIRE(run_cli({"eval", r.write("merged.yaml", merged_cfg), "--devices", "cpu:1"}, {}, -1, &err, Stdout::file,
                        r / "eval.txt") == kExitOk);
        const std::string printed = read_text(r / "eval.txt");
        CHECK(std::stod(printed.substr(printed.find("test loss ") + 10)) ==
              doctest::Approx(summary(r / "run")["test_loss"].get<double>()).epsilon(1e-5));
    }
}

TEST_CASE("LoRA and model.freeze: replicas, ZeRO, bf16 and recompute agree; frozen tensors cost no gradient memory") {
    HfRun r;
    const Config c = model_config(kLlamaLayers);
    const Model m(c.model.input_shape, c.model.layers, 1);
    const std::vector<float> base = random_params(m, 9);
    write_folder(r / "hf", hf_model_files(m, base.data()), "BF16");
    std::string err;
    const auto train = [&](const std::string& out, std::vector<std::string> sets) {
        std::vector<std::string> args = {"train", r.config(r / "hf"), "--output", r / out};
        for (const std::string& s : sets) args.insert(args.end(), {"--set", s});
        CHECK_MESSAGE(run_cli(args, {}, -1, &err) == kExitOk, err);
        return summary(r / out);
    };
    const std::string lora = "model.lora={rank: 4, alpha: 8, targets: [q_proj, k_proj, v_proj, o_proj, up_proj]}";
    const nlohmann::json one = train("one", {lora, "strategy.devices=cpu:1"});
    int k = 0;
    for (const std::vector<std::string>& sets :
         {std::vector<std::string>{"strategy.devices=cpu:2"},
          {"strategy.devices=cpu:2", "strategy.shard=gradients", "strategy.bucket_mb=0.001"},
          {"strategy.devices=cpu:2", "strategy.shared_parameters=true"},
          {"strategy.devices=cpu:1", "train.recompute=blocks", "train.grad_accumulation_steps=2"}}) {
        CAPTURE(sets.back());
        std::vector<std::string> all = sets;
        all.push_back(lora);
        const nlohmann::json s = train("run" + std::to_string(k++), all);
        CHECK(s["steps"] == 6);
        CHECK(s["test_loss"].get<double>() == doctest::Approx(one["test_loss"].get<double>()).epsilon(1e-5));
    }
    {  // lora dropout (PEFT's lora_dropout): it changes training; N replicas, recompute and accumulation
        // still train as one replica does, the masks being functions of the global sample
        const std::string dropped =
            "model.lora={rank: 4, alpha: 8, dropout: 0.25, targets: [q_proj, k_proj, v_proj, o_proj, up_proj]}";
        const nlohmann::json d1 = train("drop1", {dropped, "strategy.devices=cpu:1"});
        CHECK(std::abs(d1["train_loss"].get<double>() - one["train_loss"].get<double>()) > 1e-6);
        for (const std::vector<std::string>& sets :
             {std::vector<std::string>{"strategy.devices=cpu:2"},
              {"strategy.devices=cpu:1", "train.recompute=blocks", "train.grad_accumulation_steps=2"}}) {
            CAPTURE(sets.back());
            std::vector<std::string> all = sets;
            all.push_back(dropped);
            const nlohmann::json s = train("drop" + std::to_string(k++), all);
            CHECK(s["test_loss"].get<double>() == doctest::Approx(d1["test_loss"].get<double>()).epsilon(1e-5));
            CHECK(s["train_loss"].get<double>() == doctest::Approx(d1["train_loss"].get<double>()).epsilon(1e-5));
        }
        // an epoch's short last batch (181 windows, batches of 8: 5 left) over 4 replicas: one
        // replica's shard is empty in that step
        const std::vector<std::string> epoch = {dropped, "train.steps=0", "train.epochs=1", "data.drop_last=false"};
        std::vector<std::string> on1 = epoch, on4 = epoch;
        on1.push_back("strategy.devices=cpu:1");
        on4.push_back("strategy.devices=cpu:4");
        const nlohmann::json short1 = train("drop_short1", on1), short4 = train("drop_short4", on4);
        CHECK(short4["steps"] == short1["steps"]);
        CHECK(short4["test_loss"].get<double>() == doctest::Approx(short1["test_loss"].get<double>()).epsilon(1e-5));
    }
    {  // simulated GPUs allocate the plan to the byte: gradients and optimizer state for the adapters only
        SimScope sim(0);
        for (const char* precision : {"fp32", "bf16"}) {
            CAPTURE(precision);
            const nlohmann::json s = train(
                std::string("sim_") + precision,
                {"model.lora={rank: 4, alpha: 8, dropout: 0.1, targets: [q_proj, k_proj, v_proj, o_proj, up_proj]}",
                 "strategy.devices=sim:0,1", std::string("train.precision=") + precision});
            CHECK(s["memory_plan_bytes"] == s["memory_per_replica_bytes"]);
        }
    }
    // model.freeze: the embedding and the first block kept as they are, the rest trained
    const nlohmann::json frozen = train("frozen", {"model.freeze=[layers.0.*, layers.1.*]", "strategy.devices=cpu:2"});
    const SafetensorsFile f = read_safetensors(list_checkpoints(r / "frozen/checkpoints").front(), true);
    const std::vector<float> start = imported(r / "hf", m);
    for (const TensorInfo& t : m.tensors()) {
        const bool same = std::memcmp(f.tensors.at(t.name).second.data(), start.data() + t.offset, t.count * 4) == 0;
        CHECK_MESSAGE(same == (t.name.rfind("layers.0.", 0) == 0 || t.name.rfind("layers.1.", 0) == 0), t.name);
        CHECK(f.tensors.count("optimizer.exp_avg." + t.name) == !same);
    }
    // GPT-2 small's shape (12 x 768, 50,257 tokens) with rank 8 on c_attn: gradients and optimizer
    // state are 0.24% of full fine-tuning's
    TempDir g;
    std::ofstream(g / "config.json") << R"({"model_type": "gpt2", "n_embd": 768, "n_head": 12, "n_layer": 12,
        "n_positions": 1024, "vocab_size": 50257})";
    Config small = load_config_text("model: {init_from: " + g.path().string() + ", input_shape: [64]}", "x.yaml", {});
    const auto full = build_model(small);
    small.model.lora = {8, 16, 0.0, {"c_attn"}};
    const auto adapted = build_model(small);
    CHECK(full->param_count() == 124439808);
    CHECK(adapted->param_count() == 12 * (8 * 768 + 3 * 768 * 8));
    CHECK(double(adapted->grad_size()) / double(full->grad_size()) < 0.003);
    CHECK(adapted->frozen_count() == full->param_count());
}

TEST_CASE("LoRA and model.freeze refuse what they cannot do, naming the key") {
    HfRun r;
    const Config c = model_config(kGpt2Layers);
    const Model m(c.model.input_shape, c.model.layers, 1);
    write_folder(r / "hf", hf_model_files(m, random_params(m, 10).data()));
    const auto refused = [&](const std::string& set, const std::string& says) {
        std::string err;
        CHECK(run_cli({"train", r.config(r / "hf"), "--set", set}, {}, -1, &err) == kExitUsage);
        CHECK_MESSAGE(err.find(says) != std::string::npos, err);
    };
    refused("model.lora={rank: 4, targets: [q_proj]}",
            "model.lora.targets: 'q_proj' names no module of the model (its modules: c_attn, c_fc, c_proj)");
    refused("model.lora={rank: 4, targets: [c_fc]}", "LoRA adds to a product before its activation");
    refused("model.lora={rank: 4}", "model.lora.targets: required");
    refused("model.freeze=['*']", "model.freeze: the model has nothing left to train");
    refused("model.freeze=[layers.9.*]", "model.freeze: 'layers.9.*' matches no tensor");
}

TEST_CASE("cuda: LoRA on a pretrained Llama trains on GPU 0 as on the CPU; two replicas on it match; bf16 learns" *
          doctest::test_suite("cuda")) {
    SKIP_WITHOUT_CUDA();
    HfRun r;
    const Config c = model_config(kLlamaLayers);
    const Model m(c.model.input_shape, c.model.layers, 1);
    write_folder(r / "hf", hf_model_files(m, random_params(m, 11).data()), "BF16");
    const std::string cfg = r.config(r / "hf");
    static std::FILE* quiet = std::fopen("/dev/null", "w");
    const auto train = [&](const std::string& out, const std::string& devices, const std::string& precision) {
        REQUIRE(run_training(
                    load_config(cfg, {"run.output_dir=" + (r / out), "strategy.devices=" + devices,
                                      "train.precision=" + precision,
                                      "model.lora={rank: 4, alpha: 8, dropout: 0.2, targets: [q_proj, v_proj, o_proj, "
                                      "gate_proj, down_proj]}",
                                      "optimizer.lr=0.01"}),
                    nullptr, quiet) == kExitOk);
        const SafetensorsFile f = read_safetensors(list_checkpoints(r / (out + "/checkpoints")).front(), true);
        std::vector<float> adapters;  // the trained ones, in name order
        for (const auto& [name, t] : f.tensors)
            if (name.find(".lora_") != std::string::npos && name.rfind("optimizer.", 0) != 0)
                adapters.insert(adapters.end(), t.second.begin(), t.second.end());
        return adapters;
    };
    const std::vector<float> cpu = train("cpu", "cpu:1", "fp32"), gpu = train("gpu", "cuda:0", "fp32");
    CHECK(rel_error(gpu, cpu) < 1e-3);  // cuBLAS's summation order, then 6 AdamW steps
    CHECK(rel_error(train("two", "cuda:0,0", "fp32"), gpu) < 1e-4);
    train("bf16", "cuda:0", "bf16");
    CHECK(summary(r / "bf16")["test_loss"].get<double>() < summary(r / "cpu")["test_loss"].get<double>() + 0.05);
}

TEST_CASE("generate on a Hugging Face folder: stops at config.json's eos_token_id; top-p near 0 is greedy") {
    HfRun r;
    const Config c = model_config(kLlamaLayers);
    const Model m(c.model.input_shape, c.model.layers, 1);
    HfModelFiles files = hf_model_files(m, random_params(m, 12).data());
    write_folder(r / "hf", files);
    const auto gen = [&](std::vector<std::string> more) {
        std::vector<std::string> args = {"generate",  r / "hf", "--prompt-ids", "5 17 42", "--tokens",    "12",
                                         "--context", "32",     "--no-echo",    "--json",  r / "gen.json"};
        args.insert(args.end(), more.begin(), more.end());
        std::string err;
        REQUIRE_MESSAGE(run_cli(args, {}, -1, &err, Stdout::file, r / "gen.txt") == kExitOk, err);
        return read_text(r / "gen.txt");
    };
    const std::string greedy = gen({"--temperature", "0"});
    REQUIRE(greedy.size() == 13);  // 12 bytes and the newline
    CHECK(gen({"--temperature", "1", "--top-p", "0.000001", "--seed", "7"}) == greedy);
    CHECK(gen({"--temperature", "1", "--top-p", "0.9", "--seed", "7"}).size() == 13);
    // the last token that first appears late is the end of the text: what comes before it is printed
    size_t k = 0;
    for (size_t i = 0; i < 12; ++i)
        if (greedy.find(greedy[i]) == i) k = i;
    nlohmann::json config = nlohmann::json::parse(files.config_json);
    config["eos_token_id"] = nlohmann::json::array({int(static_cast<unsigned char>(greedy[k])), 0});
    std::ofstream(r / "hf/config.json") << config.dump();
    CHECK(gen({"--temperature", "0"}) == greedy.substr(0, k) + "\n");
    CHECK(nlohmann::json::parse(read_text(r / "gen.json"))["stopped_at_end_of_text"] == true);
    CHECK(gen({"--temperature", "0", "--no-stop"}) == greedy);
}

TEST_CASE("generate with a SentencePiece folder: <s> first, the text as decoded whole (its spaces kept)") {
    if (!python_has("sentencepiece", "Python's sentencepiece", "python3-sentencepiece")) return;
    HfRun r;
    std::string corpus;
    for (int i = 0; i < 400; ++i)
        corpus += "The cat sat on the mat number " + std::to_string(i * 7919 % 1000) + ", naïve café déjà vu.\n";
    const std::string script =
        "import sys, sentencepiece as spm\n"
        "spm.SentencePieceTrainer.train(input=sys.argv[1], model_prefix=sys.argv[2], vocab_size=400,\n"
        "    model_type='bpe', byte_fallback=True, character_coverage=1.0, num_threads=1, minloglevel=2)\n";
    std::string err;
    REQUIRE_MESSAGE(run_program(kPython, {"-c", script, r.write("corpus.txt", corpus), r / "spm"}, &err) == 0, err);
    const Config c = model_config(
        "[{type: embedding, vocab: 400, dim: 32}, {type: llama_block, heads: 4, kv_heads: 2, intermediate_size: 40},"
        " {type: rmsnorm}, {type: lm_head, tie_weights: false, units: 400}]");
    const Model m(c.model.input_shape, c.model.layers, 1);
    write_folder(r / "hf", hf_model_files(m, random_params(m, 13).data()));
    fs::copy_file(r / "spm.model", r / "hf/tokenizer.model");
    REQUIRE_MESSAGE(run_cli({"generate", r / "hf", "--prompt", "The cat", "--tokens", "24", "--temperature", "1.5",
                             "--seed", "3", "--no-stop", "--context", "32", "--json", r / "gen.json"},
                            {}, -1, &err, Stdout::file, r / "gen.txt") == kExitOk,
                    err);
    const nlohmann::json j = nlohmann::json::parse(read_text(r / "gen.json"));
    const std::unique_ptr<Tokenizer> sp = load_tokenizer(r / "hf");
    std::vector<uint32_t> prompt, all;
    for (int id : j["prompt_ids"]) prompt.push_back(uint32_t(id));
    all = prompt;
    for (int id : j["ids"]) all.push_back(uint32_t(id));
    REQUIRE(!prompt.empty());
    CHECK(prompt[0] == *sp->begin_of_text());
    CHECK(j["ids"].size() == 24);
    const std::string whole = sp->decode(all), before = sp->decode(prompt);
    REQUIRE(whole.rfind(before, 0) == 0);
    CHECK(read_text(r / "gen.txt") == "The cat" + whole.substr(before.size()) + "\n");
}
