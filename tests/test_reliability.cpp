// Hostile input and careless use, through the CLI as a user meets it: each case a defect found by
// trying to break the trainer (docs/RELIABILITY.md lists them with what the user sees). No crash,
// no hang, nothing lost, the documented exit code.
#include <doctest/doctest.h>
#include <sys/stat.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "kernels/blas.h"
#include "kernels/cpu/jit_gemm.h"
#include "base/error.h"
#include "base/io.h"
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
    // appears - rather than after loading and a first step. No clock decides it: the signal goes
    // once the process catches it, and a busy machine only makes the loading slower.
    const std::vector<std::string> slow{"train", cfg, "--output", d / "slow", "--set", "data.train_samples=20000000"};
    const std::string slow_out = d / "slow.txt";
    const pid_t pid = spawn_cli(slow, {}, "/dev/null", Stdout::file, slow_out);
    REQUIRE(wait_until_catches(pid, SIGTERM));
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

namespace {

// The machine cache's entries of one file: key -> value.
std::vector<std::pair<std::string, std::string>> cache_entries(const std::string& file) {
    std::vector<std::pair<std::string, std::string>> entries;
    std::ifstream in(file);
    std::string line;
    while (std::getline(in, line))
        if (const size_t tab = line.find('\t'); tab != std::string::npos)
            entries.emplace_back(line.substr(0, tab), line.substr(tab + 1));
    return entries;
}

std::vector<std::string> split_on(const std::string& text, char sep) {
    std::vector<std::string> parts;
    std::stringstream in(text);
    for (std::string part; std::getline(in, part, sep);) parts.push_back(part);
    return parts;
}

}  // namespace

// MIRRORED_JIT_GEMM=measure (kernels/cpu/gemm_choice.h): the kernel of each product is measured
// once per machine and cached; a later run reads the cache; a checkpoint records the choices and
// a resume adopts them even where the cache is gone, so the resumed run is bit-identical. The
// cache is edited to OpenBLAS everywhere (the other kernels measured still listed, slower), which
// a fresh measurement on this machine would not pick for every product (the JIT kernels win the
// smallest): a resume that measured afresh instead of adopting would round differently.
TEST_CASE("GEMM kernels measured per product: later runs reuse the cache, a resume adopts the checkpoint's, exactly") {
    if (jit_gemm_description().empty()) {
        mark_skipped("no JIT GEMM kernels here: OpenBLAS as asked or turned, the kernels left, sum alike");
        return;
    }
    TempDir d;
    const std::string cfg = d.write("c.yaml", kRun), ref = d / "ref", out = d / "run", cache = d / "cache";
    const std::vector<std::pair<std::string, std::string>> measure{{"MIRRORED_JIT_GEMM", "measure"},
                                                                   {"MIRRORED_CACHE_DIR", cache}};
    REQUIRE(run_cli({"train", cfg, "--output", d / "first"}, measure) == kExitOk);
    const std::string file = cache + "/gemm-kernels.txt";
    auto entries = cache_entries(file);
    REQUIRE(entries.size() >= 2);         // the dense layers' products with more than one kernel that fits
    for (auto& [key, value] : entries) {  // OpenBLAS first and fastest, every kernel measured still listed
        CHECK(key.find("measured per product|") != std::string::npos);
        std::istringstream measured(value);
        std::string kernel, rate, edited = "openblas 999.0";
        while (measured >> kernel >> rate)
            if (kernel != "openblas") edited += " " + kernel + " 1.0";
        value = edited;
    }
    {
        std::ofstream rewrite(file, std::ios::trunc);
        for (const auto& [key, value] : entries) rewrite << key << '\t' << value << '\n';
    }
    REQUIRE(run_cli({"train", cfg, "--output", ref}, measure) == kExitOk);
    auto stop = measure;
    stop.emplace_back("MIRRORED_TEST_STOP_AFTER_STEP", "20");
    REQUIRE(run_cli({"train", cfg, "--output", out}, stop) == kExitInterrupted);
    const auto written = read_safetensors(list_checkpoints(out + "/checkpoints").front(), true).metadata;
    CHECK(written.at("blas_kernel").find(", measured per product") != std::string::npos);
    const std::vector<std::string> choices = split_on(written.at("gemm_choices"), ';');
    CHECK(choices.size() == entries.size());
    for (const std::string& c : choices) CHECK(c.substr(c.find('=')) == "=openblas");
    {  // a copy resumed with the static rules says how to resume on the measured choices
        const std::string other = d / "other", rules_log = d / "rules.txt";
        fs::copy(out, other, fs::copy_options::recursive);
        REQUIRE(run_cli({"train", cfg, "--output", other},
                        {{"MIRRORED_JIT_GEMM", "rules"}, {"MIRRORED_TEST_STOP_AFTER_STEP", "21"}}, -1, nullptr,
                        Stdout::file, rules_log) == kExitInterrupted);
        const std::string printed(std::istreambuf_iterator<char>(std::ifstream(rules_log).rdbuf()), {});
        CHECK(printed.find("to resume bit-identically, rerun with MIRRORED_JIT_GEMM=measure") != std::string::npos);
        CHECK(printed.find("product shapes as the checkpoint's run measured them") == std::string::npos);
    }
    {  // a choice this build cannot run (a later version's kernel): said, not dropped silently
        const std::string later = d / "later", later_log = d / "later.txt";
        fs::copy(out, later, fs::copy_options::recursive);
        const std::string newest = list_checkpoints(later + "/checkpoints").front();
        SafetensorsFile f = read_safetensors(newest, true);
        f.metadata["gemm_choices"] += ";nt:8x8x8:8,8,8:0=kernel-of-a-later-version";
        write_safetensors(newest, f, true);
        REQUIRE(run_cli({"train", cfg, "--output", later},
                        {{"MIRRORED_JIT_GEMM", "measure"},
                         {"MIRRORED_CACHE_DIR", d / "later-cache"},
                         {"MIRRORED_TEST_STOP_AFTER_STEP", "21"}},
                        -1, nullptr, Stdout::file, later_log) == kExitInterrupted);
        const std::string printed(std::istreambuf_iterator<char>(std::ifstream(later_log).rdbuf()), {});
        CHECK(printed.find("GEMM kernels of " + std::to_string(choices.size()) +
                           " product shapes as the checkpoint's run measured them") != std::string::npos);
        CHECK(printed.find("note: 1 of the checkpoint's " + std::to_string(choices.size() + 1) +
                           " GEMM kernel choices are not ones this build can run here") != std::string::npos);
    }
    // resumed without the cache: the checkpoint's choices, not a new measurement
    const std::string log = d / "resume.txt";
    REQUIRE(run_cli({"train", cfg, "--output", out},
                    {{"MIRRORED_JIT_GEMM", "measure"}, {"MIRRORED_CACHE_DIR", d / "empty-cache"}}, -1, nullptr,
                    Stdout::file, log) == kExitOk);
    const std::string printed(std::istreambuf_iterator<char>(std::ifstream(log).rdbuf()), {});
    CHECK(printed.find("GEMM kernels of " + std::to_string(choices.size()) +
                       " product shapes as the checkpoint's run measured them") != std::string::npos);
    expect_same_run(ref, out);
    const auto resumed = read_safetensors(list_checkpoints(out + "/checkpoints").back(), true).metadata;
    for (const std::string& c : split_on(resumed.at("gemm_choices"), ';')) CHECK(c.substr(c.find('=')) == "=openblas");
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
    CHECK(err.find("is the checkpoint, which this command reads") != std::string::npos);
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
         {Case{{"--dump-inputs", ckpt_other},
               "--dump-inputs " + ckpt_other + ": is the checkpoint, which this command reads"},
          Case{{"--dump-logits", ckpt}, "is the checkpoint, which this command reads"},
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
    // (and with checkpoint.resume: never, which cannot start afresh there: exit 4)
    const std::string log = d / "ro.log", never_log = d / "never.log";
    const std::string script = "mount --bind '" + out + "' '" + out + "' && mount -o remount,ro,bind '" + out +
                               "' && touch '" + out + "/probe' 2>/dev/null; test ! -e '" + out + "/probe' && '" +
                               cli() + "' train '" + cfg + "' --output '" + out + "' > '" + log + "' 2>&1; '" + cli() +
                               "' train '" + cfg + "' --output '" + out + "' --set checkpoint.resume=never > '" +
                               never_log + "' 2>&1; echo \\$? >> '" + never_log + "'";
    const int rc = std::system(("unshare -m sh -c \"" + script + "\"").c_str());
    if (!fs::exists(log)) {
        mark_skipped("cannot make a read-only mount here (unshare -m needs root and CAP_SYS_ADMIN)");
        return;
    }
    CHECK(WEXITSTATUS(rc) == 0);
    const std::string text(std::istreambuf_iterator<char>(std::ifstream(log).rdbuf()), {});
    CHECK(text.find("is complete (the folder cannot be written") != std::string::npos);
    CHECK(text.find("\"status\": \"completed\"") != std::string::npos);
    const std::string never(std::istreambuf_iterator<char>(std::ifstream(never_log).rdbuf()), {});
    CHECK(never.find("cannot start afresh as checkpoint.resume: never asks") != std::string::npos);
    CHECK(never.find("\n4\n") != std::string::npos);
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

TEST_CASE("batch statistics over one value per channel are refused, naming the layer; sync or a larger batch pass") {
    TempDir d;
    const std::string cfg = d.write("bn.yaml", R"(run: {name: bn, seed: 3}
strategy: {devices: "cpu:4"}
data: {dataset: synthetic, input_shape: [8], classes: 3, train_samples: 64, test_samples: 16}
model:
  layers:
    - {type: dense, units: 8}
    - {type: batchnorm, activation: relu}
    - {type: dense, units: 3}
optimizer: {type: sgd, lr: 0.05}
train: {epochs: 1, global_batch_size: 4, log_every_steps: 100}
checkpoint: {every_steps: 0}
)");
    std::string err;
    // one sample per replica
    CHECK(run_cli({"train", cfg, "--output", d / "a"}, {}, -1, &err) == kExitUsage);
    CHECK(err.find("model.layers.1") != std::string::npos);
    CHECK(err.find("1 value per channel") != std::string::npos);
    CHECK(err.find("sync: true") != std::string::npos);
    CHECK(!fs::exists(d / "a/checkpoints"));
    // one sample per micro-batch: 2 replicas x 2 accumulation steps
    CHECK(run_cli({"train", cfg, "--output", d / "b", "--set", "strategy.devices=cpu:2", "--set",
                   "train.grad_accumulation_steps=2"},
                  {}, -1, &err) == kExitUsage);
    CHECK(err.find("model.layers.1") != std::string::npos);
    // the last partial batch of an epoch: 66 samples in batches of 8 over 4 replicas leave 2,
    // one per replica on two of them
    CHECK(run_cli({"train", cfg, "--output", d / "c", "--set", "train.global_batch_size=8", "--set",
                   "data.train_samples=66", "--set", "data.drop_last=false"},
                  {}, -1, &err) == kExitUsage);
    CHECK(err.find("last batch of an epoch: 2 of 66") != std::string::npos);
    // statistics over the whole job, or two samples a replica, train
    CHECK(run_cli({"train", cfg, "--output", d / "e", "--set", "model.layers.1.sync=true"}) == kExitOk);
    CHECK(run_cli({"train", cfg, "--output", d / "f", "--set", "train.global_batch_size=8"}) == kExitOk);
    // a convolution's batchnorm counts every pixel: one image of 2x2 has 4 values per channel
    const std::string conv = d.write("conv.yaml", R"(run: {name: bnc, seed: 3}
strategy: {devices: "cpu:2"}
data: {dataset: synthetic, input_shape: [2, 2, 1], classes: 3, train_samples: 16, test_samples: 4}
model:
  layers:
    - {type: conv2d, filters: 2, kernel_size: 1}
    - {type: batchnorm, activation: relu}
    - {type: flatten}
    - {type: dense, units: 3}
optimizer: {type: sgd, lr: 0.05}
train: {epochs: 1, global_batch_size: 2, log_every_steps: 100}
checkpoint: {every_steps: 0}
)");
    CHECK(run_cli({"train", conv, "--output", d / "g"}, {}, -1, &err) == kExitOk);
}

TEST_CASE("the memory limit is the tightest cgroup on the process's path, v2, v1 and hybrid") {
    TempDir d;
    const std::string root = d / "cg";
    auto put = [&](const std::string& rel, const std::string& text) {
        fs::create_directories(fs::path(root + rel).parent_path());
        std::ofstream(root + rel) << text << "\n";
    };
    // v2: a limit on the parent of the process's group, none on its own, a looser one at the root
    put("/memory.max", "max");
    put("/user.slice/memory.max", "8589934592");
    put("/user.slice/memory.current", "1073741824");
    put("/user.slice/run-1.scope/memory.max", "max");
    put("/user.slice/run-1.scope/memory.current", "1048576");
    CgroupMemory m = cgroup_memory("0::/user.slice/run-1.scope\n", root);
    CHECK(m.limit == 8589934592ull);
    CHECK(m.used == 1073741824ull);
    CHECK(m.file == root + "/user.slice/memory.max");
    // a tighter limit deeper down wins
    put("/user.slice/run-1.scope/memory.max", "2147483648");
    m = cgroup_memory("0::/user.slice/run-1.scope\n", root);
    CHECK(m.limit == 2147483648ull);
    CHECK(m.used == 1048576ull);
    // v1: the memory controller's hierarchy; "unlimited" is a huge number
    put("/memory/memory.limit_in_bytes", "9223372036854771712");
    put("/memory/job/memory.limit_in_bytes", "4294967296");
    put("/memory/job/memory.usage_in_bytes", "100");
    put("/memory/job/task/memory.limit_in_bytes", "9223372036854771712");
    m = cgroup_memory("4:memory:/job/task\n3:cpu,cpuacct:/job\n", root);
    CHECK(m.limit == 4294967296ull);
    CHECK(m.used == 100);
    CHECK(m.file == root + "/memory/job/memory.limit_in_bytes");
    // hybrid: v1 memory beside an empty v2 under unified/; a controller list naming memory among others
    put("/unified/job/task/memory.max", "3221225472");
    m = cgroup_memory("0::/job/task\n7:cpuset,memory:/job/task\n", root);
    CHECK(m.limit == 3221225472ull);
    // none set, a path that is not there, garbage
    CHECK(cgroup_memory("0::/nowhere\n", d / "empty").limit == 0);
    CHECK(cgroup_memory("garbage\n::\n0::relative\n0::/../../etc\n", root).limit == 0);
}

// Checkpoints rewritten by hand with a valid checksum: what the checksum cannot catch, the loader
// must. Each case fails on every path that reads the file (resume, eval, export).
TEST_CASE(
    "crafted checkpoints with a valid checksum: non-finite values, negative second moments, impossible steps and "
    "epochs, missing tensors") {
    TempDir d;
    std::string adamw = kRun;  // AdamW: its squared-gradient average is one of the values crafted
    const std::string sgd = "optimizer: {type: sgd, lr: 0.05}";
    adamw.replace(adamw.find(sgd), sgd.size(), "optimizer: {type: adamw, lr: 0.01}");
    const std::string cfg = d.write("c.yaml", adamw), out = d / "run";
    REQUIRE(run_cli({"train", cfg, "--output", out, "--set", "train.epochs=1"}) == kExitOk);
    const std::string good = list_checkpoints(out + "/checkpoints").front();  // the newest: step 20
    struct Case {
        std::string name;
        std::function<void(SafetensorsFile&)> craft;
        std::string want;
    };
    const std::vector<Case> cases{
        {"nan", [](SafetensorsFile& f) { f.tensors.at("layers.0.weight").second[5] = NAN; },
         "layers.0.weight element 5 is not finite"},
        {"inf", [](SafetensorsFile& f) { f.tensors.at("layers.1.bias").second[0] = -INFINITY; },
         "layers.1.bias element 0 is not finite"},
        {"negative",
         [](SafetensorsFile& f) { f.tensors.at("optimizer.exp_avg_sq.layers.0.weight").second[3] = -1e-6f; },
         "optimizer.exp_avg_sq.layers.0.weight element 3 is negative"},
        {"step", [](SafetensorsFile& f) { f.metadata["step"] = "1000"; }, "beyond this run's"},
        {"epoch", [](SafetensorsFile& f) { f.metadata["loader_epoch"] = "999999999"; }, "which no run reaches"},
        {"missing", [](SafetensorsFile& f) { f.tensors.erase("layers.1.weight"); }, "layers.1.weight"},
    };
    for (const Case& c : cases) {
        CAPTURE(c.name);
        // a run folder whose newest checkpoint is the crafted one
        const std::string run = d / ("run-" + c.name);
        fs::copy(out, run, fs::copy_options::recursive);
        fs::remove(run + "/summary.json");
        SafetensorsFile f = read_safetensors(good, true);
        c.craft(f);
        const std::string crafted = run + "/checkpoints/" + fs::path(good).filename().string();
        write_safetensors(crafted, f, true);
        CHECK_NOTHROW(read_safetensors(crafted, true));  // the checksum holds
        // eval and export read every tensor as a resume does (a step count is theirs to report)
        std::string err;
        const int want_rc = c.name == "step" ? kExitOk : kExitCheckpoint;
        CHECK(run_cli({"eval", cfg, "--checkpoint", crafted}, {}, -1, &err) == want_rc);
        if (want_rc != kExitOk) CHECK(err.find(c.want) != std::string::npos);
        const std::string exported = d / ("w-" + c.name + ".safetensors");
        CHECK(run_cli({"export", crafted, "--out", exported}, {}, -1, &err) == want_rc);
        CHECK(fs::exists(exported) == (want_rc == kExitOk));
        // resume, named: refused; found by auto-resume: skipped for the one before it, saying why
        CHECK(
            run_cli({"train", cfg, "--output", run, "--set", "train.epochs=2", "--set", "checkpoint.resume=" + crafted},
                    {}, -1, &err) == kExitCheckpoint);
        CHECK(err.find(c.want) != std::string::npos);
        const std::string log = d / "resume.log";
        const int rc =
            run_cli({"train", cfg, "--output", run, "--set", "train.epochs=2"}, {}, -1, &err, Stdout::file, log);
        CHECK(err.find(c.want) != std::string::npos);
        CHECK(err.find("last good") == std::string::npos);
        if (c.name == "step") {  // a checkpoint of a longer run: this run is not its continuation
            CHECK(rc == kExitCheckpoint);
        } else {
            CHECK(rc == kExitOk);
            CHECK(err.find("skipping unusable checkpoint: " + crafted) != std::string::npos);
            const std::string text{std::istreambuf_iterator<char>(std::ifstream(log).rdbuf()), {}};
            CHECK(text.find("resuming from " + run + "/checkpoints/step-0000000010.safetensors") != std::string::npos);
        }
    }
}

TEST_CASE("careless environment variables and options: range-checked, refused with exit 2, never a hang or a kill") {
    TempDir d;
    const std::string cfg = d.write("c.yaml", kRun);
    std::string err;
    // a delay of a day per simulated stream operation; test hooks with values no test gives
    CHECK(run_cli({"train", cfg, "--output", d / "a", "--devices", "sim:0,1"},
                  {{"MIRRORED_SIM_DELAY_US", "99999999999"}}, -1, &err) == kExitUsage);
    CHECK(err.find("MIRRORED_SIM_DELAY_US=99999999999: expected an integer from 0 to 1000000") != std::string::npos);
    CHECK(run_cli({"train", cfg, "--output", d / "b"}, {{"MIRRORED_TEST_KILL_DURING_CHECKPOINT", "-1"}}, -1, &err) ==
          kExitUsage);
    CHECK(err.find("MIRRORED_TEST_KILL_DURING_CHECKPOINT=-1: expected an integer from 0") != std::string::npos);
    CHECK(!fs::exists(d / "b/checkpoints"));
    CHECK(run_cli({"train", cfg, "--output", d / "c"}, {{"MIRRORED_TEST_STOP_AFTER_STEP", "ten"}}, -1, &err) ==
          kExitUsage);
    // the BLAS probe's variable is its parent's to set: from a user it changes nothing
    CHECK(run_cli({"train", cfg, "--output", d / "p", "--set", "train.epochs=1"}, {{"MIRRORED_BLAS_PROBE", "1"}}) ==
          kExitOk);
    CHECK(fs::exists(d / "p/summary.json"));
    // options that would be silently ignored
    CHECK(run_cli({"scale", cfg, "--replicas", ""}, {}, -1, &err) == kExitUsage);
    CHECK(err.find("--replicas: expected a list of positive integers") != std::string::npos);
    for (const char* flag : {"--memory-gb", "--tflops", "--network-gbs", "--bus-gbs"}) {
        CAPTURE(flag);
        CHECK(run_cli({"plan", cfg, "--gpus", "2", flag, "0"}, {}, -1, &err) == kExitUsage);
        CHECK(err.find("expected a number above 0, got '0'") != std::string::npos);
    }
    const std::string plan_out = d / "plan.txt";
    CHECK(run_cli({"plan", cfg, "--gpus", "2"}, {}, -1, &err, Stdout::file, plan_out) == kExitOk);
    CHECK(std::string(std::istreambuf_iterator<char>(std::ifstream(plan_out).rdbuf()), {})
              .find("GPU h100 (the default: --gpu names yours)") != std::string::npos);
    // scale --out onto a file: exit 2 before anything is measured
    const std::string file = d.write("taken", "x");
    CHECK(run_cli({"scale", cfg, "--out", file}, {}, -1, &err) == kExitUsage);
    CHECK(err.find("--out " + file + ": is a file") != std::string::npos);
    CHECK(run_cli({"export", "any.safetensors", "--out", ""}, {}, -1, &err) == kExitUsage);
    CHECK(err.find("--out: expected a file name") != std::string::npos);
}

TEST_CASE("SIGINT as soon as a training process can take it ends it with exit 130, not by the signal") {
    TempDir d;
    const std::string cfg = d.write("c.yaml", kRun);
    for (int round = 0; round < 3; ++round) {
        const pid_t pid = spawn_cli({"train", cfg, "--output", d / ("r" + std::to_string(round))}, {}, "/dev/null");
        REQUIRE(wait_until_catches(pid, SIGINT));  // the moment it can: main's first step
        ::kill(pid, SIGINT);
        CHECK(wait_status(pid) == kExitInterrupted);
    }
}

TEST_CASE("SIGINT while the shared libraries initialise (cuBLASLt's take ~50 ms) ends a run with exit 130") {
    // a library preloaded into the trainer raises SIGINT from its initialiser, as a user's Ctrl-C
    // would land while the libraries start: the handlers must already be in
    TempDir d;
    const std::string source =
        d.write("raise.c",
                "#include <signal.h>\n"
                "__attribute__((constructor)) static void raise_sigint(void) { raise(SIGINT); }\n");
    std::string err;
    if (run_program("cc", {"-shared", "-fPIC", "-o", d / "raise.so", source}, &err) != 0) {
        mark_skipped("no C compiler (cc) to build the preloaded library: " + err.substr(0, 200));
        return;
    }
    const std::string cfg = d.write("c.yaml", kRun);
    const pid_t pid = spawn_cli({"train", cfg, "--output", d / "r"}, {{"LD_PRELOAD", d / "raise.so"}}, d / "err.txt");
    CHECK(wait_status(pid) == kExitInterrupted);
    CHECK(read_text(d / "err.txt").find("interrupted") != std::string::npos);
    CHECK_FALSE(fs::exists(d / "r/summary.json"));
}

TEST_CASE("a BLAS kernel cache entry that is tampered with is measured again; one that is used is said to be") {
    TempDir d;
    const std::string cache = d / "cache", out = d / "devices.txt";
    // Haswell's kernel on a CPU that may run a faster one: the choice is measured (or taken from
    // the cache); a CPU without a faster class keeps its kernel and has nothing to cache
    const std::vector<std::pair<std::string, std::string>> env{
        {"MIRRORED_CACHE_DIR", cache}, {"OPENBLAS_CORETYPE", "Haswell"}, {"MIRRORED_BLAS_INHERITED", ""}};
    auto blas_line = [&] { return devices_blas_line(out, env); };
    const std::string first = blas_line();
    if (!fs::exists(cache + "/blas-kernel.txt")) {
        mark_skipped("this CPU runs no faster kernel class than Haswell's: nothing is measured or cached");
        return;
    }
    // what the measurement found depends on the machine's load (a faster kernel must win by 5%):
    // switched, or kept Haswell's; either is said, and either is cached
    const std::string entry(std::istreambuf_iterator<char>(std::ifstream(cache + "/blas-kernel.txt").rdbuf()), {});
    const bool switched = entry.find("\tHaswell ") == std::string::npos;
    CAPTURE(entry);
    CHECK(first.find(switched ? "chosen by mirrored by measurement:" : "measured the fastest of the kernels") !=
          std::string::npos);
    CHECK(blas_line().find("on an earlier start (from the machine cache") != std::string::npos);
    // NaN, then (when the choice switched kernels) another starting kernel, one neither chosen nor
    // started on: measured again, and the entry written anew. (An entry that kept Haswell's kernel
    // serves any process started on Haswell, whatever it names as the start.)
    const std::string other = entry.find("\tZen ") != std::string::npos ? "Prescott" : "Zen";
    std::vector<std::string> tampers{"nan"};
    if (switched) tampers.push_back(other);
    for (const std::string& bad : tampers) {
        CAPTURE(bad);
        std::string text(std::istreambuf_iterator<char>(std::ifstream(cache + "/blas-kernel.txt").rdbuf()), {});
        const size_t tab = text.find('\t');
        REQUIRE(tab != std::string::npos);
        std::istringstream fields(text.substr(tab + 1));
        std::string core, gflops, own, own_gflops;
        fields >> core >> gflops >> own >> own_gflops;
        // the NaN's new measurement may have kept Haswell's kernel (the machine's load decides):
        // such an entry serves a Haswell start whatever start it names, so there is nothing to test
        if (bad == other && core == "Haswell") break;
        const std::string tampered = bad == "nan" ? core + " nan " + own + " " + own_gflops
                                                  : core + " " + gflops + " " + other + " " + own_gflops;
        std::ofstream(cache + "/blas-kernel.txt") << text.substr(0, tab + 1) << tampered << "\n";
        const std::string line = blas_line();
        CHECK(line.find("earlier start") == std::string::npos);
        const std::string now(std::istreambuf_iterator<char>(std::ifstream(cache + "/blas-kernel.txt").rdbuf()), {});
        CHECK(now.find(" nan ") == std::string::npos);
        CHECK(now.find(" " + other + " ") == std::string::npos);
    }
    // a process started on the kernel an entry chose (as the processes a re-executed one starts
    // are) takes the entry, not a new measurement from there
    std::string text(std::istreambuf_iterator<char>(std::ifstream(cache + "/blas-kernel.txt").rdbuf()), {});
    const std::string key = text.substr(0, text.find('\t'));
    std::ofstream(cache + "/blas-kernel.txt") << key << "\tHaswell 99.0 Prescott 50.0\n";
    const std::string line = blas_line();
    CAPTURE(line);
    CHECK(line.find("kernel Haswell (") != std::string::npos);
    CHECK(line.find("earlier start (from the machine cache") != std::string::npos);
    const std::string kept(std::istreambuf_iterator<char>(std::ifstream(cache + "/blas-kernel.txt").rdbuf()), {});
    CHECK(kept == key + "\tHaswell 99.0 Prescott 50.0\n");  // not measured again
}
