// Commands besides train/eval/export: the device report and the benchmarks.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "base/output.h"
#include "kernels/device.h"

namespace mirrored {

class Model;

class ReplicaThreads;
class Watchdog;

// Shared by the tools: a result file as base/output.h writes what a user names (nothing when the
// path is empty); 4096 -> "4K"; the mean time of one crossing of the replica barrier with every
void write_json(const OutputTarget& target, const nlohmann::json& j);
std::string human_bytes(size_t b);
double barrier_latency_us(ReplicaThreads& threads);
// The hang detector of a command that runs training steps (bench-step, scale): a GPU that stops
// answering ends it with exit 5 after timeout_s (the config's strategy.step_timeout_s) without
// progress; none when 0. Starts in the phase "start-up".
std::unique_ptr<Watchdog> steps_watchdog(double timeout_s);
// One of the project's Python scripts (scripts/NAME beside the binary's build folder) with `args`,
// by the distribution's python3 (where python3-matplotlib installs): its exit status, or
// kScriptMissing when the script is not there, kNoPython when python3 is not.
constexpr int kScriptMissing = -1, kNoPython = 127;
int run_project_script(const std::string& name, const std::vector<std::string>& args);

// `mirrored devices`: GPUs, peer-access matrix, links, versions; or the CPU when there is none.
int print_devices();

struct LoaderBenchOptions {
    std::string config;  // a YAML config whose data section is used; empty: Fashion-MNIST
    std::vector<int> threads{1, 2};
    int batch = 512;
    double seconds = 2.0;                        // per measurement
    OutputTarget json{"--json", "", false, {}};  // also written here (path empty: not)
};
int bench_loader(const LoaderBenchOptions& o);

struct AllReduceBenchOptions {
    std::string devices = "auto";
    std::string op = "ring";
    size_t min_bytes = 4096, max_bytes = size_t(64) << 20;
    int iters = 0;                               // 0: chosen per size
    std::string transport = "auto";              // CUDA peer reads: auto, direct (peer loads), staged (copy + add)
    std::string dtype = "fp32";                  // the wire type: fp32 or bf16 (sizes stay f32 gradient bytes)
    double duration_s = 0;                       // > 0: the stress test - cycle through the sizes this long
    double timeout_s = 120;                      // a hang detector: no all-reduce finishing for this long is exit 5
    OutputTarget json{"--json", "", false, {}};  // also written here (path empty: not)
};
int bench_allreduce(const AllReduceBenchOptions& o);

struct StepBenchOptions {
    std::string config = "configs/synthetic_mlp.yaml";
    std::vector<std::string> sets;
    std::vector<std::string> devices;  // each measured in turn, e.g. cpu:1 cpu:2
    int steps = 50, warmup = 5;
    int per_replica_batch = 0;                   // > 0: global batch = this x replicas (weak scaling)
    int layer_steps = 0;                         // > 0: then this many steps profiled layer by layer (StepProfile)
    OutputTarget json{"--json", "", false, {}};  // also written here (path empty: not)
};
// Training-step throughput of a config for each device list: the scaling test.
int bench_step(const StepBenchOptions& o);

// C[m,n] = op(A)[m,k] op(B)[k,n], row-major as gemm (kernels/ops/gemm.h).
struct GemmShape {
    int m = 0, n = 0, k = 0;
    bool trans_a = false, trans_b = true;
};
struct GemmBenchOptions {
    std::string device = "cpu";                    // cpu (one BLAS thread, as a replica uses) or cuda:N
    std::vector<int> sizes{128, 512, 1024, 2048};  // square m = n = k (A B^T, as a dense layer's forward)
    std::vector<GemmShape> shapes;                 // --shapes: instead of the squares
    bool tf32 = false;                             // shorthand for precision tf32
    Precision precision = Precision::fp32;
    double seconds = 1.0;
    // --sweep (CPU): a grid of a dense layer's three products (widths 64-4096, rows 16-1024), each
    // kernel's GFLOP/s, the fastest, the static rules' pick; each kernel timed for sweep_seconds
    bool sweep = false;
    double sweep_seconds = 0.05;
    OutputTarget json{"--json", "", false, {}};  // also written here (path empty: not)
};
// The GEMM ceiling a replica's step is measured against.
int bench_gemm(const GemmBenchOptions& o);

struct ScaleOptions {
    std::string config;
    std::vector<std::string> sets;
    std::vector<int> replicas;  // empty: 1, 2, 4, 8 as far as the kind provides
    std::string kind;           // cuda, cuda-shared, cpu, sim; empty: cuda when there are GPUs, else cpu
    std::string mode = "weak";  // weak: fixed per-replica batch; strong: fixed global batch
    int steps = 30, warmup = 5;
    int per_replica_batch = 0;  // weak; 0: the config's global batch / the smallest count
    std::string out_dir;        // empty: <run.output_dir>/scaling
};
// `mirrored scale`: the scaling test (scaling.json, scaling.png, a verdict).
int scale(const ScaleOptions& o);

struct PlanOptions {
    std::string config;
    std::vector<std::string> sets;
    std::vector<int> gpus{1, 2, 4, 8};
    std::string gpu, link;  // gpu empty: h100, said so in the plan; link empty: the GPU's usual one
    std::string mode = "weak";
    int per_replica_batch = 0;  // 0: as `scale` picks it
    std::string profile;        // scaling.json or bench-step JSON measured on the target GPU
    // overrides of the table's figures (0: the table's)
    double memory_gb = 0, tflops = 0, bus_gbs = 0, latency_us = 0;
    double launch_us = 4.0;                          // host cost of one kernel launch (H200: 4.0 us, measured)
    int nodes = 1;                                   // --gpus counts GPUs per node
    std::string network = "ib-ndr";                  // between the nodes
    double network_gbs = 0, network_latency_us = 0;  // overrides
    // the cost of the whole run (price 0: not priced): a GPU's MTBF (0: no failures), the
    // checkpoint's write (0: its bytes at 1 GB/s) and a restart's start-up
    double price = 0, mtbf_hours = 0, checkpoint_write_s = 0, restart_s = 120;
    OutputTarget json{"--json", "", false, {}};  // also written here (path empty: not)
};
// `mirrored plan`: memory and step time per replica for GPUs not at hand.
int plan(const PlanOptions& o);
// Without --profile, plan measures a step here: the planned rows, unless on a CPU a step of them
// would take more than budget_flops (a model of GPT-2's size: minutes and the whole batch's
// memory) - then fewer, as few per micro-batch as the model trains on (Model::check_batch: batch
// statistics need two), and one warm-up and one timed step where even those exceed it.
// Efficiency is a property of the products' shapes more than of their number of rows, so a few
// samples measure it.
struct LocalShape {
    int rows = 0, warmup = 2, steps = 8;
};
constexpr double kMeasureFlops = 1e11;  // about a second a step on one core
LocalShape local_shape(const Model& model, int rows, int accumulation, bool gpu_here, double budget_flops);

struct ReportOptions {
    std::vector<std::string> runs;  // run folders (each with metrics.jsonl)
    std::string out_dir;            // empty: <first run>/report
};
// `mirrored report`: the runs' curves as PNG figures and one HTML page (scripts/report.py).
int report(const ReportOptions& o);

struct GenerateOptions {
    std::string checkpoint;
    std::string prompt;             // byte-level tokens; empty: a newline
    std::string prompt_ids;         // or token ids separated by spaces (other vocabularies, e.g. BPE)
    bool prompt_ids_given = false;  // --prompt-ids was given (an empty list is refused, not ignored)
    std::string prompts;            // or a file of prompts, one per line: each continued, as JSON lines
    int batch = 8;                  // --prompts: sequences decoded together
    int tokens = 256;
    double temperature = 0.8;  // 0: the most likely token every time
    int top_k = 0;             // 0: every token
    double top_p = 1.0;        // nucleus sampling: the fewest most likely tokens whose probabilities reach it
    bool stop_at_end = true;   // stop at the end-of-text token (the tokenizer's, or config.json's eos_token_id)
    uint64_t seed = 1;
    bool echo = true;       // print the prompt before the continuation
    bool kv_cache = true;   // false: recompute the whole window for every token
    std::string tokenizer;  // text in and out through it (data/tokenizer.h); empty: bytes or ids
    int context = 0;        // a Hugging Face folder: positions the model is built for (0: its own, at most 2048)
    OutputTarget json;      // where given: the tokens generated, seconds, tokens/s
};
// `mirrored generate`: a language model's continuation of a prompt, streamed (or of each prompt of a
// file, batched).
int generate(const GenerateOptions& o);

struct TokenizeOptions {
    std::string tokenizer = "bytes";  // "bytes", or a tokenizer.json / a folder with one (data/tokenizer.h)
    int train_bpe = 0;                // > 0: a byte-level BPE of this many tokens trained on the training files
    std::string out;
    std::vector<std::string> inputs;    // text files and folders
    std::vector<std::string> suffixes;  // a folder's files ending so only (none: all)
    int val_every = 10;                 // every Nth file held out for validation
    int threads = 0;                    // 0: every core
};
// `mirrored tokenize`: text files to token files (train.bin, val.bin, meta.json, the tokenizer).
int tokenize(const TokenizeOptions& o);

struct ConvShape {
    int h, w, c, k, f;  // image h x w x c, kernel k x k ("same" padding, stride 1), f filters
};
struct ConvLayoutBenchOptions {
    int batch = 64;
    int reps = 9;
    // the Fashion-MNIST CNN's two convolutions and one of each ResNet-20 stage
    std::vector<ConvShape> shapes{
        {28, 28, 1, 3, 32}, {14, 14, 32, 3, 64}, {32, 32, 16, 3, 16}, {16, 16, 32, 3, 32}, {8, 8, 64, 3, 64}};
    OutputTarget json{"--json", "", false, {}};  // also written here (path empty: not)
};
// One convolution's forward + backward with NHWC activations (mirrored's) against NCHW, on CPU.
int bench_conv_layout(const ConvLayoutBenchOptions& o);

}  // namespace mirrored
