// Hostile input and careless use, through the CLI as a user meets it: each case a defect found by
// trying to break the trainer (docs/RELIABILITY.md lists them with what the user sees). No crash,
// no hang, nothing lost, the documented exit code.
#include <doctest/doctest.h>
#include <sys/stat.h>

#include <cstring>
#include <nlohmann/json.hpp>
#include <set>

#include "kernels/blas.h"
#include "base/error.h"
#include "mirrored/checkpoint.h"
#include "mirrored/software.h"
#include "tests/cli.h"
#include "tests/helpers.h"
#include "tests/run_folder.h"

using namespace mirrored;
using namespace mirrored::test;
using json = nlohmann::json;

namespace {

const char* kRun = R"(run: {name: rel, seed: 5}
strategy: {devices: "cpu:2"}
data: {dataset: synthetic, input_shape: [16], classes: 3, train_samples: 600, test_samples: 120}
model:
  layers:
    - {type: dense, units: 24, activation: relu}
    - {type: dense, units: 3}
optimizer: {type: sgd, lr: 0.05}
train: {epochs: 4, global_batch_size: 30, log_every_steps: 10}
checkpoint: {every_steps: 10, keep: 3}
)";

json read_json(const std::string& path) { return json::parse(std::ifstream(path)); }

std::vector<json> metrics_lines(const std::string& out) {
    std::vector<json> v;
    std::ifstream in(out + "/metrics.jsonl");
    std::string line;
    while (std::getline(in, line)) v.push_back(json::parse(line));  // throws if a line is not JSON
    return v;
}

int count_type(const std::vector<json>& m, const std::string& type, int64_t step = -1) {
    int n = 0;
    for (const auto& j : m) n += j["type"] == type && (step < 0 || j["step"] == step);
    return n;
}

std::vector<std::string> previous_dirs(const std::string& out) {
    std::vector<std::string> v;
    for (const auto& e : fs::directory_iterator(out))
        if (e.path().filename().string().rfind("previous-", 0) == 0) v.push_back(e.path().string());
    return v;
}

}  // namespace

TEST_CASE(
    "two trainers on one run folder: the second is refused (exit 2, naming the holder); a killed holder leaves no "
    "stale lock") {
    TempDir d;
    std::string text = kRun;
    text.replace(text.find("epochs: 4"), 9, "epochs: 400");
    const std::string cfg = d.write("c.yaml", text), out = d / "run";
    const pid_t first = spawn_cli({"train", cfg, "--output", out}, {}, "/dev/null");
    for (int i = 0; i < 400 && !fs::exists(out + "/metrics.jsonl"); ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    std::string err;
    CHECK(run_cli({"train", cfg, "--output", out}, {}, -1, &err) == kExitUsage);
    CHECK(err.find("is in use by another mirrored run (pid " + std::to_string(first) + ")") != std::string::npos);
    CHECK(err.find("--set run.output_dir=" + out + ": run.output_dir:") != std::string::npos);  // where it came from
    CHECK(run_cli({"train", cfg, "--output", out, "--set", "checkpoint.resume=never"}) ==
          kExitUsage);  // no moving aside either
    ::kill(first, SIGKILL);
    wait_status(first);
    CHECK(run_cli({"train", cfg, "--output", out, "--set", "train.epochs=1", "--set", "checkpoint.resume=never"}) ==
          kExitOk);
}

// Every thread the trainer starts (replicas, loader, synthetic data) may be refused by the system.
// Four replicas and six loader threads under limits of 3 and 6 threads: the replica threads (one
// already running) or the loader's are refused - a clear error, exit 5, no hang, no crash.
TEST_CASE("too few threads allowed (ulimit -u): exit 5 naming the thread that could not start, never a crash or hang") {
    for (rlim_t limit : {3, 6}) {
        CAPTURE(limit);
        const auto l = thread_limit_as_nobody(limit);
        if (!l) {
            mark_skipped("needs root and a user 'nobody' to run the trainer under a thread limit");
            return;
        }
        TempDir d;  // everything 'nobody' touches: the binary, the config, the run folder
        fs::permissions(d.path(), fs::perms::all);
        const std::string bin = d / "mirrored";
        fs::copy_file(cli(), bin);
        fs::permissions(bin, fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec |
                                 fs::perms::others_read | fs::perms::others_exec);
        const std::string cfg = d.write("c.yaml", kRun), err_path = d / "err.txt";
        const pid_t pid = spawn_program(bin,
                                        {"train", cfg, "--output", d / "run", "--set", "strategy.devices=cpu:4",
                                         "--set", "data.loader_threads=6", "--set", "train.global_batch_size=32"},
                                        {}, err_path, Stdout::discard, "", apply_thread_limit, &*l);
        CHECK(wait_status_within(pid, 120) == kExitDevice);
        std::ifstream in(err_path);
        const std::string err(std::istreambuf_iterator<char>(in), {});
        CAPTURE(err);
        CHECK(err.find("error: cannot start ") != std::string::npos);
        CHECK(err.find("the system's limit on threads is too low for this run (`ulimit -u`") != std::string::npos);
        CHECK(err.find("internal") == std::string::npos);
    }
}

TEST_CASE("fresh starts within one second each keep the earlier run's files, config.yaml included") {
    TempDir d;
    const std::string cfg = d.write("c.yaml", kRun), out = d / "run";
    REQUIRE(run_cli({"train", cfg, "--output", out, "--set", "train.epochs=1"}) == kExitOk);
    for (int i = 0; i < 2; ++i)
        REQUIRE(run_cli({"train", cfg, "--output", out, "--set", "train.epochs=1", "--set", "checkpoint.resume=never",
                         "--set", "run.seed=" + std::to_string(10 + i)}) == kExitOk);
    const auto prev = previous_dirs(out);
    REQUIRE(prev.size() == 2);
    std::set<std::string> seeds;
    for (const auto& p : prev) {
        CHECK(fs::exists(p + "/summary.json"));
        CHECK(fs::exists(p + "/metrics.jsonl"));
        CHECK(fs::exists(p + "/config.yaml"));
        CHECK(fs::exists(p + "/step-0000000020.safetensors"));
        seeds.insert(std::string(std::istreambuf_iterator<char>(std::ifstream(p + "/config.yaml").rdbuf()), {}));
    }
    CHECK(seeds.size() == 2);  // two different earlier runs, neither overwritten
}

TEST_CASE("stdout closed or a broken pipe: the run completes, metrics.jsonl holds only its own JSON lines") {
    TempDir d;
    const std::string cfg = d.write("c.yaml", kRun);
    for (Stdout mode : {Stdout::closed, Stdout::broken_pipe}) {
        const std::string out = d / (mode == Stdout::closed ? "closed" : "pipe");
        CHECK(run_cli({"train", cfg, "--output", out}, {}, -1, nullptr, mode) == kExitOk);
        const auto m = metrics_lines(out);
        CHECK(count_type(m, "eval") == 4);
        CHECK(read_json(out + "/summary.json")["status"] == "completed");
    }
}

TEST_CASE(
    "killed between the final checkpoint and summary.json: the rerun writes the summary once, from the recorded "
    "metrics") {
    TempDir d;
    const std::string cfg = d.write("c.yaml", kRun), out = d / "run";
    REQUIRE(run_cli({"train", cfg, "--output", out}) == kExitOk);
    const json full = read_json(out + "/summary.json");
    fs::remove(out + "/summary.json");  // as if killed right before writing it
    CHECK(run_cli({"train", cfg, "--output", out}) == kExitOk);
    const json again = read_json(out + "/summary.json");
    CHECK(again["train_loss"] == full["train_loss"]);  // not null
    CHECK(again["test_accuracy"] == full["test_accuracy"]);
    CHECK(count_type(metrics_lines(out), "eval", full["steps"].get<int64_t>()) == 1);  // no duplicate evaluation
    // a stale "interrupted" summary of an earlier stop is not shown as the result either
    json stale = full;
    stale["status"] = "interrupted";
    stale["steps"] = 10;
    std::ofstream(out + "/summary.json") << stale.dump();
    CHECK(run_cli({"train", cfg, "--output", out}) == kExitOk);
    CHECK(read_json(out + "/summary.json")["status"] == "completed");
}

TEST_CASE("a FIFO as a data file or named like a checkpoint never blocks; a signal before training stops at once") {
    TempDir d;
    const std::string fifo = d / "train.csv";
    REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
    const std::string csv = d.write("c.yaml", "run: {name: f}\ndata: {dataset: csv, root: " + d.path().string() +
                                                  ", train: {file: train.csv}, test: {file: train.csv}}\n"
                                                  "model: {layers: [{type: dense, units: 2}]}\n");
    std::string err;
    CHECK(run_cli({"train", csv, "--output", d / "out"}, {}, -1, &err) == kExitData);
    CHECK(err.find("train.csv: is a FIFO (named pipe), expected a regular file") != std::string::npos);
    // a FIFO among the checkpoints is never opened (nor removed): not a file the trainer wrote
    const std::string cfg = d.write("r.yaml", kRun), out = d / "run";
    fs::create_directories(out + "/checkpoints");
    const std::string fake = out + "/checkpoints/step-0000000999.safetensors";
    REQUIRE(::mkfifo(fake.c_str(), 0600) == 0);
    CHECK(run_cli({"train", cfg, "--output", out, "--set", "train.epochs=1"}, {}, -1, &err) == kExitOk);
    CHECK(err.find("warning: ignoring " + fake + ": not a regular file") != std::string::npos);
    CHECK(fs::is_fifo(fake));
    // SIGTERM while a large dataset is still being made (20 M samples: seconds of work, more under
    // a sanitizer): exit 130 before the data is ready - the header, printed once it is, never
    // appears - rather than after loading and a first step. No clock decides it: a busy machine
    // only makes the loading slower.
    const std::vector<std::string> slow{"train", cfg, "--output", d / "slow", "--set", "data.train_samples=20000000"};
    const std::string slow_out = d / "slow.txt";
    const pid_t pid = spawn_cli(slow, {}, "/dev/null", Stdout::file, slow_out);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    ::kill(pid, SIGTERM);
    CHECK(wait_status_within(pid, 120) == kExitInterrupted);
    std::ifstream printed(slow_out);
    const std::string text{std::istreambuf_iterator<char>(printed), {}};
    CAPTURE(text);
    CHECK(text.find("mirrored: run") == std::string::npos);
}

TEST_CASE(
    "versions: --version names this build and its libraries; summaries and checkpoints record them; a resume from "
    "another build says so") {
    TempDir d;
    const std::string text = d / "version.txt";
    REQUIRE(run_cli({"--version"}, {}, -1, nullptr, Stdout::file, text) == kExitOk);
    const std::string version(std::istreambuf_iterator<char>(std::ifstream(text).rdbuf()), {});
    CHECK(version.rfind("mirrored " + mirrored_version() + "\n", 0) == 0);
    for (const char* line : {"\n  compiler: ", "\n  CUDA runtime: ", "\n  NCCL: ", "\n  BLAS: OpenBLAS", "\n  MPI: "})
        CHECK(version.find(line) != std::string::npos);
    CHECK(mirrored_version().find_first_of(" \n\t") == std::string::npos);

    const std::string cfg = d.write("c.yaml", kRun), out = d / "run";
    REQUIRE(run_cli({"train", cfg, "--output", out}, {{"MIRRORED_TEST_STOP_AFTER_STEP", "20"}}) == kExitInterrupted);
    const json summary = json::parse(std::ifstream(out + "/summary.json"));
    CHECK(summary["software"]["mirrored"] == mirrored_version());
    CHECK(summary["software"].contains("NCCL"));
    const std::string newest = list_checkpoints(out + "/checkpoints").front();
    SafetensorsFile f = read_safetensors(newest, true);
    CHECK(json::parse(f.metadata["software"])["mirrored"] == mirrored_version());
    // the same checkpoint as an older build would have written it
    f.metadata["software"] = R"({"mirrored": "0123456789ab-older"})";
    write_safetensors(newest, f, true);
    const std::string log = d / "resume.txt";
    REQUIRE(run_cli({"train", cfg, "--output", out}, {}, -1, nullptr, Stdout::file, log) == kExitOk);
    const std::string printed(std::istreambuf_iterator<char>(std::ifstream(log).rdbuf()), {});
    CHECK(printed.find("  software: mirrored " + mirrored_version() + " (") != std::string::npos);
    CHECK(printed.find("note: the checkpoint was written by mirrored 0123456789ab-older, this is " +
                       mirrored_version()) != std::string::npos);
}

TEST_CASE("a resume on another BLAS kernel says how to resume on the checkpoint's, and doing so is exact") {
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) {
        mark_skipped("the Haswell kernel needs AVX2 and FMA");
        return;
    }
    TempDir d;
    const std::string cfg = d.write("c.yaml", kRun), ref = d / "ref", out = d / "run";
    const std::vector<std::pair<std::string, std::string>> haswell{{"OPENBLAS_CORETYPE", "Haswell"},
                                                                   {"MIRRORED_BLAS_AUTO", "0"}};
    REQUIRE(run_cli({"train", cfg, "--output", ref}, haswell) == kExitOk);
    auto env = haswell;
    env.emplace_back("MIRRORED_TEST_STOP_AFTER_STEP", "20");
    REQUIRE(run_cli({"train", cfg, "--output", out}, env) == kExitInterrupted);
    const std::string written =
        read_safetensors(list_checkpoints(out + "/checkpoints").front(), true).metadata["blas_kernel"];
    REQUIRE(written.rfind("Haswell", 0) == 0);
    const std::string now = blas_kernel();  // this process's kernel: a resume without the variables gets it
    if (now.rfind("Haswell", 0) != 0) {     // on a copy of the stopped run: resumed on this kernel, it says what to do
        const std::string other = d / "other", log = d / "resume.txt";
        fs::copy(out, other, fs::copy_options::recursive);
        REQUIRE(run_cli({"train", cfg, "--output", other}, {{"MIRRORED_TEST_STOP_AFTER_STEP", "21"}}, -1, nullptr,
                        Stdout::file, log) == kExitInterrupted);
        const std::string printed(std::istreambuf_iterator<char>(std::ifstream(log).rdbuf()), {});
        CHECK(printed.find("written with GEMMs by " + written + ", this run uses " + now) != std::string::npos);
        CHECK(printed.find("to resume bit-identically, rerun with OPENBLAS_CORETYPE=Haswell MIRRORED_BLAS_AUTO=0") !=
              std::string::npos);
    }
    REQUIRE(run_cli({"train", cfg, "--output", out}, haswell) == kExitOk);  // as the note says
    expect_same_run(ref, out);
}

TEST_CASE(
    "a hung GPU: the watchdog ends train (the rerun resumes exactly), eval, bench-step and scale with exit 5 within "
    "strategy.step_timeout_s") {
    TempDir d;
    std::string text = kRun;
    text.replace(text.find("cpu:2"), 5, "sim:0,1");
    const std::string cfg = d.write("c.yaml", text), ref = d / "ref", out = d / "run";
    REQUIRE(run_cli({"train", cfg, "--output", ref}) == kExitOk);
    // the 600th launch on simulated GPU 1 (about step 40 of 80) never finishes: the host blocks where nothing times out
    const std::vector<std::pair<std::string, std::string>> hang{{"MIRRORED_SIM_HANG", "1:600"}};
    std::string err;
    const auto t0 = std::chrono::steady_clock::now();
    CHECK(run_cli({"train", cfg, "--output", out, "--set", "strategy.step_timeout_s=3"}, hang, -1, &err) ==
          kExitDevice);
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    CHECK(took < 30);
    CHECK(err.find("no progress for 3 s in training, after step ") != std::string::npos);
    CHECK(err.find("(strategy.step_timeout_s)") != std::string::npos);
    const auto ckpts = list_checkpoints(out + "/checkpoints");
    REQUIRE(!ckpts.empty());
    CHECK(err.find("the last checkpoint is at step " + std::to_string(checkpoint_step(ckpts.front())) +
                   ": run again to resume from it") != std::string::npos);
    // hung again after resuming, before the next checkpoint: the message names the one resumed from
    std::string again;
    CHECK(run_cli({"train", cfg, "--output", out, "--set", "strategy.step_timeout_s=3"},
                  {{"MIRRORED_SIM_HANG", "1:100"}}, -1, &again) == kExitDevice);
    CHECK(again.find("the last checkpoint is at step " + std::to_string(checkpoint_step(ckpts.front())) +
                     ": run again to resume from it") != std::string::npos);
    CHECK(list_checkpoints(out + "/checkpoints").front() == ckpts.front());
    // a GPU that hangs at its first launch (initialising the parameters): start-up is watched too
    std::string early;
    CHECK(run_cli({"train", cfg, "--output", d / "early", "--set", "strategy.step_timeout_s=3"},
                  {{"MIRRORED_SIM_HANG", "0:1"}}, -1, &early) == kExitDevice);
    CHECK(early.find("no progress for 3 s in start-up (") != std::string::npos);
    CHECK(early.find("no checkpoint was written yet") != std::string::npos);
    // without the watchdog the same hang is a process that never ends (cut off here after 3 s)
    CHECK(run_cli({"train", cfg, "--output", d / "off", "--set", "strategy.step_timeout_s=0"}, hang, 3.0) ==
          128 + SIGKILL);
    CHECK(run_cli({"train", cfg, "--output", out}) == kExitOk);
    CHECK(read_json(out + "/summary.json")["resumed_from_step"] == checkpoint_step(ckpts.front()));
    expect_same_run(ref, out);
    // eval is watched too: before, a GPU hanging during it left a process that never ended
    const std::string ckpt = list_checkpoints(ref + "/checkpoints").front();
    std::string eval_err;
    CHECK(run_cli({"eval", cfg, "--checkpoint", ckpt, "--set", "strategy.step_timeout_s=3"},
                  {{"MIRRORED_SIM_HANG", "1:12"}}, -1, &eval_err) == kExitDevice);
    CHECK(eval_err.find("no progress for 3 s in the evaluation (strategy.step_timeout_s)") != std::string::npos);
    CHECK(eval_err.find("the evaluation did not finish: run it again") != std::string::npos);
    CHECK(run_cli({"eval", cfg, "--checkpoint", ckpt}) == kExitOk);
    // and so are the commands that run steps to measure them
    std::string bench_err, scale_err;
    CHECK(run_cli({"bench-step", cfg, "--devices", "sim:0,1", "--steps", "50", "--set", "strategy.step_timeout_s=3"},
                  {{"MIRRORED_SIM_HANG", "1:60"}}, -1, &bench_err) == kExitDevice);
    CHECK(bench_err.find("no progress for 3 s in the steps (strategy.step_timeout_s)") != std::string::npos);
    CHECK(bench_err.find("nothing was written: run it again") != std::string::npos);
    CHECK(run_cli({"scale", cfg, "--kind", "sim", "--replicas", "2", "--steps", "20", "--out", d / "scaling", "--set",
                   "strategy.step_timeout_s=3"},
                  {{"MIRRORED_SIM_HANG", "0:100"}}, -1, &scale_err) == kExitDevice);
    CHECK(scale_err.find("no progress for 3 s in the steps (strategy.step_timeout_s)") != std::string::npos);
    CHECK(!fs::exists(d / "scaling/scaling.json"));
}

TEST_CASE("a resume on other training data of the same size warns, naming both fingerprints; the same data does not") {
    TempDir d;
    const std::string cfg = d.write("c.yaml", kRun), out = d / "run";
    REQUIRE(run_cli({"train", cfg, "--output", out}, {{"MIRRORED_TEST_STOP_AFTER_STEP", "20"}}) == kExitInterrupted);
    const std::string newest = list_checkpoints(out + "/checkpoints").front();
    const std::string recorded = read_safetensors(newest, false).metadata["train_data_fingerprint"];
    CHECK(recorded.size() == 16);
    std::string err;
    REQUIRE(run_cli({"train", cfg, "--output", out}, {{"MIRRORED_TEST_STOP_AFTER_STEP", "30"}}, -1, &err) ==
            kExitInterrupted);
    CHECK(err.find("other training data") == std::string::npos);  // the same data: silent
    // the same 600 samples, normalised otherwise: other features, so another run
    CHECK(run_cli({"train", cfg, "--output", out, "--set", "data.normalize=none"}, {}, -1, &err) == kExitOk);
    CAPTURE(err);
    CHECK(err.find("was trained on other training data than this run's (the same 600 samples, other contents: "
                   "fingerprint " +
                   recorded + ", now ") != std::string::npos);
    CHECK(err.find("set checkpoint.resume: never to start afresh") != std::string::npos);
    // the run's summary says which data it ended on
    const json summary = read_json(out + "/summary.json");
    CHECK(summary["train_data_fingerprint"].get<std::string>().size() == 16);
    CHECK(summary["train_data_fingerprint"] != recorded);
}

TEST_CASE(
    "crafted checkpoints: wrong types, overlaps, absurd metadata are checkpoint errors, and auto-resume falls back") {
    TempDir d;
    const std::string cfg = d.write("c.yaml", kRun), out = d / "run";
    REQUIRE(run_cli({"train", cfg, "--output", out}, {{"MIRRORED_TEST_STOP_AFTER_STEP", "30"}}) == kExitInterrupted);
    const auto ckpts = list_checkpoints(out + "/checkpoints");
    REQUIRE(ckpts.size() == 3);  // 30, 20, 10
    const SafetensorsFile good = read_safetensors(ckpts[0], true);
    // the header-only look (cross_device_ops: auto, before a resume) sees what the full read sees
    CHECK(peek_checkpoint_metadata(ckpts[0]) == good.metadata);
    CHECK(peek_checkpoint_metadata(d / "missing.safetensors").empty());
    CHECK(peek_checkpoint_metadata(cfg).empty());  // not a safetensors file
    auto craft = [&](const std::string& path, auto&& edit) {
        SafetensorsFile f = good;
        edit(f);
        write_safetensors(path, f, true);  // a valid checksum: only the content is wrong
    };
    craft(d / "neg.safetensors", [](SafetensorsFile& f) { f.metadata["step"] = "-5"; });
    craft(d / "huge.safetensors", [](SafetensorsFile& f) { f.metadata["step"] = "99999999999999999999"; });
    craft(d / "str.safetensors", [](SafetensorsFile& f) { f.metadata["replicas"] = "two"; });
    craft(d / "metrics.safetensors", [](SafetensorsFile& f) { f.metadata["train_metrics"] = "[[1, 2, 3]]"; });
    for (const char* name : {"neg", "huge", "str", "metrics"}) {
        CAPTURE(name);
        std::string err;
        CHECK(run_cli({"eval", cfg, "--checkpoint", d / (std::string(name) + ".safetensors")}, {}, -1, &err) ==
              kExitCheckpoint);
        CHECK(err.find("metadata") != std::string::npos);
    }
    // a header with a string where an offset belongs, and one whose tensors overlap
    auto rewrite_header = [&](const std::string& from, const std::string& to, auto&& edit) {
        std::ifstream in(from, std::ios::binary);
        std::vector<char> bytes((std::istreambuf_iterator<char>(in)), {});
        uint64_t n = 0;
        std::memcpy(&n, bytes.data(), 8);
        json h = json::parse(std::string(bytes.data() + 8, n));
        edit(h);
        std::string hs = h.dump();
        while ((hs.size() + 8) % 8) hs.push_back(' ');
        const uint64_t m = hs.size();
        std::ofstream o(to, std::ios::binary);
        o.write(reinterpret_cast<const char*>(&m), 8);
        o << hs;
        o.write(bytes.data() + 8 + n, std::streamsize(bytes.size() - 8 - n));
    };
    rewrite_header(ckpts[0], d / "type.safetensors", [](json& h) { h["layers.0.bias"]["data_offsets"][0] = "0"; });
    rewrite_header(ckpts[0], d / "overlap.safetensors",
                   [](json& h) { h["layers.0.bias"]["data_offsets"] = h["layers.0.weight"]["data_offsets"]; });
    std::string err;
    CHECK(run_cli({"eval", cfg, "--checkpoint", d / "type.safetensors"}, {}, -1, &err) == kExitCheckpoint);
    CHECK(err.find("data_offsets is not two non-negative integers") != std::string::npos);
    CHECK(run_cli({"eval", cfg, "--checkpoint", d / "overlap.safetensors"}, {}, -1, &err) == kExitCheckpoint);
    CHECK(err.find("offsets do not match its shape") != std::string::npos);
    // the newest checkpoint crafted badly: auto-resume skips it for the one before
    fs::copy_file(d / "type.safetensors", ckpts[0], fs::copy_options::overwrite_existing);
    CHECK(run_cli({"train", cfg, "--output", out}, {}, -1, &err) == kExitOk);
    CHECK(err.find("skipping unusable checkpoint") != std::string::npos);
    CHECK(read_json(out + "/summary.json")["resumed_from_step"] == 20);
}

TEST_CASE("resuming with another global batch says why; errors found after reading the YAML carry file:line") {
    TempDir d;
    const std::string cfg = d.write("c.yaml", kRun), out = d / "run";
    REQUIRE(run_cli({"train", cfg, "--output", out}, {{"MIRRORED_TEST_STOP_AFTER_STEP", "15"}}) == kExitInterrupted);
    std::string err;
    CHECK(run_cli({"train", cfg, "--output", out, "--set", "train.global_batch_size=60"}, {}, -1, &err) ==
          kExitCheckpoint);
    CHECK(err.find("written with train.global_batch_size 30, this run uses 60") != std::string::npos);
    CHECK(run_cli({"train", cfg, "--output", d / "x", "--set", "train.global_batch_size=31"}, {}, -1, &err) ==
          kExitUsage);
    CHECK(err.find("--set train.global_batch_size=31: train.global_batch_size: 31 does not divide") !=
          std::string::npos);
    CHECK(run_cli({"train", cfg, "--output", d / "x", "--devices", "sim:99"}, {}, -1, &err) == kExitUsage);
    CHECK(err.find("--set strategy.devices=sim:99: strategy.devices:") != std::string::npos);
    CHECK(run_cli({"train", cfg, "--output", d / "x", "--set", "model.layers.1.units=2"}, {}, -1, &err) == kExitUsage);
    CHECK(err.find("--set model.layers.1.units=2: model.layers.1.units: the model has 2 outputs, but synthetic data "
                   "has label 2") != std::string::npos);
}

TEST_CASE("careless command lines get exit 2 and what is expected, never 'internal'") {
    TempDir d;
    const std::string cfg = d.write("c.yaml", kRun);
    struct Case {
        std::vector<std::string> args;
        const char* want;
    };
    const std::vector<Case> cases = {
        {{"train", d.path().string()}, "is a directory, expected a regular file"},
        {{"train", cfg, "--set", "model.layers.99999999999.units=3"}, "is not an index"},
        {{"train", cfg, "--set", "train.steps="}, "expected a value after '='"},
        {{"train", cfg, "--set", "train.steps.=5"}, "is not a key path"},
        {{"train", cfg, "--devices", ""}, "--devices: expected a device list"},
        {{"train", cfg, "--output", ""}, "--output: expected a folder"},
        {{"train", cfg, "--devices", "cpu:100000"}, "cpu:N with N replicas, 1 to 1024"},
        {{"train", cfg, "--set", "data.input_shape=[1048576, 1048576, 1048576]"}, "data.input_shape"},
        {{"train", cfg, "--set", std::string("run.name=bad\xff")}, "is not valid UTF-8"},
        {{"train", cfg, "--output", "/proc/mirrored-cannot-write"},
         "run.output_dir: cannot write to /proc/mirrored-cannot-write"},
        {{"train", cfg, "--set", "data.input_shape=[1000]", "--set", "model.layers.0.units=16000000"},
         "more host memory than this machine has"},
        {{"bench-step", cfg, "--per-replica-batch", "0"}, "--per-replica-batch: Value 0 not in range"},
        {{"bench-loader", "--config", cfg, "--batch", "100000"},
         "--batch 100000: larger than the 600 training samples"},
        {{"bench-allreduce", "--devices", "cpu:2", "--min-bytes", "0.5"}, "a whole number of floats"},
        {{"bench-loader", "--threads", "99999999999"}, "expected a list of positive integers"},
    };
    for (const Case& c : cases) {
        CAPTURE(c.want);
        std::string err;
        CHECK(run_cli(c.args, {}, -1, &err) == kExitUsage);
        CHECK(err.find(c.want) != std::string::npos);
        CHECK(err.find("internal") == std::string::npos);
    }
}

TEST_CASE(
    "export or eval dumps onto the checkpoint or the config are refused; a finished run on a read-only mount is still "
    "shown") {
    TempDir d;
    const std::string cfg = d.write("c.yaml", kRun), out = d / "run";
    REQUIRE(run_cli({"train", cfg, "--output", out}) == kExitOk);
    const std::string ckpt = list_checkpoints(out + "/checkpoints").front();
    const auto before = fs::file_size(ckpt);
    std::string err;
    CHECK(run_cli({"export", ckpt, "--out", ckpt}, {}, -1, &err) == kExitUsage);
    CHECK(err.find("is the checkpoint itself") != std::string::npos);
    CHECK(fs::file_size(ckpt) == before);
    CHECK_NOTHROW(read_safetensors(ckpt, true));
    // eval's dumps: refused before anything is evaluated, onto the checkpoint (through another
    // spelling of its path), the config, each other or a directory; nothing is replaced
    const std::string x = d / "x.npy", cfg_text = kRun;
    const std::string ckpt_other =
        (fs::path(ckpt).parent_path() / ".." / "checkpoints" / fs::path(ckpt).filename()).string();
    struct Case {
        std::vector<std::string> dump;
        std::string want;
    };
    for (const Case& c :
         {Case{{"--dump-inputs", ckpt_other}, "--dump-inputs " + ckpt_other + ": is the checkpoint itself"},
          Case{{"--dump-logits", ckpt}, "is the checkpoint itself"},
          Case{{"--dump-logits", cfg}, "is the configuration file"},
          Case{{"--dump-inputs", x, "--dump-logits", x}, "--dump-logits " + x + ": is the file --dump-inputs writes"},
          Case{{"--dump-inputs", d.path().string()}, "is a directory; name a file"}}) {
        CAPTURE(c.want);
        std::vector<std::string> args{"eval", cfg, "--checkpoint", ckpt};
        args.insert(args.end(), c.dump.begin(), c.dump.end());
        CHECK(run_cli(args, {}, -1, &err) == kExitUsage);
        CHECK(err.find(c.want) != std::string::npos);
    }
    CHECK(fs::file_size(ckpt) == before);
    CHECK_NOTHROW(read_safetensors(ckpt, true));
    CHECK(std::string(std::istreambuf_iterator<char>(std::ifstream(cfg).rdbuf()), {}) == cfg_text);
    CHECK(!fs::exists(x));
    // read-only: a bind mount remounted read-only in a private mount namespace (needs root)
    const std::string log = d / "ro.log";
    const std::string script = "mount --bind '" + out + "' '" + out + "' && mount -o remount,ro,bind '" + out +
                               "' && touch '" + out + "/probe' 2>/dev/null; test ! -e '" + out + "/probe' && '" +
                               cli() + "' train '" + cfg + "' --output '" + out + "' > '" + log + "' 2>&1";
    const int rc = std::system(("unshare -m sh -c \"" + script + "\"").c_str());
    if (!fs::exists(log)) {
        mark_skipped("cannot make a read-only mount here (unshare -m needs root and CAP_SYS_ADMIN)");
        return;
    }
    CHECK(WEXITSTATUS(rc) == kExitOk);
    const std::string text(std::istreambuf_iterator<char>(std::ifstream(log).rdbuf()), {});
    CHECK(text.find("is complete (the folder cannot be written") != std::string::npos);
    CHECK(text.find("\"status\": \"completed\"") != std::string::npos);
}

TEST_CASE("disk full: the failing write is named (exit 4), no partial file is left, earlier checkpoints stay good") {
    TempDir d;
    std::string text = kRun;
    text.replace(text.find("units: 24"), 9, "units: 2000");  // checkpoints of about 300 KB
    const std::string cfg = d.write("c.yaml", text), out = d / "full", log = d / "full.log";
    fs::create_directories(out);
    // a 1 MiB tmpfs in a private mount namespace: room for three checkpoints, not four
    const std::string script =
        d.write("full.sh", "mount -t tmpfs -o size=1m tmpfs '" + out + "' || exit 0\n'" + cli() + "' train '" + cfg +
                               "' --output '" + out + "' > /dev/null 2> '" + log + "'\necho \"exit $?\" >> '" + log +
                               "'\nls -a '" + out + "/checkpoints' >> '" + log + "'\ncp '" + out +
                               "'/checkpoints/step-* '" + d.path().string() + "/'\n");
    std::system(("unshare -m sh '" + script + "'").c_str());
    std::ifstream in(log);
    if (!in) {
        mark_skipped("cannot mount a small tmpfs here (unshare -m needs root and CAP_SYS_ADMIN)");
        return;
    }
    const std::string text_log(std::istreambuf_iterator<char>(in), {});
    CAPTURE(text_log);
    CHECK(text_log.find("No space left on device") != std::string::npos);
    // the message names the checkpoint being written, not its hidden temporary
    CHECK(text_log.find("/checkpoints/step-") != std::string::npos);
    CHECK(text_log.find(".tmp:") == std::string::npos);
    CHECK(text_log.find("untouched") != std::string::npos);
    const size_t listing = text_log.find("exit 4\n");  // exit code 4, then the folder's listing
    REQUIRE(listing != std::string::npos);
    CHECK(text_log.find(".tmp", listing) == std::string::npos);  // the partial write was removed
    int good = 0;
    for (const auto& e : fs::directory_iterator(d.path()))
        if (e.path().filename().string().rfind("step-", 0) == 0) {
            CHECK_NOTHROW(read_safetensors(e.path().string(), true));
            ++good;
        }
    CHECK(good >= 2);
}
