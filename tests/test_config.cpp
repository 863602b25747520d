// Configuration: every kind of error names the file and line (or the --set) and the key path;
// defaults and the printed configuration round-trip.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>

#include "base/error.h"
#include "mirrored/config.h"
#include "mirrored/model.h"
#include "mirrored/optimizer.h"
#include "tests/helpers.h"

using namespace mirrored;
namespace fs = std::filesystem;

namespace {

std::string write_config(const std::string& name, const std::string& text) {
    static const test::TempDir dir;
    return dir.write(name, text);
}

const char* kGood = R"(run: {name: t, seed: 2}
strategy: {devices: "cpu:2", bucket_mb: 1}
data: {dataset: synthetic, input_shape: [12], classes: 3, train_samples: 100, test_samples: 20}
model:
  layers:
    - {type: dense, units: 8, activation: gelu}
    - {type: dropout, rate: 0.2}
    - {type: dense, units: 3}
optimizer: {type: adamw, lr: 0.001, betas: [0.9, 0.99], schedule: {type: cosine, warmup_steps: 3}}
train: {epochs: 2, global_batch_size: 10}
)";

void expect_error(const std::string& text, const std::vector<std::string>& sets, const std::string& want) {
    const std::string path = write_config("e.yaml", text);
    CAPTURE(want);
    CHECK_THROWS_WITH_AS(load_config(path, sets), doctest::Contains(want.c_str()), ConfigError);
}

}  // namespace

TEST_CASE("config: a good file loads with defaults filled in") {
    const Config c = load_config(write_config("good.yaml", kGood), {});
    CHECK(c.run.name == "t");
    CHECK(c.run.output_dir == "runs/t");
    CHECK(c.strategy.devices == "cpu:2");
    CHECK(c.strategy.cross_device_ops == "ring");
    CHECK(c.strategy.allreduce_dtype == DType::f32);
    // train.* keys the strategy applies reach it
    const Config p =
        load_config(write_config("prec.yaml", kGood),
                    {"train.precision=fp16", "train.loss_scale_growth_interval=7", "strategy.allreduce_dtype=bf16"});
    CHECK(p.strategy.precision == Precision::fp16);
    CHECK(p.strategy.loss_scale_growth_interval == 7);
    CHECK(p.strategy.allreduce_dtype == DType::bf16);
    CHECK(c.data.loader_threads == 0);  // auto
    CHECK(load_config(write_config("lt.yaml", kGood), {"data.loader_threads=3"}).data.loader_threads == 3);
    CHECK(load_config(write_config("lt.yaml", kGood), {"data.loader_threads=auto"}).data.loader_threads == 0);
    CHECK(c.model.layers.size() == 3);
    CHECK(c.model.layers[0].field("activation") == "gelu");
    CHECK(c.model.layers[0].field("init") == "he_uniform");
    CHECK(c.model.layers[2].field("init") == "glorot_uniform");
    CHECK(c.optimizer.type == "adamw");
    CHECK(optimizer_options(c.optimizer)->fields()[0].second == "[0.9, 0.99]");  // betas
    CHECK(c.train.log_every_steps == 100);
    CHECK(c.checkpoint.resume == "auto");
}

TEST_CASE("config: unknown keys are rejected with file, line and the known keys") {
    std::string t = kGood;
    t += "checkpoint: {every_step: 5}\n";
    expect_error(t, {},
                 "e.yaml:11: checkpoint.every_step: unknown key (known here: every_epochs, every_minutes, every_steps, "
                 "keep, resume)");
    expect_error(std::string(kGood) + "extra: 1\n", {}, "e.yaml:11: extra: unknown key");
    std::string layer = kGood;
    layer.replace(layer.find("{type: dropout, rate: 0.2}"), 26, "{type: dropout, units: 3}");
    expect_error(layer, {}, "e.yaml:7: model.layers.1.units: unknown key (known here: rate, type)");
}

TEST_CASE("config: wrong types and out-of-range values name the key and what is expected") {
    std::string t = kGood;
    expect_error(t + "checkpoint: {keep: many}\n", {}, "checkpoint.keep: expected an integer in [1, 1000], got 'many'");
    expect_error(t + "checkpoint: {keep: 0}\n", {}, "checkpoint.keep: expected an integer in [1, 1000], got 0");
    expect_error(t, {"optimizer.lr=-1"},
                 "--set optimizer.lr=-1: optimizer.lr: expected a number in (0, 1e+06], got -1");
    expect_error(t, {"strategy.cross_device_ops=tree"},
                 "expected one of ring, direct, nccl, reduce_to_one, auto, got 'tree'");
    expect_error(t, {"data.loader_threads=0"}, "data.loader_threads: expected an integer in [1, 256], got 0");
    expect_error(t, {"data.loader_threads=lots"},
                 "data.loader_threads: expected auto or an integer in [1, 256], got 'lots'");
    expect_error(t, {"strategy.allreduce_dtype=fp16"},
                 "strategy.allreduce_dtype: expected one of fp32, bf16, got 'fp16'");
    expect_error(t, {"train.precision=fp8"}, "train.precision: expected one of fp32, tf32, bf16, fp16");
    expect_error(t, {"model.layers=5"}, "model.layers: expected a list");
    expect_error(t, {"data.augment.horizontal_flip=maybe"}, "expected true or false");
    expect_error(t, {"optimizer.betas=[0.9]"}, "optimizer.betas: expected two numbers");
    expect_error(t, {"model.layers.1.rate=1.5"}, "model.layers.1.rate: expected a number in [0, 0.999]");
    expect_error(t, {"data.dataset=mnist"}, "data.dataset: expected one of idx, cifar10, csv, npy, synthetic, tokens");
    expect_error("run: [1, 2]\n", {}, "run: expected a mapping");
    expect_error("model:\n  layers:\n    - {type: dense}\n", {}, "model.layers.0.units: required for a dense layer");
}

TEST_CASE("config: --set reaches any key and list items; its errors say --set") {
    const std::string path = write_config("good.yaml", kGood);
    const Config c = load_config(path, {"model.layers.0.units=64", "run.seed=9", "data.input_shape=[3, 4]"});
    CHECK(c.model.layers[0].field("units") == "64");
    CHECK(c.run.seed == 9);
    CHECK(data_format_options(c.data)->fields()[0] == std::pair<std::string, std::string>{"input_shape", "[3, 4]"});
    expect_error(kGood, {"model.layers.0.units=abc"},
                 "--set model.layers.0.units=abc: model.layers.0.units: expected an integer");
    expect_error(kGood, {"model.layers.7.units=3"}, "'7' is not an index of the 3-element list");
    expect_error(kGood, {"train.epochz=3"}, "--set train.epochz=3: train.epochz: unknown key");
    expect_error(kGood, {"noequals"}, "expected key.path=value");
    expect_error(kGood, {"run.name.x=1"}, "is inside a value that is not a mapping");
}

TEST_CASE("config: unreadable files and YAML syntax errors") {
    CHECK_THROWS_WITH_AS(load_config("/nonexistent/x.yaml", {}), doctest::Contains("/nonexistent/x.yaml: cannot open"),
                         ConfigError);
    expect_error("run: {name: [unclosed\n", {}, "invalid YAML");
    // nesting beyond the YAML parser's depth guard: said so, with the line
    expect_error("run: {name: x}\nmodel: " + std::string(5000, '[') + std::string(5000, ']') + "\n", {},
                 "e.yaml:2: nested more than");
    // an empty list of CIFAR-10 files is not the default list
    std::string cifar = kGood;
    cifar.replace(cifar.find("data: {"), cifar.find("\nmodel:") - cifar.find("data: {"),
                  "data: {dataset: cifar10, train: {files: []}}");
    expect_error(cifar, {}, "data.train.files: expected at least one batch file");
    const test::TempDir d;
    fs::create_directories(d.path() / "dir.yaml");
    CHECK_THROWS_WITH_AS(load_config(d / "dir.yaml", {}), doctest::Contains("dir.yaml: is a directory"), ConfigError);
    CHECK_THROWS_WITH_AS(load_config("/dev/zero", {}), doctest::Contains("/dev/zero: is a character device"),
                         ConfigError);
}

TEST_CASE("config: hostile and careless input is refused with the place and the reason") {
    const std::string t = kGood;
    expect_error(t + "train: {epochs: 3}\n", {}, "e.yaml:11: train: the key appears twice (lines 10 and 11)");
    expect_error("run: {name: a, name: b}\n", {}, "run.name: the key appears twice");
    expect_error(t + "checkpoint: {keep: }\n", {}, "checkpoint.keep: expected a value, got nothing");
    expect_error(t + "run2: {}\n", {}, "run2: unknown key");
    expect_error(t, {"train.steps="}, "--set train.steps=: expected a value after '='");
    expect_error(t, {"train.steps.=5"}, "is not a key path");
    expect_error(t, {".train.steps=5"}, "is not a key path");
    expect_error(t, {"train..steps=5"}, "is not a key path");
    expect_error(t, {"model.layers.99999999999.units=3"}, "is not an index of the 3-element list");
    expect_error(t, {"strategy.devices=~"}, "expected a value, got nothing");
    expect_error(t, {"run.output_dir=''"}, "run.output_dir: expected a non-empty string");
    expect_error(t, {"checkpoint.resume=\"\""}, "checkpoint.resume: expected a non-empty string");
    expect_error("run: {name: \"a\\x01b\"}\n", {}, "e.yaml:1: run.name: 'a\\x01b' contains a control character");
    expect_error("run: {name: \"a\\0b\"}\n", {}, "contains a control character");
    expect_error(std::string("run: {name: caf\xe9}\n"), {}, "run.name: 'caf\\xe9' is not valid UTF-8");
    expect_error(t, {std::string("run.output_dir=/tmp/\xff")}, "is not valid UTF-8");
    std::string deep = "run: ";
    for (int i = 0; i < 40; ++i) deep += "[";
    expect_error(deep + std::string(40, ']') + "\n", {}, "nested more than 32 levels");
    // "billion laughs": nine aliases of the list before, twelve times - 9^12 values to walk
    std::string laughs = "a0: &a0 [x, x, x, x, x, x, x, x, x]\n";
    for (int i = 1; i <= 12; ++i) {
        const std::string prev = "*a" + std::to_string(i - 1);
        laughs += "a" + std::to_string(i) + ": &a" + std::to_string(i) + " [" + prev;
        for (int k = 1; k < 9; ++k) laughs += ", " + prev;
        laughs += "]\n";
    }
    expect_error(laughs + "run: {name: *a12}\n", {},
                 "the document holds more than 100000 values with its aliases expanded");
    std::string wide = "run.name=[x";
    for (int i = 0; i < 100000; ++i) wide += ",x";
    expect_error(t, {wide + "]"}, "...: run.name.99999: the document holds more than 100000 values");
    CHECK_NOTHROW(load_config(write_config("utf8.yaml", std::string(kGood) + "checkpoint: {resume: auto}\n"),
                              {"run.name=caf\xc3\xa9"}));
}

TEST_CASE("config: the printed configuration loads back to the same configuration") {
    const Config a = load_config(write_config("good.yaml", kGood), {"optimizer.grad_clip_norm=2.5"});
    const std::string printed = config_to_yaml(a);
    const Config b = load_config(write_config("printed.yaml", printed), {});
    CHECK(config_to_yaml(b) == printed);
    CHECK(model_config_hash(a) == model_config_hash(b));
    const Config c = load_config(write_config("good.yaml", kGood), {"model.layers.0.units=9"});
    CHECK(model_config_hash(c) != model_config_hash(a));
    CHECK(printed.find("grad_clip_norm: 2.5") != std::string::npos);
}

TEST_CASE(
    "config: every key set away from its default survives printing and reloading (the run folder's config.yaml)") {
    // Between them these set every key the reader knows to a value other than its default; a key
    // the printer left out would reload as its default and fail the comparison of its section.
    const std::string common = R"(run: {name: every_key, seed: 77, output_dir: /tmp/somewhere/else}
strategy: {devices: "sim:0,1", cross_device_ops: direct, bucket_mb: 0.25, allreduce_dtype: bf16, verify_every_steps: 9,
           collective_timeout_s: 33.5, step_timeout_s: 0, shared_parameters: true, cuda_graph: true, fused_epilogues: true}
train: {epochs: 3, steps: 41, global_batch_size: 24, grad_accumulation_steps: 2, precision: fp16,
        loss_scale_growth_interval: 77, eval_every_epochs: 2, log_every_steps: 7}
checkpoint: {every_steps: 13, every_epochs: 2, every_minutes: 2.5, keep: 7, resume: never}
)";
    const std::vector<std::string> variants = {
        common +
            R"(data: {dataset: synthetic, root: /data/x, input_shape: [8, 8, 3], classes: 5, train_samples: 96, test_samples: 12,
       normalize: {mean: [0.1, 0.2, 0.3], std: [0.5, 0.6, 0.7]}, augment: {random_crop_padding: 2, horizontal_flip: true},
       loader_threads: 3, prefetch: 9, drop_last: false}
model:
  input_shape: [8, 8, 3]
  loss: softmax_cross_entropy
  layers:
    - {type: conv2d, filters: 6, kernel_size: 5, stride: 2, padding: same, activation: gelu, init: he_normal, bias: false}
    - {type: batchnorm, momentum: 0.2, epsilon: 0.001, sync: true, activation: relu}
    - type: residual
      shortcut: conv1x1
      activation: relu
      layers:
        - {type: conv2d, filters: 4, kernel_size: 3, stride: 1, padding: 1, init: glorot_normal}
        - {type: layernorm, epsilon: 0.0002}
    - {type: maxpool2d, kernel_size: 3, stride: 1, padding: 1}
    - {type: avgpool2d, kernel_size: 2, stride: 1, padding: valid}
    - {type: global_avgpool}
    - {type: dropout, rate: 0.3}
    - {type: flatten}
    - {type: dense, units: 7, activation: relu, init: glorot_uniform, bias: false}
optimizer: {type: sgd, lr: 0.3, momentum: 0.7, nesterov: true, weight_decay: 0.01, grad_clip_norm: 3.5,
            scale_lr_with_replicas: true, schedule: {type: multistep, warmup_steps: 4, milestones: [10, 20], gamma: 0.2}}
)",
        common + R"(data: {dataset: csv, root: /data/y, train: {file: a.csv}, test: {file: b.csv},
       csv: {label_column: kind, header: true, delimiter: ";"}, normalize: none}
model: {input_shape: [4], layers: [{type: dense, units: 3}]}
optimizer: {type: adamw, lr: 0.002, betas: [0.8, 0.9], eps: 1e-06, weight_decay: 0.1,
            schedule: {type: cosine, warmup_steps: 3, min_lr_ratio: 0.05}}
)",
        common +
            R"(data: {dataset: idx, root: /data/z, train: {images: ti.gz, labels: tl.gz}, test: {images: si.gz, labels: sl.gz}}
model: {input_shape: [28, 28, 1], layers: [{type: flatten}, {type: dense, units: 3}]}
optimizer: {type: sgd, lr: 0.1, momentum: 0, schedule: {type: step, step_size: 5, gamma: 0.5}}
)",
        common +
            R"(data: {dataset: cifar10, root: /data/c, train: {files: [one.bin, two.bin]}, test: {files: three.bin}}
model: {input_shape: [32, 32, 3], layers: [{type: global_avgpool}, {type: dense, units: 10}]}
optimizer: {type: sgd, lr: 0.1, schedule: {type: constant}}
)",
    };
    const Config defaults =
        load_config(write_config("defaults.yaml", "model: {layers: [{type: dense, units: 2}]}\n"), {});
    for (size_t v = 0; v < variants.size(); ++v) {
        CAPTURE(v);
        const Config a = load_config(write_config("every.yaml", variants[v]), {});
        const std::string printed = config_to_yaml(a);
        CAPTURE(printed);
        const Config b = load_config(write_config("every-printed.yaml", printed), {});
        CHECK(b.run == a.run);
        CHECK(b.strategy == a.strategy);
        CHECK(b.data == a.data);
        CHECK(b.model == a.model);
        CHECK(b.optimizer == a.optimizer);
        CHECK(b.train == a.train);
        CHECK(b.checkpoint == a.checkpoint);
        // and nothing of it is a default: each section differs from an empty file's
        CHECK(a.run != defaults.run);
        CHECK(a.strategy != defaults.strategy);
        CHECK(a.data != defaults.data);
        CHECK(a.optimizer != defaults.optimizer);
        CHECK(a.train != defaults.train);
        CHECK(a.checkpoint != defaults.checkpoint);
    }
}

TEST_CASE("config: printed numbers read as written, and read back to the same values") {
    const char* text =
        R"(data: {dataset: synthetic, input_shape: [4, 4, 1], classes: 3, train_samples: 100, test_samples: 20,
       normalize: {mean: [0.1307], std: [0.3081]}}
model:
  layers:
    - {type: conv2d, filters: 2, kernel_size: 3}
    - {type: batchnorm, momentum: 0.1, epsilon: 0.0001}
    - {type: flatten}
    - {type: layernorm, epsilon: 1e-5}
    - {type: dropout, rate: 0.1234567}
    - {type: dense, units: 3}
optimizer: {type: adamw, lr: 0.1, betas: [0.8, 0.95], weight_decay: 0.0005, schedule: {type: step, step_size: 3, gamma: 0.3}}
strategy: {bucket_mb: 0.1}
)";
    const Config a = load_config(write_config("numbers.yaml", text), {});
    const std::string printed = config_to_yaml(a);
    CAPTURE(printed);
    for (const char* want : {"lr: 0.1\n", "betas: [0.8, 0.95]", "weight_decay: 0.0005", "gamma: 0.3}",
                             "bucket_mb: 0.1\n", "mean: [0.1307]", "std: [0.3081]", "rate: 0.1234567", "momentum: 0.1,",
                             "epsilon: 0.0001,", "epsilon: 1e-05}"})
        CHECK(printed.find(want) != std::string::npos);
    const Config b = load_config(write_config("numbers-printed.yaml", printed), {});
    CHECK(b.optimizer.lr == a.optimizer.lr);
    CHECK(b.optimizer == a.optimizer);
    CHECK(b.optimizer.options->fields()[0].second ==
          "[0.8, 0.95]");                           // the double the user wrote, not a float's 0.949999988
    CHECK(b.model.layers[4] == a.model.layers[4]);  // %g's six digits would have lost it
    CHECK(b.data.normalization.std == a.data.normalization.std);
    CHECK(config_to_yaml(b) == printed);
    // Checkpoints record the model's hash and a resume compares it: for values that %g printed
    // exactly, the text hashed must stay what earlier builds hashed (this value is theirs).
    std::string exact = text;
    exact.replace(exact.find("0.1234567"), 9, "0.25");
    const Config e = load_config(write_config("numbers-exact.yaml", exact), {});
    CHECK(model_config_hash(e) == 3990683493626774121ull);
}

// Every file in configs/ (found by a glob, so a new one is covered without a line here): it loads,
// prints back as itself, and its model builds for its input - the shape the config gives, else the
// shape of its data where the data is on this machine.
TEST_CASE("config: every shipped config loads and its model builds") {
    int configs = 0, built = 0;
    for (const auto& e : fs::directory_iterator("configs")) {
        if (e.path().extension() != ".yaml") continue;
        const std::string f = e.path().string();
        CAPTURE(f);
        ++configs;
        Config c;
        REQUIRE_NOTHROW(c = load_config(f, {}));
        // --print-config's text loads back as the same configuration
        const std::string printed = config_to_yaml(c);
        CHECK(config_to_yaml(load_config_text(printed, f, {})) == printed);
        std::vector<int> shape = c.model.input_shape;
        if (shape.empty() && (c.data.dataset == "synthetic" || fs::exists(effective_data_root(c.data, c.base_dir))))
            shape = load_datasets(c.data, c.base_dir, c.run.seed).train.shape;
        if (shape.empty()) continue;  // its data is not on this machine
        CHECK_NOTHROW(Model(shape, c.model.layers, c.run.seed));
        ++built;
    }
    CHECK(configs >= 7);
    MESSAGE(configs << " configs loaded, " << built << " models built");
    CHECK(built >= 3);  // the CNN and ResNet-20 give their shape; synthetic data has one
}

// The registry pattern every pluggable kind follows, seen through the layer types: a name in one
// list, an unknown one named with the known ones, each type's own keys read by its own reader
// whether they come from a config or from code.
TEST_CASE("registries: unknown names list the known ones; make_layer_spec reads a type's keys as the config does") {
    CHECK_THROWS_WITH_AS(layer_kinds().get("dense2", "model.layers.0.type"),
                         "model.layers.0.type: unknown layer type 'dense2' (known: dense, dropout, flatten, conv2d, "
                         "maxpool2d, avgpool2d, global_avgpool, batchnorm, layernorm, rmsnorm, residual, embedding, "
                         "position_embedding, attention, transformer_block, llama_block, swiglu, lm_head)",
                         ConfigError);
    const LayerSpec a = make_layer_spec("dense", {{"units", "3"}, {"activation", "relu"}});
    CHECK(a.field("units") == "3");
    CHECK(a.field("init") == "he_uniform");  // the reader's default for a ReLU layer
    CHECK(a == make_layer_spec("dense", {{"units", "3"}, {"activation", "relu"}, {"bias", "true"}}));
    CHECK(!(a == make_layer_spec("dense", {{"units", "4"}, {"activation", "relu"}})));
    CHECK(!(a == make_layer_spec("dropout")));
    CHECK_THROWS_WITH_AS(make_layer_spec("dense", {{"units", "3"}, {"rate", "0.5"}}), "dense.rate: unknown key",
                         ConfigError);
    CHECK_THROWS_WITH_AS(make_layer_spec("dense"), "dense.units: required for a dense layer: a positive integer",
                         ConfigError);
    // the same keys through the config reader: the same spec
    const Config c = load_config_text("model: {layers: [{type: dense, units: 3, activation: relu}]}\n", "k.yaml", {});
    CHECK(c.model.layers[0] == a);
}

TEST_CASE("optimizers: each type reads its own keys; defaults without a config; the checkpoint's description") {
    const OptimizerConfig sgd = make_optimizer_config("sgd");
    CHECK(sgd.lr == 0.05);
    CHECK(optimizer_description(sgd) == "sgd+momentum");  // momentum 0.9 by default
    CHECK(optimizer_state_buffers(sgd) == 1);
    CHECK(optimizer_description(make_optimizer_config("sgd", {{"momentum", "0"}})) == "sgd");
    CHECK(optimizer_state_buffers(make_optimizer_config("sgd", {{"momentum", "0"}})) == 0);
    const OptimizerConfig adamw = make_optimizer_config("adamw", {{"betas", "[0.8, 0.9]"}});
    CHECK(adamw.lr == 0.001);
    CHECK(optimizer_state_buffers(adamw) == 2);
    CHECK(adamw.options->fields() == Fields{{"betas", "[0.8, 0.9]"}, {"eps", "1e-08"}});
    CHECK_THROWS_WITH_AS(make_optimizer_config("adamw", {{"momentum", "0.9"}}), "optimizer.momentum: unknown key",
                         ConfigError);
    CHECK_THROWS_WITH_AS(make_optimizer_config("lamb"), "unknown optimizer 'lamb' (known: sgd, adamw)", ConfigError);
    OptimizerConfig plain;  // no options: the type's defaults, as an empty config section gives
    CHECK(optimizer_description(plain) == "sgd+momentum");
    expect_error("model: {layers: [{type: dense, units: 2}]}\noptimizer: {type: adamw, nesterov: true}\n", {},
                 "optimizer.nesterov: unknown key (known here: betas, eps");
}
