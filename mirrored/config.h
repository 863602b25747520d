// Run configuration: YAML file + --set overrides -> a validated Config.
//
// Every key, its type, range and default is read in exactly one place (config.cpp); unknown
// keys, wrong types and out-of-range values are rejected before any work with
//   error: <file>:<line>: <key.path>: <what is expected>
// (or "--set <key.path>=<value>" in place of file:line for command-line overrides).
// `mirrored train CONFIG --print-config` prints the resolved configuration, defaults included.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "data/datasets.h"
#include "mirrored/layers/layer.h"
#include "mirrored/loss.h"
#include "mirrored/optimizer_config.h"
#include "mirrored/strategy_config.h"

namespace mirrored {

struct RunConfig {
    std::string name = "run";
    uint64_t seed = 1;
    std::string output_dir;  // default runs/<name>
    bool operator==(const RunConfig&) const = default;
};

// model.lora: low-rank adapters (LoRA) on the named Hugging Face modules; every other tensor frozen.
struct LoraConfig {
    int rank = 0;  // 0: off
    double alpha = 16;
    double dropout = 0;  // PEFT's lora_dropout: on each adapter's input, in training (not in the model's hash)
    std::vector<std::string> targets;  // q_proj, v_proj, ... (GPT-2: c_attn, c_proj)
    bool operator==(const LoraConfig&) const = default;
};

struct ModelConfig {
    std::vector<int> input_shape;  // empty: the dataset's sample shape
    std::vector<LayerSpec> layers;
    // model.init_from: a Hugging Face model folder (absolute): a fresh run starts from its weights,
    // and its config.json gives the layers unless model.layers is written (mirrored/hf_models.h).
    std::string init_from;
    LoraConfig lora;
    std::vector<std::string> freeze;  // model.freeze: glob patterns of tensor names kept fixed
    LossConfig loss;
    bool operator==(const ModelConfig&) const = default;
};

struct TrainConfig {
    int64_t epochs = 10;
    int64_t steps = 0;  // > 0 overrides epochs
    int global_batch_size = 128;
    int grad_accumulation_steps = 1;
    Precision precision = Precision::fp32;  // fp32 | tf32 | bf16 | fp16
    int loss_scale_growth_interval = 2000;  // fp16: good steps before the loss scale doubles
    int64_t eval_every_epochs = 1;
    int64_t eval_every_steps = 0;  // 0: none (only by epochs and at the end)
    int64_t log_every_steps = 100;
    // train.recompute: blocks - transformer and residual blocks keep only their input and output
    // between forward and backward and run their forward again in backward (less activation
    // memory, about a third more compute); none keeps every activation.
    bool recompute_blocks = false;
    bool operator==(const TrainConfig&) const = default;
};

struct CheckpointConfig {
    int64_t every_steps = 1000;  // 0: off
    int64_t every_epochs = 0;    // 0: off
    double every_minutes = 30;   // wall time since the last checkpoint (node 0's clock); 0: off
    int keep = 3;
    std::string resume = "auto";  // auto | never | PATH
    bool operator==(const CheckpointConfig&) const = default;
};

struct Config {
    RunConfig run;
    StrategyConfig strategy;
    DataConfig data;
    ModelConfig model;
    OptimizerConfig optimizer;
    TrainConfig train;
    CheckpointConfig checkpoint;

    std::string file;                          // the YAML file
    std::string base_dir;                      // its folder: relative data.root is resolved against it
    std::map<std::string, std::string> where;  // key path -> "file:line" or "--set ..."

    // A ConfigError for a check that needs more than the file (e.g. the data's shape).
    [[noreturn]] void fail(const std::string& key, const std::string& what) const;
};

// Loads and validates. `sets` are "key.path=value" overrides (value parsed as YAML).
Config load_config(const std::string& path, const std::vector<std::string>& sets);
// The same from the file's text (`path` names it in messages and anchors relative data paths).
Config load_config_text(const std::string& text, const std::string& path, const std::vector<std::string>& sets);
// The resolved configuration as YAML (every key, defaults included).
std::string config_to_yaml(const Config& c);
// Hash of what decides whether a checkpoint fits: architecture and optimizer state layout.
uint64_t model_config_hash(const Config& c);
std::string model_config_summary(const Config& c);  // human-readable form of the same

}  // namespace mirrored
