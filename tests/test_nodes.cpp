// Multi-node runs on one machine: `mpirun -np K mirrored train` with 1-2 CPU replicas per process.
// K nodes x M replicas against one node with K x M replicas (bit for bit where the summation
// order is the same) and against one replica (within a stated tolerance); one writer; a killed
// or hung node stops the job within a bounded time; resume after it is exact; mismatched
// configurations and an invisible checkpoint are refused. Skipped, and saying so, when the build
// has no MPI or mpirun is missing.
#include <doctest/doctest.h>

#include <chrono>
#include <thread>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "kernels/blas.h"
#include "kernels/device.h"
#include "base/error.h"
#include "mirrored/checkpoint.h"
#include "mirrored/nodes.h"
#include "mirrored/software.h"
#include "tests/cli.h"
#include "tests/helpers.h"
#include "tests/run_folder.h"

using namespace mirrored;
using namespace mirrored::test;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

const char* kRun = R"(run: {name: nodes, seed: 3}
strategy: {devices: "cpu:1", bucket_mb: 0.0002, verify_every_steps: 10}
data: {dataset: synthetic, input_shape: [20], classes: 4, train_samples: 960, test_samples: 200}
model:
  layers:
    - {type: dense, units: 32, activation: relu}
    - {type: dropout, rate: 0.1}
    - {type: dense, units: 4}
optimizer: {type: adamw, lr: 0.01, weight_decay: 0.01, grad_clip_norm: 1.0, schedule: {type: cosine, warmup_steps: 5}}
train: {epochs: 3, global_batch_size: 24, log_every_steps: 10}
checkpoint: {every_steps: 7, keep: 2}
)";

// A CNN whose batchnorm statistics are synchronised over every replica of every node.
const char* kSyncBn = R"(run: {name: bn, seed: 5}
strategy: {devices: "cpu:1", bucket_mb: 0.001, verify_every_steps: 5}
data: {dataset: synthetic, input_shape: [6, 6, 2], classes: 3, train_samples: 256, test_samples: 64}
model:
  layers:
    - {type: conv2d, filters: 4, kernel_size: 3, padding: same}
    - {type: batchnorm, sync: true}
    - {type: dropout, rate: 0.2}
    - {type: flatten}
    - {type: dense, units: 3}
optimizer: {type: sgd, lr: 0.05, momentum: 0.9}
train: {epochs: 2, global_batch_size: 16, log_every_steps: 4, grad_accumulation_steps: 2}
checkpoint: {every_steps: 10}
)";

// fp16 with dynamic loss scaling, a residual block and both kinds of batchnorm.
const char* kFp16 = R"(run: {name: fp16, seed: 9}
strategy: {devices: "cpu:1", bucket_mb: 0.0005, verify_every_steps: 5}
data: {dataset: synthetic, input_shape: [8, 8, 2], classes: 3, train_samples: 384, test_samples: 96}
model:
  layers:
    - {type: conv2d, filters: 6, kernel_size: 3, padding: same, bias: false}
    - {type: batchnorm, activation: relu}
    - type: residual
      activation: relu
      layers:
        - {type: conv2d, filters: 6, kernel_size: 3, padding: same, bias: false}
        - {type: batchnorm, sync: true}
    - {type: flatten}
    - {type: dense, units: 3}
optimizer: {type: sgd, lr: 0.01, momentum: 0.9}
train: {epochs: 6, global_batch_size: 24, precision: fp16, loss_scale_growth_interval: 4, log_every_steps: 5}
checkpoint: {every_steps: 4, keep: 2}
)";

bool have_mpirun() { return std::system("command -v mpirun >/dev/null 2>&1") == 0; }

// Why these tests cannot run here, or "" when they can.
std::string skip_reason() {
    if (!Nodes::available()) return "this build has no MPI (libopenmpi-dev)";
    if (!have_mpirun()) return "mpirun is not installed (openmpi-bin)";
    return "";
}

struct Job {
    int rc = -1;
    double seconds = 0;
    std::string out, err;
};

// mpirun with `nodes` processes of `mirrored <args>`; or, with `per_node`, one process per entry
// (MPMD: each its own arguments and environment).
struct NodeSpec {
    NodeSpec(std::vector<std::string> a, std::vector<std::pair<std::string, std::string>> e, std::string w = "")
        : args(std::move(a)), env(std::move(e)), wdir(std::move(w)) {}
    std::vector<std::string> args;
    std::vector<std::pair<std::string, std::string>> env;
    std::string wdir;  // its working folder, if not the test's
};
// kill_after_s >= 0: SIGKILL to mpirun itself after that long (a lost launcher, a killed job).
Job mpirun(const std::vector<NodeSpec>& per_node, double deadline_s = 120, double kill_after_s = -1) {
    std::vector<std::string> a{"--oversubscribe", "--allow-run-as-root"};
    for (size_t k = 0; k < per_node.size(); ++k) {
        if (k) a.push_back(":");
        a.insert(a.end(), {"-np", "1"});
        for (const auto& [name, value] : per_node[k].env) a.insert(a.end(), {"-x", name + "=" + value});
        if (!per_node[k].wdir.empty()) a.insert(a.end(), {"-wdir", per_node[k].wdir});
        a.push_back(cli());
        a.insert(a.end(), per_node[k].args.begin(), per_node[k].args.end());
    }
    TempDir t;
    const std::string out = t / "out.txt", err = t / "err.txt";
    const auto t0 = std::chrono::steady_clock::now();
    Job j;
    const pid_t pid = spawn_program("mpirun", a, {}, err, Stdout::file, out);
    if (kill_after_s >= 0) {
        std::this_thread::sleep_for(std::chrono::duration<double>(kill_after_s));
        ::kill(pid, SIGKILL);
    }
    j.rc = wait_status_within(pid, deadline_s);
    j.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::ifstream o(out), e(err);
    j.out.assign(std::istreambuf_iterator<char>(o), {});
    j.err.assign(std::istreambuf_iterator<char>(e), {});
    return j;
}
Job mpirun(int nodes, const std::vector<std::string>& args, double deadline_s = 120, double kill_after_s = -1) {
    return mpirun(std::vector<NodeSpec>(size_t(nodes), NodeSpec{args, {}, ""}), deadline_s, kill_after_s);
}

// Whether any process still has `text` as one of its arguments (read from /proc).
bool process_running(const std::string& text) {
    for (const auto& e : fs::directory_iterator("/proc")) {
        const std::string pid = e.path().filename().string();
        if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
        std::ifstream in(e.path() / "cmdline");
        std::string arg;
        while (std::getline(in, arg, '\0'))
            if (arg == text) return true;
    }
    return false;
}

// The parameters of a run's newest checkpoint, tensor by tensor in name order.
std::vector<float> final_params(const std::string& out) {
    const auto files = list_checkpoints(out + "/checkpoints");
    REQUIRE(!files.empty());
    std::vector<float> all;
    for (const auto& [name, t] : read_safetensors(files.front(), true).tensors)
        if (name.rfind("optimizer.", 0) != 0) all.insert(all.end(), t.second.begin(), t.second.end());
    return all;
}

#define SKIP_WITHOUT_MPI()                                     \
    if (const std::string why = skip_reason(); !why.empty()) { \
        mark_skipped(why);                                     \
        return;                                                \
    }

}  // namespace

TEST_CASE("2 nodes x 1 CPU replica train bit-identically to 1 node x 2; node 0 alone writes and lists every node") {
    SKIP_WITHOUT_MPI();
    TempDir t;
    const std::string cfg = t.write("run.yaml", kRun);
    const Job j = mpirun(2, {"train", cfg, "--output", t / "two"});
    REQUIRE_MESSAGE(j.rc == kExitOk, j.err);
    REQUIRE(run_cli({"train", cfg, "--devices", "cpu:2", "--output", t / "one"}) == kExitOk);
    expect_same_run(t / "two", t / "one");
    const json s = summary(t / "two");
    CHECK(s["nodes"] == 2);
    CHECK(s["replicas"] == 2);
    CHECK(s["replica_checksums"].size() == 2);
    CHECK(s["replica_checksums"][0] == s["replica_checksums"][1]);
    CHECK(j.out.find("2 nodes x 1 CPU replica(s)") != std::string::npos);
    CHECK(j.out.find("node 0: ") != std::string::npos);
    CHECK(j.out.find("node 1: ") != std::string::npos);
    CHECK(j.out.find("done: ") == j.out.rfind("done: "));  // one node prints
}

TEST_CASE("a Hugging Face folder fine-tuned across 2 nodes equals 1 node x 2 bit for bit: LoRA, and in full") {
    SKIP_WITHOUT_MPI();
    TempDir t;
    std::mt19937 rng(5);
    for (const char* f : {"train.bin", "val.bin"}) {
        std::vector<uint16_t> ids(std::string(f) == "val.bin" ? 600 : 3000);
        for (auto& id : ids) id = uint16_t(rng() % 64);
        std::ofstream(t / f, std::ios::binary)
            .write(reinterpret_cast<const char*>(ids.data()), std::streamsize(ids.size() * 2));
    }
    const std::string data = "data: {dataset: tokens, root: " + t.path().string() +
                             ", train: train.bin, test: val.bin, context: 16, vocab: 64}\n";
    // the pretrained model: a small Qwen2-shaped Llama trained 2 steps, exported as Hugging Face's
    const std::string base = t.write(
        "base.yaml", "run: {name: base, seed: 2}\n" + data +
                         "model: {layers: [{type: embedding, vocab: 64, dim: 32}, {type: llama_block, heads: 4, "
                         "kv_heads: 2, intermediate_size: 48, bias: true, out_bias: false}, {type: rmsnorm}, "
                         "{type: lm_head, tie_weights: false, units: 64}]}\n"
                         "optimizer: {type: adamw, lr: 0.01}\ntrain: {steps: 2, global_batch_size: 8}\n");
    REQUIRE(run_cli({"train", base, "--devices", "cpu:1", "--output", t / "base"}) == kExitOk);
    REQUIRE(run_cli({"export", list_checkpoints(t / "base/checkpoints").front(), "--names", "hf", "--out", t / "hf"}) ==
            kExitOk);
    for (const std::string& model : {std::string("{init_from: hf, lora: {rank: 4, alpha: 8, dropout: 0.1, targets: "
                                                 "[q_proj, v_proj, down_proj]}}"),
                                     std::string("{init_from: hf}")}) {
        CAPTURE(model);
        const std::string name = model.find("lora") != std::string::npos ? "lora" : "full";
        const std::string cfg = t.write(name + ".yaml", "run: {name: ft, seed: 4}\nstrategy: {devices: \"cpu:1\"}\n" +
                                                            data + "model: " + model +
                                                            "\noptimizer: {type: adamw, lr: 0.01}\n"
                                                            "train: {steps: 6, global_batch_size: 8, "
                                                            "log_every_steps: 2}\ncheckpoint: {every_steps: 3}\n");
        const Job j = mpirun(2, {"train", cfg, "--output", t / (name + "_two")});
        REQUIRE_MESSAGE(j.rc == kExitOk, j.err);
        REQUIRE(run_cli({"train", cfg, "--devices", "cpu:2", "--output", t / (name + "_one")}) == kExitOk);
        expect_same_run(t / (name + "_two"), t / (name + "_one"));
        CHECK(final_params(t / (name + "_two")) == final_params(t / (name + "_one")));
    }
}

TEST_CASE("cross_device_ops auto across nodes: node 0's choice is every node's, whatever each node's cache says") {
    SKIP_WITHOUT_MPI();
    TempDir t;
    const std::string cfg = t.write("run.yaml", kRun);
    // Node 0's cache holds one op for these 3 local replicas, node 1's the other: with each node
    // choosing for itself, the local sums would run in other orders on the two nodes.
    const std::string a = t / "cache-a", b = t / "cache-b";
    REQUIRE(run_cli({"train", cfg, "--devices", "cpu:3", "--output", t / "probe", "--set",
                     "strategy.cross_device_ops=auto", "--set", "train.steps=1"},
                    {{"MIRRORED_CACHE_DIR", a}}) == kExitOk);
    const std::string x = summary(t / "probe")["cross_device_ops"], y = x == "ring" ? "direct" : "ring";
    CAPTURE(x);
    std::ifstream in(a + "/cross-device-ops.txt");
    std::string line, rewritten;
    while (std::getline(in, line)) {
        const size_t tab = line.find('\t');
        REQUIRE(line.compare(tab + 1, x.size() + 1, x + " ") == 0);
        rewritten += line.substr(0, tab + 1) + y + line.substr(tab + 1 + x.size()) + "\n";
    }
    fs::create_directories(b);
    std::ofstream(b + "/cross-device-ops.txt") << rewritten;
    const std::vector<std::string> args{"train",    cfg,        "--devices", "cpu:3",
                                        "--output", t / "auto", "--set",     "strategy.cross_device_ops=auto"};
    const Job j = mpirun({{args, {{"MIRRORED_CACHE_DIR", a}}}, {args, {{"MIRRORED_CACHE_DIR", b}}}});
    REQUIRE_MESSAGE(j.rc == kExitOk, j.err);
    CHECK(j.out.find("cross-device ops: auto, cached: ") != std::string::npos);
    CHECK(summary(t / "auto")["cross_device_ops"] == x);
    const Job named = mpirun(
        2, {"train", cfg, "--devices", "cpu:3", "--output", t / "named", "--set", "strategy.cross_device_ops=" + x});
    REQUIRE_MESSAGE(named.rc == kExitOk, named.err);
    expect_same_run(t / "auto", t / "named");
}

// Each node measuring its own GEMM kernels would round its products its own way, and node 0's
// checkpoint could record only its own: multi-node runs choose by the static rules, measuring
// nothing (kernels/cpu/gemm_choice.h). One node with the same variables measures (the control).
TEST_CASE("GEMM kernels across nodes: no node measures, every node takes the static rules") {
    SKIP_WITHOUT_MPI();
    TempDir t;
    const std::string cfg = t.write("run.yaml", kRun), a = t / "cache-a", b = t / "cache-b", one = t / "cache-one";
    REQUIRE(run_cli({"train", cfg, "--output", t / "one", "--set", "train.steps=2"},
                    {{"MIRRORED_JIT_GEMM", "measure"}, {"MIRRORED_CACHE_DIR", one}}) == kExitOk);
    CHECK(fs::exists(one + "/gemm-kernels.txt"));
    const std::vector<std::string> args{"train", cfg, "--output", t / "nodes", "--set", "train.steps=2"};
    const Job j = mpirun({{args, {{"MIRRORED_JIT_GEMM", "measure"}, {"MIRRORED_CACHE_DIR", a}}},
                          {args, {{"MIRRORED_JIT_GEMM", "measure"}, {"MIRRORED_CACHE_DIR", b}}}});
    REQUIRE_MESSAGE(j.rc == kExitOk, j.err);
    CHECK_FALSE(fs::exists(a + "/gemm-kernels.txt"));
    CHECK_FALSE(fs::exists(b + "/gemm-kernels.txt"));
}

TEST_CASE("checkpoint.every_minutes across nodes: node 0's clock decides for every node; no hang, the same bits") {
    SKIP_WITHOUT_MPI();
    TempDir t;
    const std::string cfg = t.write("run.yaml", kRun);
    const Job j =
        mpirun(2,
               {"train", cfg, "--output", t / "two", "--set", "train.epochs=10", "--set", "checkpoint.every_steps=0",
                "--set", "checkpoint.every_minutes=0.00001", "--set", "checkpoint.keep=1000"},
               60);
    REQUIRE_MESSAGE(j.rc == kExitOk, j.err);
    CHECK(list_checkpoints(t / "two/checkpoints").size() >= 3);
    REQUIRE(run_cli({"train", cfg, "--devices", "cpu:2", "--output", t / "one", "--set", "train.epochs=10"}) ==
            kExitOk);
    expect_same_run(t / "two", t / "one");
}

TEST_CASE("strategy.shard across 2 nodes x 2 replicas: bit for bit as unsharded; a resume is exact") {
    SKIP_WITHOUT_MPI();
    TempDir t;
    const std::string cfg = t.write("run.yaml", kRun);
    const std::vector<std::string> common{"train", cfg, "--devices", "cpu:2", "--set", "optimizer.grad_clip_norm=0"};
    auto args = [&](const std::string& out, const std::string& shard) {
        std::vector<std::string> a = common;
        a.insert(a.end(), {"--output", out, "--set", "strategy.shard=" + shard});
        return a;
    };
    const Job plain = mpirun(2, args(t / "plain", "none"));
    REQUIRE_MESSAGE(plain.rc == kExitOk, plain.err);
    const Job sharded = mpirun(2, args(t / "sharded", "optimizer"));
    REQUIRE_MESSAGE(sharded.rc == kExitOk, sharded.err);
    CHECK(sharded.out.find("shard: optimizer - each replica keeps") != std::string::npos);
    expect_same_run(t / "plain", t / "sharded");  // the chunk summed over the nodes as the all-reduce sums it
    const json s = summary(t / "sharded");
    CHECK(s["replicas"] == 4);
    CHECK(s["shard"] == "optimizer");
    // gradients staged too: each node's reduce-scatter leaves the chunk summed over the nodes
    const Job staged = mpirun(2, args(t / "staged", "gradients"));
    REQUIRE_MESSAGE(staged.rc == kExitOk, staged.err);
    CHECK(summary(t / "staged")["shard"] == "gradients");
    expect_same_run(t / "plain", t / "staged");
    // stopped on every node at step 30, resumed: the state gathered by each node's replicas is whole
    const std::vector<std::string> stopped = args(t / "stopped", "optimizer");
    // a stop on one node stops every node at the same step
    CHECK(mpirun({{stopped, {{"MIRRORED_TEST_STOP_AFTER_STEP", "30"}}}, {stopped, {}}}).rc == kExitInterrupted);
    const Job again = mpirun(2, stopped);
    REQUIRE_MESSAGE(again.rc == kExitOk, again.err);
    CHECK(summary(t / "stopped")["resumed_from_step"] == 30);
    expect_same_run(t / "plain", t / "stopped");
    // clipping: the norm's partial sums cross the nodes too; every replica of the job agrees
    const Job clip_plain = mpirun(2, {"train", cfg, "--devices", "cpu:2", "--output", t / "clip_plain"});
    const Job clip_shard = mpirun(
        2, {"train", cfg, "--devices", "cpu:2", "--output", t / "clip_shard", "--set", "strategy.shard=optimizer"});
    REQUIRE_MESSAGE(clip_plain.rc == kExitOk, clip_plain.err);
    REQUIRE_MESSAGE(clip_shard.rc == kExitOk, clip_shard.err);
    const json c = summary(t / "clip_shard");
    for (const auto& x : c["replica_checksums"]) CHECK(x == c["replica_checksums"][0]);
    CHECK(rel_error(final_params(t / "clip_shard"), final_params(t / "clip_plain")) < 1e-5);
}

TEST_CASE("synchronised batchnorm with accumulation across 2 nodes equals 1 node x 2 replicas bit for bit") {
    SKIP_WITHOUT_MPI();
    TempDir t;
    const std::string cfg = t.write("bn.yaml", kSyncBn);
    const Job j = mpirun(2, {"train", cfg, "--output", t / "two"});
    REQUIRE_MESSAGE(j.rc == kExitOk, j.err);
    REQUIRE(run_cli({"train", cfg, "--devices", "cpu:2", "--output", t / "one"}) == kExitOk);
    expect_same_run(t / "two", t / "one");
}

TEST_CASE(
    "fp16 loss scaling across 2 nodes equals 1 node x 2; a job stopped on 2 nodes resumes on 1 node x 2 "
    "bit-identically") {
    SKIP_WITHOUT_MPI();
    TempDir t;
    const std::string cfg = t.write("fp16.yaml", kFp16);
    const Job two = mpirun(2, {"train", cfg, "--output", t / "two"});
    REQUIRE_MESSAGE(two.rc == kExitOk, two.err);
    REQUIRE(run_cli({"train", cfg, "--devices", "cpu:2", "--output", t / "one"}) == kExitOk);
    expect_same_run(t / "two", t / "one");
    std::set<double> scales;  // the loss scale moved, so there was something to agree on
    for (const auto& j : metrics(t / "two"))
        if (j.contains("loss_scale")) scales.insert(j["loss_scale"].get<double>());
    CHECK(scales.size() >= 2);
    // the same job moves from two machines to one: the checkpoint holds every replica's state
    const std::vector<std::string> args{"train", cfg, "--output", t / "moved"};
    REQUIRE(mpirun({{args, {{"MIRRORED_TEST_STOP_AFTER_STEP", "22"}}}, {args, {}}}).rc == kExitInterrupted);
    REQUIRE(run_cli({"train", cfg, "--devices", "cpu:2", "--output", t / "moved"}) == kExitOk);
    CHECK(summary(t / "moved")["resumed_from_step"] == 22);
    expect_same_run(t / "two", t / "moved");
}

TEST_CASE(
    "simulated GPUs across 2 nodes, random stream delays: 2 x sim:0 == sim:0,1 and 2 x sim:0,0 == 2 x cpu:2 bit for "
    "bit, graphs too") {
    SKIP_WITHOUT_MPI();
    TempDir t;
    const std::string cfg = t.write("run.yaml", kRun);
    const std::vector<std::pair<std::string, std::string>> delays{{"MIRRORED_SIM_DELAY_US", "30"}};
    auto on_nodes = [&](const std::string& devices, const std::string& out, bool delayed, bool graph = false) {
        const std::vector<std::string> args{
            "train",    cfg, "--devices", devices,
            "--output", out, "--set",     std::string("strategy.cuda_graph=") + (graph ? "true" : "false")};
        const Job j =
            mpirun({{args, delayed ? delays : decltype(delays){}}, {args, delayed ? delays : decltype(delays){}}});
        CHECK_MESSAGE(j.rc == kExitOk, j.err);
    };
    on_nodes("sim:0", t / "sim2x1", true);
    REQUIRE(run_cli({"train", cfg, "--devices", "sim:0,1", "--output", t / "sim1x2"}, delays) == kExitOk);
    expect_same_run(t / "sim2x1", t / "sim1x2");
    // The GPU path's host logic (comm-stream callbacks, event joins for the node's all-gather)
    // against the CPU path's barriers: the same bits.
    on_nodes("sim:0,0", t / "sim2x2", true);
    on_nodes("cpu:2", t / "cpu2x2", false);
    expect_same_run(t / "sim2x2", t / "cpu2x2");
    CHECK(summary(t / "sim2x2")["device_type"] == "sim");
    // steps replayed from graphs: the between-nodes sums are host callbacks inside them
    on_nodes("sim:0", t / "graph2x1", true, true);
    expect_same_run(t / "graph2x1", t / "sim1x2");
    on_nodes("sim:0,0", t / "graph2x2", true, true);
    expect_same_run(t / "graph2x2", t / "cpu2x2");
}

TEST_CASE(
    "3 nodes x 1 and 2 nodes x 2 replicas (own or shared parameters) match one replica on the same global batch "
    "(relative error < 1e-4)") {
    SKIP_WITHOUT_MPI();
    TempDir t;
    const std::string cfg = t.write("run.yaml", kRun);
    auto args = [&](const std::string& devices, const std::string& out) {
        std::vector<std::string> a{"train", cfg, "--devices", devices, "--output", out, "--set", "train.steps=20"};
        return a;
    };
    REQUIRE(run_cli(args("cpu:1", t / "one")) == kExitOk);
    const std::vector<float> one = final_params(t / "one");
    struct Case {
        int nodes;
        const char* devices;
        bool shared;  // strategy.shared_parameters: each node's replicas share one copy
    };
    for (const Case c : {Case{3, "cpu:1", false}, Case{2, "cpu:2", false}, Case{2, "cpu:2", true}}) {
        const int nodes = c.nodes;
        const char* devices = c.devices;
        CAPTURE(nodes);
        CAPTURE(devices);
        CAPTURE(c.shared);
        const std::string out = t / ("n" + std::to_string(nodes) + (c.shared ? "shared" : ""));
        std::vector<std::string> a = args(devices, out);
        if (c.shared) a.insert(a.end(), {"--set", "strategy.shared_parameters=true"});
        const Job j = mpirun(nodes, a);
        REQUIRE_MESSAGE(j.rc == kExitOk, j.err);
        CHECK(summary(out)["replicas"] == nodes * std::atoi(devices + 4));
        // Summation order differs from one replica's GEMMs: close, not identical.
        CHECK(rel_error(final_params(out), one) < 1e-4);
        const json s = summary(out);
        for (const auto& c : s["replica_checksums"]) CHECK(c == s["replica_checksums"][0]);
    }
}

TEST_CASE("a stop on one node stops every node at the same step with a checkpoint; the rerun resumes exactly") {
    SKIP_WITHOUT_MPI();
    TempDir t;
    const std::string cfg = t.write("run.yaml", kRun);
    REQUIRE(mpirun(2, {"train", cfg, "--output", t / "ref"}).rc == kExitOk);
    const std::vector<std::string> args{"train", cfg, "--output", t / "run"};
    // The signal path on node 1 only (mpirun forwards SIGUSR1 to every node; this is the harder case).
    const Job stopped = mpirun({{args, {{"MIRRORED_TEST_STOP_AFTER_STEP", "30"}}}, {args, {}}});
    CHECK(stopped.rc == kExitInterrupted);
    CHECK(fs::exists(t / "run/checkpoints/step-0000000030.safetensors"));
    const Job resumed = mpirun(2, args);
    REQUIRE_MESSAGE(resumed.rc == kExitOk, resumed.err);
    CHECK(summary(t / "run")["resumed_from_step"] == 30);
    expect_same_run(t / "ref", t / "run");
}

TEST_CASE(
    "a killed node ends the job within seconds, no hang; restarting the job, or resuming on fewer nodes, is "
    "bit-identical") {
    SKIP_WITHOUT_MPI();
    TempDir t;
    const std::string cfg = t.write("run.yaml", kRun);
    const std::vector<std::string> args{"train", cfg, "--output", t / "run"};
    REQUIRE(mpirun(2, {"train", cfg, "--output", t / "ref"}).rc == kExitOk);
    const Job killed = mpirun({{args, {}}, {args, {{"MIRRORED_TEST_NODE_FAULT", "1:40:kill"}}}}, 60);
    CHECK(killed.rc != kExitOk);
    CHECK(killed.seconds < 30);
    CHECK(killed.err.find("node 0 (") != std::string::npos);  // the survivor says why it stops
    CHECK(killed.err.find("stopped by mpirun (another node failed") != std::string::npos);
    CHECK(list_checkpoints(t / "run/checkpoints").size() > 0);
    // the job resumed on fewer nodes (the machine left out): 1 node x 2 replicas sums as 2 x 1
    fs::copy(t / "run", t / "one", fs::copy_options::recursive);
    std::string err;
    REQUIRE_MESSAGE(run_cli({"train", cfg, "--output", t / "one", "--devices", "cpu:2"}, {}, -1, &err) == kExitOk, err);
    CHECK(summary(t / "one")["resumed_from_step"] == 35);
    CHECK(summary(t / "one")["nodes"] == 1);
    expect_same_run(t / "ref", t / "one");
    const Job resumed = mpirun(2, args);
    REQUIRE_MESSAGE(resumed.rc == kExitOk, resumed.err);
    CHECK(summary(t / "run")["resumed_from_step"] == 35);
    expect_same_run(t / "ref", t / "run");
}

TEST_CASE(
    "mpirun itself killed at an arbitrary moment: no node process is left, and the rerun resumes bit-identically") {
    SKIP_WITHOUT_MPI();
    TempDir t;
    std::string text = kRun;
    text.replace(text.find("epochs: 3"), 9, "epochs: 60");  // long enough to be killed mid-way
    text.replace(text.find("every_steps: 7"), 14, "every_steps: 5");
    const std::string cfg = t.write("run.yaml", text);
    const Job ref = mpirun(2, {"train", cfg, "--output", t / "ref"});
    REQUIRE_MESSAGE(ref.rc == kExitOk, ref.err);
    Rng rng(11);
    const double when = ref.seconds * (0.3 + 0.01 * rng.integer(0, 50));
    CAPTURE(when);
    const std::string out = t / "killed";
    const Job killed = mpirun(2, {"train", cfg, "--output", out}, 60, when);
    CHECK((killed.rc == 128 + SIGKILL || killed.rc == kExitOk));
    bool left = true;  // the nodes notice their launcher is gone
    for (int i = 0; i < 100 && left; ++i) {
        left = process_running(out);
        if (left) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    CHECK_FALSE(left);
    const Job resumed = mpirun(2, {"train", cfg, "--output", out});
    REQUIRE_MESSAGE(resumed.rc == kExitOk, resumed.err);
    CAPTURE(summary(out)["resumed_from_step"]);
    expect_same_run(t / "ref", out);
}

TEST_CASE("a hung node: the others stop after strategy.collective_timeout_s with exit 5 and say what they waited for") {
    SKIP_WITHOUT_MPI();
    TempDir t;
    const std::string cfg = t.write("run.yaml", kRun);
    const std::vector<std::string> args{"train",   cfg,     "--output",
                                        t / "run", "--set", "strategy.collective_timeout_s=2"};
    const Job hung = mpirun({{args, {}}, {args, {{"MIRRORED_TEST_NODE_FAULT", "1:40:hang"}}}}, 60);
    CHECK(hung.rc == kExitDevice);
    CHECK(hung.seconds < 30);
    CHECK(hung.err.find("waited 2 s for the other nodes") != std::string::npos);
    CHECK(hung.err.find("collective_timeout_s") != std::string::npos);
}

TEST_CASE(
    "nodes whose configurations differ are refused (exit 2, the differing line); strategy.nodes is never "
    "configured; on_replica_failure: continue is refused") {
    SKIP_WITHOUT_MPI();
    TempDir t;
    const std::string cfg = t.write("run.yaml", kRun);
    const std::vector<std::string> args{"train", cfg, "--output", t / "run"};
    std::vector<std::string> other = args;
    other.insert(other.end(), {"--set", "train.epochs=4"});
    const Job j = mpirun({{args, {}}, {other, {}}});
    CHECK(j.rc == kExitUsage);
    CHECK(j.err.find("node 1's configuration differs from node 0's in train: '  epochs: 4' instead of '  epochs: 3'") !=
          std::string::npos);
    std::string err;
    CHECK(run_cli({"train", cfg, "--set", "strategy.nodes=2"}, {}, -1, &err) == kExitUsage);
    CHECK(err.find("discovered from mpirun") != std::string::npos);
    // a failure stops every node (a hung node: below): going on without a device is for one node
    std::vector<std::string> cont = args;
    cont.insert(cont.end(), {"--set", "strategy.on_replica_failure=continue"});
    const Job c = mpirun({{cont, {}}, {cont, {}}});
    CHECK(c.rc == kExitUsage);
    CHECK(c.err.find("strategy.on_replica_failure: continue is for a run on one node") != std::string::npos);
}

TEST_CASE(
    "nodes on other software: another mirrored build, CUDA runtime, NCCL or MPI refuses the job; another BLAS kernel "
    "is a note") {
    const std::string mine = software_fingerprint();
    CHECK(compare_software({mine, mine, mine}).refusal.empty());
    CHECK(compare_software({mine, mine, mine}).notes.empty());
    auto with = [&](const std::string& name, const std::string& value) {  // mine, with one entry changed
        std::string out;
        for (const SoftwareEntry& e : software())
            out += e.name + "\t" + (e.name == name ? value : e.value) + "\t" + (e.nodes_must_match ? "1" : "0") + "\n";
        return out;
    };
    std::string nccl;
    for (const SoftwareEntry& e : software())
        if (e.name == "NCCL") nccl = e.value;
    for (const char* name : {"mirrored", "CUDA runtime", "NCCL", "MPI"}) {
        CAPTURE(name);
        const SoftwareComparison c = compare_software({mine, mine, with(name, "9.9.9")});
        CHECK(c.refusal.find(std::string("node 2 runs ") + name + " 9.9.9 where node 0 runs ") != std::string::npos);
        CHECK(c.refusal.find("node 1") == std::string::npos);
        CHECK(c.refusal.find("mirrored --version") != std::string::npos);
    }
    const SoftwareComparison two = compare_software({mine, with("NCCL", "2.0.0"), with("mirrored", "abc")});
    CHECK(two.refusal.find("node 1 runs NCCL 2.0.0 where node 0 runs " + nccl + "; node 2 runs mirrored abc") !=
          std::string::npos);
    for (const char* name : {"compiler", "CUDA driver", "cuBLAS", "BLAS"}) {
        CAPTURE(name);
        const SoftwareComparison c = compare_software({mine, with(name, "other")});
        CHECK(c.refusal.empty());
        REQUIRE(c.notes.size() == 1);
        CHECK(c.notes[0].find(std::string("node 1 runs ") + name + " other where node 0 runs") == 0);
    }
    CHECK(compare_software({mine, "garbage"}).refusal.find("node 1 runs mirrored (not reported)") != std::string::npos);
    CHECK(cuda_version_text(13000) == "13.0");
    CHECK(cuda_version_text(12040) == "12.4");
    CHECK(cuda_version_text(0) == "none");
    CHECK(nccl_version_text(22809) == "2.28.9");
    CHECK(nccl_version_text(2708) == "2.7.8");
    CHECK(nccl_version_text(0) == "none");

    // End to end: two nodes of this build, node 1 on the Haswell kernel, node 0 on its own choice
    SKIP_WITHOUT_MPI();
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma") || blas_kernel().rfind("Haswell", 0) == 0) {
        mark_skipped("needs AVX2 and a BLAS kernel other than Haswell for node 0");
        return;
    }
    TempDir t;
    const std::string cfg = t.write("run.yaml", kRun);
    const std::vector<std::string> args{"train", cfg, "--output", t / "run", "--set", "train.steps=3"};
    const Job j = mpirun({{args, {}}, {args, {{"OPENBLAS_CORETYPE", "Haswell"}, {"MIRRORED_BLAS_AUTO", "0"}}}});
    CAPTURE(j.out);
    CAPTURE(j.err);
    CHECK(j.rc == kExitOk);
    CHECK(j.out.find("note: node 1 runs BLAS OpenBLAS") != std::string::npos);
    CHECK(j.out.find("kernel Haswell") != std::string::npos);
    CHECK(j.out.find("not bit-identically to one node") != std::string::npos);
}

TEST_CASE("nodes that read other data are refused (exit 3) naming the node and both data sets; one copy trains") {
    SKIP_WITHOUT_MPI();
    TempDir t;
    const std::string cfg = t.write("run.yaml", R"(run: {name: data, seed: 3}
strategy: {devices: "cpu:1"}
data: {dataset: csv, train: {file: train.csv}, test: {file: test.csv}}
model: {layers: [{type: dense, units: 2}]}
optimizer: {type: sgd, lr: 0.1}
train: {epochs: 1, global_batch_size: 4}
)");
    // each node's own copy of the data (MIRRORED_DATA_DIR), the second with one value changed
    for (const char* copy : {"d0", "d1"}) {
        fs::create_directories(t / copy);
        std::ofstream train(t / copy + "/train.csv"), test(t / copy + "/test.csv");
        train << "a,b,label\n";
        test << "a,b,label\n";
        for (int i = 0; i < 16; ++i) {
            const bool changed = std::string(copy) == "d1" && i == 9;
            train << i * 0.5 << "," << (changed ? 99 : i % 3) << "," << i % 2 << "\n";
            if (i < 4) test << i << "," << i * 2 << "," << i % 2 << "\n";
        }
    }
    const std::vector<std::string> args{"train", cfg, "--output", t / "run"};
    const Job j = mpirun({{args, {{"MIRRORED_DATA_DIR", t / "d0"}}}, {args, {{"MIRRORED_DATA_DIR", t / "d1"}}}});
    CHECK(j.rc == kExitData);
    CHECK(j.err.find("node 1 reads other data than node 0: 16 training samples (fingerprint ") != std::string::npos);
    CHECK(j.err.find("where node 0 has 16 training samples (fingerprint ") != std::string::npos);
    CHECK(j.err.find("every node must read the same files") != std::string::npos);
    CHECK_FALSE(fs::exists(t / "run/checkpoints"));
    fs::copy_file(t / "d0/train.csv", t / "d1/train.csv", fs::copy_options::overwrite_existing);
    const Job same = mpirun({{args, {{"MIRRORED_DATA_DIR", t / "d0"}}}, {args, {{"MIRRORED_DATA_DIR", t / "d1"}}}});
    CHECK(same.rc == 0);
}

TEST_CASE("a node that cannot see the checkpoint node 0 resumes from fails the job with exit 4 naming the path") {
    SKIP_WITHOUT_MPI();
    TempDir t;
    const std::string cfg = t.write("run.yaml", kRun);
    // one relative --output, each node in its own working folder: node 1 sees "run" elsewhere,
    // as a node without the shared file system would
    fs::create_directories(t / "a");
    fs::create_directories(t / "b");
    const std::vector<std::string> args{"train", cfg, "--output", "run"};
    REQUIRE(mpirun({{args, {{"MIRRORED_TEST_STOP_AFTER_STEP", "14"}}, t / "a"}, {args, {}, t / "a"}}).rc ==
            kExitInterrupted);
    const Job j = mpirun({{args, {}, t / "a"}, {args, {}, t / "b"}});
    CHECK(j.rc == kExitCheckpoint);
    CHECK(j.err.find("run/checkpoints/step-0000000014.safetensors: this node cannot see the checkpoint node 0 "
                     "resumes from") != std::string::npos);
}

TEST_CASE("nodes started with another --output or only some with --print-config: every node ends at once, exit 2") {
    SKIP_WITHOUT_MPI();
    TempDir t;
    const std::string cfg = t.write("run.yaml", kRun);
    const std::vector<std::string> args{"train", cfg, "--output", t / "run"};
    Job j = mpirun({{args, {}, ""}, {{"train", cfg, "--output", t / "elsewhere"}, {}, ""}}, 60);
    CHECK(j.rc == kExitUsage);
    CHECK(j.err.find("node 1's configuration differs from node 0's in run: '  output_dir: " + (t / "elsewhere")) !=
          std::string::npos);
    CHECK(!fs::exists(t / "elsewhere/checkpoints"));
    std::vector<std::string> print = args;
    print.push_back("--print-config");
    j = mpirun({{print, {}, ""}, {args, {}, ""}}, 60);
    CHECK(j.rc == kExitUsage);
    CHECK(j.err.find("--print-config: node 1 was started without it, node 0 with") != std::string::npos);
    CHECK(!fs::exists(t / "run/checkpoints"));
    // every node printing: node 0 alone writes the configuration out
    j = mpirun(2, print, 60);
    CHECK(j.rc == kExitOk);
    size_t n = 0;
    for (size_t at = j.out.find("output_dir:"); at != std::string::npos; at = j.out.find("output_dir:", at + 1)) ++n;
    CHECK(n == 1);
}

TEST_CASE("a launcher's process count without mpirun: the process trains alone; a build without MPI says so") {
    // `sbatch -n 4` runs a plain command once with SLURM_NTASKS=4: MPI starts as a singleton; a
    // build without MPI cannot join anyone and says what that means
    TempDir t;
    const std::string cfg = t.write("run.yaml", kRun);
    std::string err;
    CHECK(run_cli({"train", cfg, "--output", t / "run", "--set", "train.epochs=1"}, {{"SLURM_NTASKS", "4"}}, -1,
                  &err) == kExitOk);
    CHECK(fs::exists(t / "run/summary.json"));
    if (!Nodes::available()) {
        CHECK(err.find("warning: SLURM_NTASKS=4: started as one of 4 processes") != std::string::npos);
        CHECK(err.find("it trains alone") != std::string::npos);
    }
    CHECK(run_cli({"train", cfg, "--output", t / "bad"}, {{"PMI_SIZE", "four"}}, -1, &err) == kExitUsage);
    CHECK(err.find("PMI_SIZE=four: expected the number of processes") != std::string::npos);
}

TEST_CASE("without mpirun nothing joins: Nodes::join returns no nodes") {
    // The plain single-node path: every other test of the suite runs through it.
    CHECK(Nodes::join(nullptr, nullptr) == nullptr);
}
