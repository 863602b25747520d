#include "mirrored/tools/commands.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>

#include "base/error.h"
#include "mirrored/config.h"
#include "mirrored/cross_device_ops.h"
#include "mirrored/util.h"

namespace mirrored {

namespace {

// Calls fn on each comma-separated item of s, empty ones included (so that "1,,2" is an error).
template <typename Fn>
void for_each_item(const std::string& s, Fn fn) {
    size_t start = 0;
    while (start <= s.size()) {
        const size_t comma = std::min(s.find(',', start), s.size());
        fn(s.substr(start, comma - start));
        start = comma + 1;
    }
}

// "1,2,4" -> {1, 2, 4}: positive integers of at most 6 digits.
// A figure that overrides a GPU's, link's or network's: 0 would mean nothing, not a default.
const CLI::Validator kAboveZero(
    [](std::string& v) {
        char* end = nullptr;
        const double d = std::strtod(v.c_str(), &end);
        return end != v.c_str() && !*end && std::isfinite(d) && d > 0 ? std::string()
                                                                      : "expected a number above 0, got '" + v + "'";
    },
    "NUMBER > 0");

// A finite number in (low, high], or [low, high] with `low_included`: the cost model's figures,
// bounded where a larger one means nothing (a GPU failing once in 114,000 years) and would only
// overflow the arithmetic (NaN and infinities are no numbers).
CLI::Validator finite_between(double low, double high, bool low_included) {
    return CLI::Validator(
        [=](std::string& v) {
            char* end = nullptr;
            const double d = std::strtod(v.c_str(), &end);
            const bool ok =
                end != v.c_str() && !*end && std::isfinite(d) && (low_included ? d >= low : d > low) && d <= high;
            return ok ? std::string()
                      : "expected a number " + std::string(low_included ? "from " : "above ") + number_str(low) +
                            (low_included ? " to " : " up to ") + number_str(high) + ", got '" + v + "'";
        },
        "NUMBER");
}

std::vector<int> parse_list(const std::string& s, const char* flag) {
    std::vector<int> out;
    for_each_item(s, [&](const std::string& item) {
        if (item.empty() || item.size() > 6 || item.find_first_not_of("0123456789") != std::string::npos ||
            std::stoi(item) == 0)
            throw ConfigError(std::string(flag) +
                              ": expected a list of positive integers below 1000000 like 1,2,4, got '" + s + "'");
        out.push_back(std::stoi(item));
    });
    if (out.empty())
        throw ConfigError(std::string(flag) + ": expected a list of positive integers like 1,2,4, got '" + s + "'");
    return out;
}

// "64x512x784:nt,512x784x64:tn": GEMM shapes m x n x k with op(A) op(B) (n: as stored, t:
// transposed; nt when left out), each dimension a positive integer of at most 6 digits.
std::vector<GemmShape> parse_shapes(const std::string& s, const char* flag) {
    std::vector<GemmShape> out;
    for_each_item(s, [&](const std::string& item) {
        GemmShape g;
        char ops[3] = {'n', 't', 0};
        int used = 0;
        const bool ok =
            (std::sscanf(item.c_str(), "%6dx%6dx%6d%n", &g.m, &g.n, &g.k, &used) == 3 && size_t(used) == item.size()) ||
            (std::sscanf(item.c_str(), "%6dx%6dx%6d:%2[nt]%n", &g.m, &g.n, &g.k, ops, &used) == 4 &&
             size_t(used) == item.size() && ops[1] != 0);
        if (!ok || g.m <= 0 || g.n <= 0 || g.k <= 0)
            throw ConfigError(std::string(flag) +
                              ": expected shapes like 64x512x784:nt,512x784x64:tn (m x n x k, then "
                              "op(A) op(B): n as stored, t transposed), got '" +
                              s + "'");
        g.trans_a = ops[0] == 't';
        g.trans_b = ops[1] == 't';
        out.push_back(g);
    });
    return out;
}

// "4K", "64M", "1G", "512": a size in bytes, a whole number of floats, at most 64 GiB.
size_t parse_bytes(const std::string& s, const char* flag) {
    char* end = nullptr;
    const double v = std::strtod(s.c_str(), &end);
    std::string unit(end);
    double mult = 1;
    if (unit == "K" || unit == "KiB" || unit == "k") mult = 1024;
    else if (unit == "M" || unit == "MiB") mult = 1 << 20;
    else if (unit == "G" || unit == "GiB") mult = double(1 << 30);
    else if (!unit.empty() && unit != "B")
        throw ConfigError(std::string(flag) + ": expected a size like 4K, 64M or 1G, got '" + s + "'");
    const double bytes = v * mult;
    if (end == s.c_str() || !(bytes >= 4) || bytes > double(uint64_t(64) << 30) || bytes != std::floor(bytes) ||
        std::fmod(bytes, 4.0) != 0)
        throw ConfigError(std::string(flag) +
                          ": expected a whole number of floats (a multiple of 4 bytes) from 4 bytes to 64G, got '" + s +
                          "'");
    return size_t(bytes);
}

// A seed: a whole number from 0 to 2^64 - 1, nothing else (no sign, no clamping of a larger one).
uint64_t parse_seed(const std::string& s, const char* flag) {
    uint64_t v = 0;
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (s.empty() || ec != std::errc() || end != s.data() + s.size())
        throw ConfigError(std::string(flag) + ": expected a whole number from 0 to 18446744073709551615, got '" + s +
                          "'");
    return v;
}

// "60s", "5m", "1h", "90": a positive duration in seconds, at most a week.
double parse_duration(const std::string& s, const char* flag) {
    char* end = nullptr;
    const double v = std::strtod(s.c_str(), &end);
    const std::string unit(end);
    const double mult = unit.empty() || unit == "s" ? 1 : unit == "m" || unit == "min" ? 60 : unit == "h" ? 3600 : -1;
    const double seconds = v * mult;
    if (end == s.c_str() || mult < 0 || !(seconds > 0) || seconds > 7 * 86400.0)
        throw ConfigError(std::string(flag) + ": expected a positive duration such as 60s, 5m or 1h, got '" + s + "'");
    return seconds;
}

// "a;b;c" -> {a, b, c}, empty items dropped.
std::vector<std::string> split_semicolons(const std::string& s) {
    std::vector<std::string> out;
    size_t start = 0;
    while (start < s.size()) {
        const size_t semi = std::min(s.find(';', start), s.size());
        if (semi > start) out.push_back(s.substr(start, semi - start));
        start = semi + 1;
    }
    return out;
}

// --json FILE and --force, which lets it replace a checkpoint or a run folder's file.
void add_json(CLI::App* cmd, OutputTarget& json, const char* what) {
    cmd->add_option("--json", json.path, what);
    cmd->add_flag("--force", json.force, "let --json replace a checkpoint or a file of a run folder");
}

// Before any work: the output the command will write is one it may write (base/output.h), and none
// of the files it reads (inputs: what, path) - with a config, neither it nor any data file or
// folder its data section names.
void check_json(OutputTarget& json, std::vector<std::pair<std::string, std::string>> inputs,
                const std::string& config = "", const std::vector<std::string>& sets = {}, bool data_default = false) {
    if (json.path.empty()) return;
    if (!config.empty()) {
        inputs.push_back({"the configuration file", config});
        const Config cfg = load_config(config, sets);
        for (auto& input : data_inputs(cfg.data, cfg.base_dir)) inputs.push_back(std::move(input));
    } else if (data_default) {  // bench-loader without a config reads the default data set
        for (auto& input : data_inputs(DataConfig{}, "")) inputs.push_back(std::move(input));
    }
    json.inputs = std::move(inputs);
    check_output(json);
}

}  // namespace

ToolCommands::ToolCommands(CLI::App& app) {
    add_bench_loader(app);
    add_bench_allreduce(app);
    add_bench_step(app);
    add_bench_gemm(app);
    add_bench_conv_layout(app);
    add_scale(app);
    add_plan(app);
    add_report(app);
    add_generate(app);
    add_tokenize(app);
}

void ToolCommands::add_bench_loader(CLI::App& app) {
    bl_ = app.add_subcommand("bench-loader", "samples/s of the input pipeline alone");
    bl_->add_option("--config", lb_.config, "use this config's data section (default: Fashion-MNIST)");
    bl_->add_option("--threads", lb_threads_, "loader thread counts to measure, e.g. 1,2,4");
    bl_->add_option("--batch", lb_.batch, "global batch size")->check(CLI::Range(1, 1 << 24));
    bl_->add_option("--seconds", lb_.seconds, "seconds per measurement")->check(CLI::Range(0.01, 3600.0));
    add_json(bl_, lb_.json, "also write the results here");
}

void ToolCommands::add_bench_allreduce(CLI::App& app) {
    ba_ = app.add_subcommand("bench-allreduce", "time, algbw and busbw of the all-reduce per size");
    ba_->add_option("--devices", ab_.devices, "replicas: auto, cuda:0,1, cuda:0,0,0,0, cpu:4");
    ba_->add_option("--op", ab_.op, cross_device_ops_kinds().names_text(" | "));
    ba_->add_option("--min-bytes", min_bytes_, "smallest size (4K)");
    ba_->add_option("--max-bytes", max_bytes_, "largest size (64M)");
    ba_->add_option("--iters", ab_.iters, "iterations per size (default: by size)")->check(CLI::Range(1, 1000000));
    ba_->add_option("--transport", ab_.transport,
                    "CUDA peer reads: auto, direct (kernel loads peer memory), staged (copy, then add)");
    ba_->add_option("--dtype", ab_.dtype, "gradients on the wire: fp32 or bf16 (half the bytes, sums in f32)");
    ba_->add_option("--duration", duration_,
                    "stress test: all-reduce over the sizes for this long (60s, 5m), "
                    "verifying every result; a wrong sum exits 5 naming the replica pair");
    ba_->add_option("--timeout", timeout_,
                    "a hang detector: when no all-reduce finishes for this long (a hung "
                    "kernel, a failing link, NCCL waiting), the command stops with exit 5 (default 120s)");
    add_json(ba_, ab_.json, "also write the table here");
}

void ToolCommands::add_bench_step(CLI::App& app) {
    bs_ = app.add_subcommand("bench-step", "training throughput for 1..N replicas: the scaling test");
    bs_->add_option("config", sb_.config, "YAML config (default configs/synthetic_mlp.yaml)");
    bs_->add_option("--set", sb_.sets, "override a key (repeatable)");
    bs_->add_option("--devices", sb_devices_, "device lists separated by ';', e.g. 'cpu:1;cpu:2' (default: 1..all)");
    bs_->add_option("--steps", sb_.steps, "timed steps per device list")->check(CLI::Range(1, 10000000));
    bs_->add_option("--warmup", sb_.warmup, "untimed steps first")->check(CLI::Range(0, 1000000));
    bs_->add_option("--per-replica-batch", sb_.per_replica_batch, "global batch = this x replicas (weak scaling)")
        ->check(CLI::Range(1, 1 << 24));
    bs_->add_option("--layers", sb_.layer_steps,
                    "then profile this many more steps layer by layer (replica 0, "
                    "uncaptured, each waited for): where a step's time goes")
        ->check(CLI::Range(0, 100000));
    add_json(bs_, sb_.json, "also write the results here");
}

void ToolCommands::add_bench_gemm(CLI::App& app) {
    bg_ = app.add_subcommand("bench-gemm", "GEMM GFLOP/s of one device: the ceiling a step is measured against");
    bg_->add_option("--device", gb_.device, "cpu (one BLAS thread) or cuda:N");
    bg_->add_option("--sizes", gb_sizes_, "square sizes, e.g. 128,1024");
    bg_->add_option("--shapes", gb_shapes_, "m x n x k with op(A) op(B) instead, e.g. 64x512x784:nt,512x784x64:tn");
    bg_->add_flag("--tf32", gb_.tf32, "TF32 tensor cores (CUDA); the same as --precision tf32");
    bg_->add_option("--precision", gb_precision_, "fp32, tf32, bf16 or fp16 inputs (f32 accumulation and output)")
        ->check(CLI::IsMember({"fp32", "tf32", "bf16", "fp16"}));
    bg_->add_option("--seconds", gb_.seconds, "time each shape for this long (default 1; --sweep: each kernel, 0.05)")
        ->check(CLI::Range(0.001, 60.0));
    bg_->add_flag("--sweep", gb_.sweep,
                  "CPU: a dense layer's three products over widths 64-4096 and rows 16-1024, each GEMM kernel's "
                  "GFLOP/s, the fastest and the static rules' pick, against the cores' FMA peak");
    add_json(bg_, gb_.json, "also write the results here");
}

void ToolCommands::add_bench_conv_layout(CLI::App& app) {
    bc_ = app.add_subcommand("bench-conv-layout",
                             "a convolution's forward + backward with NHWC vs NCHW activations (CPU)");
    bc_->add_option("--batch", cl_.batch, "images per replica")->check(CLI::Range(1, 4096));
    bc_->add_option("--reps", cl_.reps, "timed repetitions (the median is reported)")->check(CLI::Range(1, 1000));
    add_json(bc_, cl_.json, "also write the results here");
}

void ToolCommands::add_scale(CLI::App& app) {
    sc_cmd_ = app.add_subcommand("scale",
                                 "the scaling test: the same step at 1, 2, 4, 8 replicas; speedup, efficiency, "
                                 "where the time goes; scaling.json and scaling.png");
    sc_cmd_->add_option("config", sc_.config, "YAML config")->required();
    sc_cmd_->add_option("--set", sc_.sets, "override a key (repeatable)");
    sc_cmd_->add_option("--replicas", sc_replicas_, "replica counts, e.g. 1,2,4,8 (default: those the kind provides)");
    sc_cmd_->add_option("--kind", sc_.kind,
                        "cuda (one per GPU), cuda-shared (all on GPU 0), cpu or sim "
                        "(default: cuda with GPUs, else cpu)");
    sc_cmd_->add_option("--mode", sc_.mode,
                        "weak (fixed per-replica batch, the default) or strong (fixed global batch)");
    sc_cmd_->add_option("--per-replica-batch", sc_.per_replica_batch, "weak scaling's batch per replica")
        ->check(CLI::Range(1, 1 << 24));
    sc_cmd_->add_option("--steps", sc_.steps, "timed steps per point")->check(CLI::Range(1, 1000000));
    sc_cmd_->add_option("--warmup", sc_.warmup, "untimed steps first")->check(CLI::Range(0, 1000000));
    sc_cmd_->add_option("--out", sc_.out_dir,
                        "folder for scaling.json and scaling.png (default <run.output_dir>/scaling)");
}

void ToolCommands::add_plan(CLI::App& app) {
    pl_cmd_ = app.add_subcommand("plan", "capacity planner: memory, step time and speedup on GPUs not at hand");
    pl_cmd_->add_option("config", pl_.config, "YAML config")->required();
    pl_cmd_->add_option("--set", pl_.sets, "override a key (repeatable)");
    pl_cmd_->add_option("--gpus", pl_gpus_, "GPU counts, e.g. 2,4,8");
    pl_cmd_->add_option("--gpu", pl_.gpu,
                        "h200, h100, h100-pcie, a100-80g, a100-40g, l40s, rtx4090 (docs/SCALING.md; default h100, "
                        "said in the plan)");
    pl_cmd_->add_option("--link", pl_.link,
                        "nvlink4, nvlink3, pcie5, pcie4, pcie3, pcie5-host, pcie4-host "
                        "(default: the GPU's usual one)");
    pl_cmd_->add_option("--mode", pl_.mode, "weak (fixed per-GPU batch, the default) or strong");
    pl_cmd_->add_option("--per-replica-batch", pl_.per_replica_batch, "weak scaling's batch per GPU")
        ->check(CLI::Range(1, 1 << 24));
    pl_cmd_->add_option("--profile", pl_.profile,
                        "compute time measured on the target GPU: scaling.json or bench-step JSON");
    pl_cmd_->add_option("--memory-gb", pl_.memory_gb, "override the GPU's memory")->check(kAboveZero);
    pl_cmd_->add_option("--tflops", pl_.tflops, "override the GPU's peak TFLOP/s in the run's precision")
        ->check(kAboveZero);
    pl_cmd_->add_option("--bus-gbs", pl_.bus_gbs, "override the link's all-reduce bus bandwidth, GB/s")
        ->check(kAboveZero);
    pl_cmd_->add_option("--latency-us", pl_.latency_us, "override the link's latency per ring step, us");
    pl_cmd_->add_option("--launch-us", pl_.launch_us, "host cost of one kernel launch, us");
    pl_cmd_->add_option("--nodes", pl_.nodes, "nodes of --gpus GPUs each (multi-node: hierarchical all-reduce)")
        ->check(CLI::Range(1, 4096));
    pl_cmd_->add_option("--network", pl_.network,
                        "between the nodes: eth-100, eth-200, eth-400, ib-hdr, ib-ndr, "
                        "ib-ndr-x8 (docs/SCALING.md)");
    pl_cmd_->add_option("--network-gbs", pl_.network_gbs, "override the node's network bandwidth, GB/s")
        ->check(kAboveZero);
    pl_cmd_->add_option("--network-latency-us", pl_.network_latency_us,
                        "override the network's latency per ring step, us");
    pl_cmd_->add_option("--price", pl_.price, "USD per GPU hour: price the whole run for each GPU count")
        ->check(finite_between(0, 1e6, false));
    pl_cmd_
        ->add_option("--mtbf", pl_.mtbf_hours,
                     "hours between failures of one GPU (the job's: that / GPUs): the expected rework")
        ->check(finite_between(0, 1e9, false));
    pl_cmd_
        ->add_option("--checkpoint-write-s", pl_.checkpoint_write_s,
                     "seconds one checkpoint write takes (default: its bytes at 1 GB/s)")
        ->check(finite_between(0, 1e7, false));
    pl_cmd_->add_option("--restart-s", pl_.restart_s, "seconds from a failure to training again (default 120)")
        ->check(finite_between(0, 1e7, true));
    add_json(pl_cmd_, pl_.json, "also write the plan here");
}

void ToolCommands::add_report(CLI::App& app) {
    rp_cmd_ = app.add_subcommand("report",
                                 "training curves of one or more runs (several overlaid): PNG figures and one HTML "
                                 "page; works on a run still training");
    rp_cmd_->add_option("runs", rp_.runs, "run folders, e.g. runs/fashion_mnist_mlp")->required();
    rp_cmd_->add_option("--out", rp_.out_dir, "folder for the figures and report.html (default <first run>/report)");
}

void ToolCommands::add_generate(CLI::App& app) {
    gn_cmd_ = app.add_subcommand("generate", "a language model's continuation of a prompt, printed as it comes");
    gn_cmd_
        ->add_option("checkpoint", gn_.checkpoint,
                     "checkpoint file of a language model, or a Hugging Face model folder (GPT-2, Llama family)")
        ->required();
    auto* prompt =
        gn_cmd_->add_option("--prompt", gn_.prompt, "the text to continue (byte-level tokens; default a newline)");
    gn_cmd_
        ->add_option("--prompt-ids", gn_.prompt_ids,
                     "the prompt as token ids separated by spaces, for vocabularies other than bytes "
                     "(scripts/prepare_text.py --encode makes them)")
        ->excludes(prompt);
    gn_cmd_
        ->add_option(
            "--prompts", gn_.prompts,
            "a file of prompts, one per line (in a .jsonl file JSON strings or {\"prompt\": ...}): each continued, "
            "--batch at a time, printed as a JSON line {prompt, text, ids, stopped_at_end_of_text}")
        ->excludes(prompt)
        ->excludes("--prompt-ids");
    gn_cmd_->add_option("--batch", gn_.batch, "--prompts: sequences decoded together (default 8)")
        ->check(CLI::Range(1, 4096))
        ->needs("--prompts");
    gn_cmd_->add_option("--tokens", gn_.tokens, "tokens to generate (default 256)")->check(CLI::Range(1, 1 << 20));
    gn_cmd_->add_option("--temperature", gn_.temperature, "softmax temperature; 0 takes the most likely (default 0.8)")
        ->check(CLI::Range(0.0, 100.0));
    gn_cmd_
        ->add_option("--top-p", gn_.top_p,
                     "draw from the fewest most likely tokens whose probabilities sum to p (default 1: all)")
        ->check(CLI::Range(1e-6, 1.0));
    gn_cmd_->add_flag(
        "--no-stop", [this](int64_t) { gn_.stop_at_end = false; },
        "go on past the end-of-text token (the tokenizer's <|endoftext|> or </s>, or config.json's eos_token_id)");
    gn_cmd_->add_option("--top-k", gn_.top_k, "draw from the k most likely tokens only (default: all)")
        ->check(CLI::Range(0, 1 << 24));
    gn_cmd_->add_option("--seed", gn_seed_, "the draws' seed: the same seed prints the same text (default 1)");
    gn_cmd_->add_flag(
        "--no-echo", [this](int64_t) { gn_.echo = false; }, "print only the continuation");
    gn_cmd_->add_option("--tokenizer", gn_.tokenizer,
                        "the run's tokenizer (a tokenizer.json, or the token files' folder `mirrored tokenize` "
                        "wrote): --prompt and the output as text for a vocabulary that is not bytes");
    gn_cmd_->add_flag(
        "--no-kv-cache", [this](int64_t) { gn_.kv_cache = false; },
        "recompute the whole window for every token instead of keeping each attention's keys and values");
    gn_cmd_
        ->add_option("--context", gn_.context,
                     "a Hugging Face folder's model: the positions it is built for (default: its own, at most 2048)")
        ->check(CLI::Range(1, 1 << 16));
    add_json(gn_cmd_, gn_.json,
             "write the tokens generated (and the prompt's and continuation's ids), the seconds they took and tokens/s "
             "to this JSON file");
}

void ToolCommands::add_tokenize(CLI::App& app) {
    tk_cmd_ = app.add_subcommand("tokenize",
                                 "text files and folders to a language model's token files (train.bin, val.bin, "
                                 "meta.json and the tokenizer's files in --out)");
    tk_cmd_->add_option("inputs", tk_.inputs, "text files and folders (a folder's files recursively, in name order)")
        ->required();
    tk_cmd_->add_option("--tokenizer", tk_.tokenizer,
                        "bytes (default), or a Hugging Face tokenizer.json, a tiktoken rank file (gpt2.tiktoken, "
                        "cl100k_base.tiktoken, ...), a SentencePiece .model, or a folder with one of them or with "
                        "GPT-2's vocab.json and merges.txt");
    tk_cmd_->add_option("--out", tk_.out, "the output folder")->required();
    tk_cmd_
        ->add_option("--train-bpe", tk_.train_bpe,
                     "train a byte-level BPE of N tokens (GPT-2's pre-tokenizer) on the training files first; it "
                     "is written as DIR/tokenizer.json")
        ->check(CLI::Range(258, 1 << 20));
    tk_cmd_->add_option("--val-every", tk_.val_every, "hold out every Nth file for validation (default 10)")
        ->check(CLI::Range(2, 1 << 30));
    tk_cmd_->add_option("--suffix", tk_.suffixes, "only a folder's files ending so, e.g. .py .md (default: all)");
    tk_cmd_->add_option("--threads", tk_.threads, "encoding threads (default: every core)")->check(CLI::Range(0, 1024));
}

int ToolCommands::run() {
    if (bl_->parsed()) {
        lb_.threads = parse_list(lb_threads_, "--threads");
        check_json(lb_.json, {}, lb_.config, {}, /*data_default=*/true);
        return bench_loader(lb_);
    }
    if (ba_->parsed()) {
        ab_.min_bytes = parse_bytes(min_bytes_, "--min-bytes");
        ab_.max_bytes = parse_bytes(max_bytes_, "--max-bytes");
        if (ba_->count("--duration")) ab_.duration_s = parse_duration(duration_, "--duration");
        if (ba_->count("--timeout")) ab_.timeout_s = parse_duration(timeout_, "--timeout");
        check_json(ab_.json, {});
        return bench_allreduce(ab_);
    }
    if (bg_->parsed()) {
        gb_.sizes = parse_list(gb_sizes_, "--sizes");
        if (!gb_shapes_.empty()) gb_.shapes = parse_shapes(gb_shapes_, "--shapes");
        gb_.precision = gb_precision_ == "tf32"   ? Precision::tf32
                        : gb_precision_ == "bf16" ? Precision::bf16
                        : gb_precision_ == "fp16" ? Precision::fp16
                                                  : Precision::fp32;
        if (gb_.sweep && bg_->count("--seconds")) gb_.sweep_seconds = gb_.seconds;
        if (gb_.sweep && gb_.device != "cpu")
            throw ConfigError("--sweep: times the CPU's GEMM kernels; --device must be cpu, got '" + gb_.device + "'");
        check_json(gb_.json, {});
        return bench_gemm(gb_);
    }
    if (bc_->parsed()) {
        check_json(cl_.json, {});
        return bench_conv_layout(cl_);
    }
    if (bs_->parsed()) {
        sb_.devices = split_semicolons(sb_devices_);
        check_json(sb_.json, {}, sb_.config, sb_.sets);
        return bench_step(sb_);
    }
    if (sc_cmd_->parsed()) {
        if (sc_cmd_->count("--replicas")) sc_.replicas = parse_list(sc_replicas_, "--replicas");
        return scale(sc_);
    }
    if (pl_cmd_->parsed()) {
        pl_.gpus = parse_list(pl_gpus_, "--gpus");
        check_json(pl_.json, {{"the profile", pl_.profile}}, pl_.config, pl_.sets);
        return plan(pl_);
    }
    if (rp_cmd_->parsed()) return report(rp_);
    if (tk_cmd_->parsed()) return tokenize(tk_);
    if (gn_cmd_->parsed()) {
        gn_.seed = parse_seed(gn_seed_, "--seed");
        gn_.prompt_ids_given = gn_cmd_->count("--prompt-ids") > 0;
        check_json(
            gn_.json,
            {{"the checkpoint", gn_.checkpoint}, {"the prompts file", gn_.prompts}, {"the tokenizer", gn_.tokenizer}});
        return generate(gn_);
    }
    return -1;
}

}  // namespace mirrored
