// Trainer: a real short run whose loss falls; resume equivalence after interruptions at several
// points (SIGINT path, a kill during a checkpoint write, SIGKILL at an arbitrary moment);
// corrupt, truncated and foreign checkpoints; export round-trip; exit codes of the CLI.
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "base/error.h"
#include "mirrored/bottlenecks.h"
#include "mirrored/checkpoint.h"
#include "mirrored/config.h"
#include "mirrored/failover.h"
#include "kernels/sim/sim.h"
#include "mirrored/evaluation.h"
#include "mirrored/trainer.h"
#include "tests/cli.h"
#include "tests/helpers.h"
#include "tests/run_folder.h"

using namespace mirrored;
using json = nlohmann::json;
using namespace mirrored::test;
namespace fs = std::filesystem;

namespace {

const char* kTiny = R"(run: {name: tiny, seed: 3}
strategy: {devices: "cpu:2", bucket_mb: 0.0002, verify_every_steps: 10}
data: {dataset: synthetic, input_shape: [20], classes: 4, train_samples: 1000, test_samples: 200}
model:
  layers:
    - {type: dense, units: 32, activation: relu}
    - {type: dropout, rate: 0.1}
    - {type: dense, units: 4}
optimizer: {type: adamw, lr: 0.01, weight_decay: 0.01, grad_clip_norm: 1.0, schedule: {type: cosine, warmup_steps: 5}}
train: {epochs: 5, global_batch_size: 32, log_every_steps: 10}
checkpoint: {every_steps: 7, keep: 2}
)";

// A run folder with the test config written into it.
struct Scratch : test::TempDir {
    std::string config(const std::string& text = kTiny, const std::string& name = "tiny.yaml") const {
        return write(name, text);
    }
    std::string out(const std::string& name) const { return *this / name; }
};

struct EnvGuard {
    const char* name;
    EnvGuard(const char* n, const std::string& v) : name(n) { ::setenv(n, v.c_str(), 1); }
    ~EnvGuard() { ::unsetenv(name); }
};

// The run's progress (its header and status lines) is not the test log's: discarded unless
// MIRRORED_TEST_VERBOSE is set. Errors and alerts still reach stderr.
std::FILE* progress_output() {
    static std::FILE* const out = std::getenv("MIRRORED_TEST_VERBOSE") ? stdout : std::fopen("/dev/null", "w");
    return out ? out : stdout;
}

int train_in_process(const std::string& config, const std::string& out, std::vector<std::string> sets = {}) {
    sets.push_back("run.output_dir=" + out);
    return run_training(load_config(config, sets), nullptr, progress_output());
}

double now_seconds() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// A moment inside a run that took `duration` seconds end to end (start-up included): 30-80% in,
// so that the kill lands mid-training however fast this machine is.
double kill_point(double duration, test::Rng& rng) { return duration * (0.3 + 0.01 * rng.integer(0, 50)); }

// `train CONFIG --output OUT` with its progress into OUT.txt: what it printed, and how long it took
// end to end.
std::pair<std::string, double> train_printing(const std::string& config, const std::string& out) {
    const double t0 = now_seconds();
    REQUIRE(run_cli({"train", config, "--output", out}, {}, -1, nullptr, Stdout::file, out + ".txt") == kExitOk);
    const double duration = now_seconds() - t0;
    std::ifstream printed(out + ".txt");
    return {std::string((std::istreambuf_iterator<char>(printed)), {}), duration};
}

// The run of `config` SIGKILLed at a point picked by `seed` in a run of `duration` seconds (unless it
// finished first), then run again into the same folder: it must equal `ref` bit for bit.
void expect_killed_run_resumes(const std::string& config, const std::string& ref, const std::string& out,
                               double duration, uint64_t seed) {
    test::Rng rng(seed);
    const double when = kill_point(duration, rng);
    CAPTURE(when);
    const int first = run_cli({"train", config, "--output", out}, {}, when);
    CHECK((first == 128 + SIGKILL || first == kExitOk));
    CHECK(run_cli({"train", config, "--output", out}) == kExitOk);
    expect_same_run(ref, out);
}

}  // namespace

TEST_CASE("a short real training run on CPU replicas: the loss falls, outputs are written") {
    Scratch s;
    const std::string out = s.out("run");
    CHECK(train_in_process(s.config(), out) == kExitOk);
    const auto m = metrics(out);
    REQUIRE(m.size() > 4);
    CHECK(m.front()["type"] == "train");
    CHECK(m.back()["type"] == "eval");
    double first = -1, last = -1;
    for (const auto& j : m)
        if (j["type"] == "train") {
            if (first < 0) first = j["loss"];
            last = j["loss"];
        }
    CHECK(last < 0.6 * first);
    const json sum = summary(out);
    CHECK(sum["status"] == "completed");
    CHECK(sum["steps"] == 155);
    CHECK(sum["replicas"] == 2);
    CHECK(sum["test_accuracy"].get<double>() > 0.7);
    CHECK(sum["resumed_from_step"].is_null());
    CHECK(sum["replica_checksums"].size() == 2);
    CHECK(sum["replica_checksums"][0] == sum["replica_checksums"][1]);
    for (const char* k :
         {"train_loss", "epochs", "global_batch_size", "devices", "samples_per_sec", "wall_time_s", "time_split"})
        CHECK(sum.contains(k));
    CHECK(fs::exists(out + "/config.yaml"));
    CHECK(list_checkpoints(out + "/checkpoints").size() == 2);  // keep: 2
}

TEST_CASE("resume after an interruption at several points is bit-identical to an uninterrupted run") {
    Scratch s;
    const std::string cfg = s.config();
    const std::string ref = s.out("ref");
    REQUIRE(train_in_process(cfg, ref) == kExitOk);
    for (int stop : {3, 7, 33, 100}) {  // before the first checkpoint, on one, mid-epoch, late
        CAPTURE(stop);
        const std::string out = s.out("stop" + std::to_string(stop));
        {
            EnvGuard g("MIRRORED_TEST_STOP_AFTER_STEP", std::to_string(stop));
            CHECK(train_in_process(cfg, out) == kExitInterrupted);
        }
        CHECK(summary(out)["status"] == "interrupted");
        CHECK(train_in_process(cfg, out) == kExitOk);
        CHECK(summary(out)["resumed_from_step"] == stop);
        expect_same_run(ref, out);
    }
}

TEST_CASE("shared parameters: stop or SIGKILL, then resume, is bit-identical; the header and summary say so") {
    Scratch s;
    std::string text = kTiny;
    text.replace(text.find("verify_every_steps: 10}"), 23, "verify_every_steps: 10, shared_parameters: true}");
    text.replace(text.find("epochs: 5"), 9, "epochs: 20");
    const std::string cfg = s.config(text);
    const std::string ref = s.out("ref");
    const auto [printed, duration] = train_printing(cfg, ref);
    CHECK(printed.find("cross-device ops shared") != std::string::npos);
    CHECK(printed.find("shared parameters: the CPU replicas keep one parameter copy") != std::string::npos);
    CHECK(summary(ref)["cross_device_ops"] == "shared");
    const std::string stopped = s.out("stopped");
    {
        EnvGuard g("MIRRORED_TEST_STOP_AFTER_STEP", "45");
        CHECK(train_in_process(cfg, stopped) == kExitInterrupted);
    }
    CHECK(train_in_process(cfg, stopped) == kExitOk);
    expect_same_run(ref, stopped);
    expect_killed_run_resumes(cfg, ref, s.out("killed"), duration, 12);
}

namespace {

// kTiny on 4 replicas for 20 epochs with strategy.shard: mode.
std::string sharded_tiny(const std::string& mode) {
    std::string text = kTiny;
    text.replace(text.find("\"cpu:2\""), 7, "\"cpu:4\"");
    text.replace(text.find("verify_every_steps: 10}"), 23, "verify_every_steps: 10, shard: " + mode + "}");
    text.replace(text.find("epochs: 5"), 9, "epochs: 20");
    return text;
}

// Without clipping, strategy.shard `mode` adds as `none` does: stopped at step 40 in either and
// resumed in the other, the run goes on as `plain` (unsharded) did, bit for bit.
// `sets`: more settings for every run, `plain`'s included. exact false: within rounding.
void expect_switch_continues(const Scratch& s, const std::string& cfg, const std::string& plain,
                             const std::string& mode, const std::vector<std::string>& sets = {}, bool exact = true) {
    for (const std::string& from : {std::string("none"), mode}) {
        CAPTURE(from);
        const std::string to = from == "none" ? mode : "none";
        const std::string out = s.out("switched_from_" + from + std::to_string(sets.size()));
        auto with = [&](const std::string& shard) {
            std::vector<std::string> v = sets;
            v.insert(v.end(), {"optimizer.grad_clip_norm=0", "strategy.shard=" + shard});
            return v;
        };
        {
            EnvGuard g("MIRRORED_TEST_STOP_AFTER_STEP", "40");
            CHECK(train_in_process(cfg, out, with(from)) == kExitInterrupted);
        }
        CHECK(train_in_process(cfg, out, with(to)) == kExitOk);
        CHECK(summary(out)["resumed_from_step"] == 40);
        if (exact) expect_same_run(plain, out);
        else
            CHECK(summary(out)["test_loss"].get<double>() ==
                  doctest::Approx(summary(plain)["test_loss"].get<double>()).epsilon(5e-3));
    }
}

}  // namespace

TEST_CASE("strategy.shard optimizer: SIGKILL then resume is bit-identical; its checkpoint resumes unsharded on 2") {
    Scratch s;
    const std::string cfg = s.config(sharded_tiny("optimizer"));
    const std::string ref = s.out("ref");
    const auto [printed, duration] = train_printing(cfg, ref);
    CHECK(printed.find("shard: optimizer - each replica keeps the optimizer state of its own chunk") !=
          std::string::npos);
    CHECK(summary(ref)["shard"] == "optimizer");
    CHECK(summary(ref)["test_accuracy"].get<double>() > 0.5);
    expect_killed_run_resumes(cfg, ref, s.out("killed"), duration, 21);
    // stopped while sharded on 4 replicas, resumed unsharded on 2: the checkpoint holds the whole
    // state, so the run goes on where it stopped (its sums in another order: close, not equal)
    const std::string moved = s.out("moved");
    {
        EnvGuard g("MIRRORED_TEST_STOP_AFTER_STEP", "40");
        CHECK(train_in_process(cfg, moved) == kExitInterrupted);
    }
    CHECK(train_in_process(cfg, moved, {"strategy.shard=none", "strategy.devices=cpu:2"}) == kExitOk);
    CHECK(summary(moved)["resumed_from_step"] == 40);
    CHECK(summary(moved)["shard"] == "none");
    CHECK(summary(moved)["test_loss"].get<double>() ==
          doctest::Approx(summary(ref)["test_loss"].get<double>()).epsilon(5e-3));
    // without clipping both modes add alike: a switch of mode at a resume, either way, continues the
    // run bit for bit - the whole state went into the checkpoint and back where it belongs
    const std::vector<std::string> no_clip{"optimizer.grad_clip_norm=0"};
    const std::string plain = s.out("plain"), sharded = s.out("sharded");
    REQUIRE(train_in_process(cfg, plain, {"optimizer.grad_clip_norm=0", "strategy.shard=none"}) == kExitOk);
    REQUIRE(train_in_process(cfg, sharded, no_clip) == kExitOk);
    expect_same_run(plain, sharded);
    expect_switch_continues(s, cfg, plain, "optimizer");
}

TEST_CASE("strategy.shard gradients: SIGKILL then resume is bit-identical; switched at a resume, either way, exact") {
    Scratch s;
    const std::string cfg = s.config(sharded_tiny("gradients"));
    const std::string ref = s.out("ref");
    const auto [printed, duration] = train_printing(cfg, ref);
    CHECK(printed.find("and gradients: each replica keeps only its own chunks' summed gradients") != std::string::npos);
    CHECK(summary(ref)["shard"] == "gradients");
    CHECK(summary(ref)["test_accuracy"].get<double>() > 0.5);
    expect_killed_run_resumes(cfg, ref, s.out("killed"), duration, 21);
    // One micro-batch, no clipping, buckets larger than any weight: the same additions as the
    // all-reduce's, so a switch of mode at a resume continues the run bit for bit.
    const std::vector<std::string> whole{"strategy.bucket_mb=0.003"};
    const std::string plain = s.out("plain");
    REQUIRE(train_in_process(cfg, plain, {"optimizer.grad_clip_norm=0", "strategy.shard=none", whole[0]}) == kExitOk);
    expect_switch_continues(s, cfg, plain, "gradients", whole);
    // Buckets of 52 floats: shard: gradients writes the 32 x 20 weight's gradient eight rows at a
    // time, each block its own bucket; the products and the ring's chunks add in another order, so the
    // switch continues within rounding.
    const std::string split = s.out("split");
    REQUIRE(train_in_process(cfg, split, {"optimizer.grad_clip_norm=0", "strategy.shard=none"}) == kExitOk);
    expect_switch_continues(s, cfg, split, "gradients", {}, false);
}

TEST_CASE("shard: gradients says where its staging slots outweigh the saving, and what would help") {
    Scratch s;
    // six equal layers, buckets of about one layer: two slots (the one in use and a spare) and the
    // own chunks, 2 x 16.25 + 24.4 KiB, against 97.5 KiB unsharded
    std::string text = R"(run: {name: deep, seed: 3}
strategy: {devices: "cpu:4", bucket_mb: 0.01, shard: gradients}
data: {dataset: synthetic, input_shape: [64], classes: 4, train_samples: 256, test_samples: 64}
model:
  layers:
    - {type: dense, units: 64, activation: relu}
    - {type: dense, units: 64, activation: relu}
    - {type: dense, units: 64, activation: relu}
    - {type: dense, units: 64, activation: relu}
    - {type: dense, units: 64, activation: relu}
    - {type: dense, units: 64}
optimizer: {type: adamw, lr: 0.01}
train: {epochs: 1, global_batch_size: 32}
)";
    const std::string note = "note: shard: gradients keeps more gradient memory here than unsharded";
    const auto [saving, t1] = train_printing(s.config(text, "deep.yaml"), s.out("small_buckets"));
    CHECK(saving.find("2 reused staging slot(s) (gradients 56.9 KiB per replica, unsharded 97.5 KiB)") !=
          std::string::npos);
    CHECK(saving.find(note) == std::string::npos);
    // one bucket: its slot is every gradient, and the own chunks come on top; smaller buckets help
    text.replace(text.find("bucket_mb: 0.01"), 15, "bucket_mb: 0");
    const auto [one_bucket, t2] = train_printing(s.config(text, "one_bucket.yaml"), s.out("one_bucket"));
    CHECK(one_bucket.find(note + " (121.9 KiB against 97.5 KiB): its staging slots (97.5 KiB)") != std::string::npos);
    CHECK(one_bucket.find("(the largest piece, of layers.0.weight, is 16.0 KiB); a smaller strategy.bucket_mb") !=
          std::string::npos);
    // a wide dense layer's weight is written and reduced by blocks of rows: it saves
    text.replace(text.find("bucket_mb: 0"), 12, "bucket_mb: 0.01");
    text.replace(text.find("units: 64, activation: relu}"), 28, "units: 512, activation: relu}");
    const auto [wide, t3] = train_printing(s.config(text, "wide.yaml"), s.out("wide"));
    CHECK(wide.find("2 reused staging slot(s) (gradients 119.1 KiB per replica, unsharded 323.2 KiB)") !=
          std::string::npos);  // was 339.1 KiB, the weight whole in a slot
    CHECK(wide.find(note) == std::string::npos);
    // a convolution's weight of most of the model stays whole, so it fills a slot alone: shard: optimizer keeps less
    const std::string conv = R"(run: {name: conv, seed: 3}
strategy: {devices: "cpu:4", bucket_mb: 0.01, shard: gradients}
data: {dataset: synthetic, input_shape: [4, 4, 32], classes: 4, train_samples: 256, test_samples: 64}
model:
  layers:
    - {type: conv2d, filters: 256, kernel_size: 3, padding: same}
    - {type: global_avgpool}
    - {type: dense, units: 4}
optimizer: {type: adamw, lr: 0.01}
train: {epochs: 1, global_batch_size: 32}
)";
    const auto [one_tensor, t4] = train_printing(s.config(conv, "conv.yaml"), s.out("one_tensor"));
    CHECK(one_tensor.find(note) != std::string::npos);
    CHECK(one_tensor.find("(the largest piece, of layers.0.weight, is 288.0 KiB); that piece fills its slot alone, so "
                          "strategy.shard: optimizer keeps less") != std::string::npos);
}

TEST_CASE(
    "cross_device_ops auto keeps the op a checkpoint was written with: the resume stays exact; another op is said") {
    Scratch s;
    const std::string cfg = s.config();
    const std::string cache = s.out("cache");
    const std::vector<std::string> four{"strategy.devices=cpu:4"};  // 4 replicas: ring and direct sum in other orders
    auto with = [&](const std::string& op) {
        std::vector<std::string> sets = four;
        sets.push_back("strategy.cross_device_ops=" + op);
        return sets;
    };
    auto cli = [&](const std::string& out, const std::string& op, const std::string& stop, const std::string& log) {
        std::vector<std::string> args{"train", cfg,     "--output", out,
                                      "--set", four[0], "--set",    "strategy.cross_device_ops=" + op};
        std::vector<std::pair<std::string, std::string>> env{{"MIRRORED_CACHE_DIR", cache}};
        if (!stop.empty()) env.emplace_back("MIRRORED_TEST_STOP_AFTER_STEP", stop);
        return run_cli(args, env, -1, nullptr, Stdout::file, log);
    };
    // a fresh auto start measures and caches its choice; the checkpoint below is of the other op,
    // so a resume that followed the cache would sum in another order
    CHECK(cli(s.out("probe"), "auto", "3", s.out("probe.txt")) == kExitInterrupted);
    CHECK(read_text(s.out("probe.txt")).find("cross-device ops: auto, measured: ring ") != std::string::npos);
    const std::string cached = summary(s.out("probe"))["cross_device_ops"];
    const std::string other = cached == "ring" ? "direct" : "ring";
    CAPTURE(other);
    const std::string ref = s.out("ref"), diff = s.out("cached-op"), out = s.out("run");
    REQUIRE(train_in_process(cfg, ref, with(other)) == kExitOk);
    REQUIRE(train_in_process(cfg, diff, with(cached)) == kExitOk);
    CHECK(summary(ref)["replica_checksums"] != summary(diff)["replica_checksums"]);  // the test can fail
    CHECK(cli(out, other, "9", s.out("first.txt")) == kExitInterrupted);
    CHECK(cli(out, "auto", "", s.out("resume.txt")) == kExitOk);
    const std::string text = read_text(s.out("resume.txt"));
    CHECK(text.find("cross-device ops: auto, the op of the checkpoint resumed from") != std::string::npos);
    CHECK(text.find("not bit-identically") == std::string::npos);
    CHECK(summary(out)["cross_device_ops"] == other);
    expect_same_run(ref, out);
    // an op named in the config is used, and the resume says it differs from the checkpoint's
    const std::string named = s.out("named");
    CHECK(cli(named, other, "9", s.out("n1.txt")) == kExitInterrupted);
    CHECK(cli(named, cached, "12", s.out("n2.txt")) == kExitInterrupted);
    CHECK(read_text(s.out("n2.txt")).find("written with cross-device ops " + other + ", this run uses " + cached) !=
          std::string::npos);
}

TEST_CASE("checkpoint.every_minutes: checkpoints by wall time, whatever the step; a resume from one is exact") {
    Scratch s;
    const std::string cfg = s.config();
    const std::string ref = s.out("ref"), out = s.out("timed");
    REQUIRE(train_in_process(cfg, ref, {"checkpoint.every_minutes=0"}) == kExitOk);
    // every 0.6 ms of wall time, no step or epoch interval: about one checkpoint every few steps
    const std::vector<std::string> timed{"checkpoint.every_steps=0", "checkpoint.every_minutes=0.00001",
                                         "checkpoint.keep=1000"};
    REQUIRE(train_in_process(cfg, out, timed) == kExitOk);
    const auto ckpts = list_checkpoints(out + "/checkpoints");
    CHECK(ckpts.size() >= 3);  // the final one and at least two by time
    CHECK(checkpoint_step(ckpts.front()) == 155);
    expect_same_run(ref, out);  // checkpoints change nothing
    // resume from one in the middle: the same run
    const std::string middle = ckpts[ckpts.size() / 2], resumed = s.out("resumed");
    CAPTURE(middle);
    std::vector<std::string> sets{"checkpoint.resume=" + middle};
    sets.insert(sets.end(), timed.begin(), timed.end());
    REQUIRE(train_in_process(cfg, resumed, sets) == kExitOk);
    CHECK(summary(resumed)["resumed_from_step"] == checkpoint_step(middle));
    CHECK(summary(resumed)["test_accuracy"] == summary(ref)["test_accuracy"]);
    CHECK(summary(resumed)["replica_checksums"] == summary(ref)["replica_checksums"]);
}

TEST_CASE("a kill during a checkpoint write loses nothing: resume from the previous one is identical") {
    Scratch s;
    const std::string cfg = s.config();
    const std::string ref = s.out("ref"), out = s.out("killed");
    REQUIRE(train_in_process(cfg, ref) == kExitOk);
    CHECK(run_cli({"train", cfg, "--output", out}, {{"MIRRORED_TEST_KILL_DURING_CHECKPOINT", "63"}}) == 128 + SIGKILL);
    bool partial = false;
    for (const auto& e : fs::directory_iterator(out + "/checkpoints"))
        partial = partial || e.path().extension() == ".tmp";
    CHECK(partial);  // the interrupted write left only a temporary file
    CHECK(run_cli({"train", cfg, "--output", out}) == kExitOk);
    CHECK(summary(out)["resumed_from_step"] == 56);
    expect_same_run(ref, out);
}

TEST_CASE("SIGKILL at an arbitrary moment: the resumed run is still identical") {
    Scratch s;
    std::string text = kTiny;
    text.replace(text.find("epochs: 5"), 9, "epochs: 100");  // long enough to be killed mid-way
    text.replace(text.find("every_steps: 7"), 14, "every_steps: 3");
    const std::string cfg = s.config(text);
    const std::string ref = s.out("ref"), out = s.out("killed");
    const double t0 = now_seconds();
    REQUIRE(run_cli({"train", cfg, "--output", ref}) == kExitOk);
    test::Rng rng(5);
    double when = kill_point(now_seconds() - t0, rng);
    // A run that finishes before its kill (the machine got less busy than while the reference ran)
    // is tried again, sooner, in a fresh folder: this test is about the kill.
    int killed = kExitOk;
    for (int attempt = 0; attempt < 4; ++attempt) {
        fs::remove_all(out);
        killed = run_cli({"train", cfg, "--output", out}, {}, when);
        if (killed != kExitOk) break;
        when /= 2;
    }
    CAPTURE(when);
    CHECK(killed == 128 + SIGKILL);
    CHECK(run_cli({"train", cfg, "--output", out}) == kExitOk);
    expect_same_run(ref, out);
}

TEST_CASE("a corrupt or truncated newest checkpoint is skipped for the previous one") {
    Scratch s;
    const std::string cfg = s.config();
    const std::string out = s.out("run");
    {
        EnvGuard g("MIRRORED_TEST_STOP_AFTER_STEP", "30");
        REQUIRE(train_in_process(cfg, out) == kExitInterrupted);
    }
    const auto ckpts = list_checkpoints(out + "/checkpoints");
    REQUIRE(ckpts.size() == 2);  // steps 30 and 28
    {                            // flip one byte in the newest one's tensor data
        std::fstream f(ckpts[0], std::ios::in | std::ios::out | std::ios::binary);
        f.seekp(-20, std::ios::end);
        f.put('\x55');
    }
    const Config c = load_config(cfg, {"run.output_dir=" + out});
    auto session = make_session(c, nullptr, false);
    CHECK_THROWS_WITH_AS(
        read_checkpoint(ckpts[0], *session->model, model_config_hash(session->cfg), model_config_summary(session->cfg)),
        doctest::Contains("checksum mismatch"), CheckpointError);
    fs::resize_file(ckpts[1], fs::file_size(ckpts[1]) - 100);
    CHECK_THROWS_WITH_AS(
        read_checkpoint(ckpts[1], *session->model, model_config_hash(session->cfg), model_config_summary(session->cfg)),
        doctest::Contains("truncated"), CheckpointError);
    // both unusable: the run starts over, and the earlier files are moved aside, not deleted
    CHECK(train_in_process(cfg, out) == kExitOk);
    CHECK(summary(out)["resumed_from_step"].is_null());
    bool moved = false;
    for (const auto& e : fs::directory_iterator(out))
        moved = moved || e.path().filename().string().rfind("previous-", 0) == 0;
    CHECK(moved);
    // a corrupt newest with a good older one: resume from the older one
    const std::string out2 = s.out("run2");
    {
        EnvGuard g("MIRRORED_TEST_STOP_AFTER_STEP", "30");
        REQUIRE(train_in_process(cfg, out2) == kExitInterrupted);
    }
    const auto c2 = list_checkpoints(out2 + "/checkpoints");
    fs::resize_file(c2[0], 50);
    CHECK(train_in_process(cfg, out2) == kExitOk);
    CHECK(summary(out2)["resumed_from_step"] == 28);
}

TEST_CASE(
    "pruning weighs only this run's past: a later, unusable or foreign entry is moved aside or left alone, never "
    "counted") {
    Scratch s;
    const std::string cfg = s.config();
    const std::string out = s.out("run"), dir = out + "/checkpoints";
    {
        EnvGuard g("MIRRORED_TEST_STOP_AFTER_STEP", "30");
        REQUIRE(train_in_process(cfg, out) == kExitInterrupted);
    }
    // named like checkpoints of later steps, none written by the trainer; keep: 2 once removed
    // every checkpoint of the run itself for them, the one just written included
    fs::create_directory(dir + "/step-9999999999.safetensors");
    const std::string target = s.out("target.txt");
    std::ofstream(target) << "a file a link points at";
    fs::create_symlink(target, dir + "/step-9999999998.safetensors");
    std::ofstream(dir + "/step-9999999997.safetensors") << "not a checkpoint";
    CHECK(train_in_process(cfg, out) == kExitOk);
    CHECK(summary(out)["resumed_from_step"] == 30);
    auto own = list_checkpoints(dir);
    REQUIRE(own.size() == 2);
    CHECK(checkpoint_step(own[0]) == 155);
    CHECK(checkpoint_step(own[1]) == 154);
    CHECK(fs::is_directory(dir + "/step-9999999999.safetensors"));
    CHECK(fs::is_symlink(dir + "/step-9999999998.safetensors"));
    CHECK(std::ifstream(target).good());
    auto set_aside = [&](const std::string& name) {  // in one of the previous-* folders
        for (const auto& e : fs::directory_iterator(out))
            if (e.path().filename().string().rfind("previous-", 0) == 0 && fs::exists(e.path() / name)) return true;
        return false;
    };
    CHECK(set_aside("step-9999999997.safetensors"));  // unusable: skipped by the resume, kept aside
    // another timeline: resuming from the older, named checkpoint moves the later one aside,
    // and the new timeline's checkpoints are the ones kept
    CHECK(train_in_process(cfg, out, {"checkpoint.resume=" + own[1], "train.epochs=6"}) == kExitOk);
    CHECK(set_aside("step-0000000155.safetensors"));
    bool old_metrics = false;  // the other timeline's metrics went with its checkpoint
    for (const auto& e : fs::directory_iterator(out))
        if (fs::exists(e.path() / "step-0000000155.safetensors"))
            for (const auto& j : metrics(e.path().string()))
                old_metrics = old_metrics || (j["type"] == "eval" && j["step"] == 155);
    CHECK(old_metrics);
    own = list_checkpoints(dir);
    REQUIRE(own.size() == 2);
    CHECK(checkpoint_step(own[0]) == 186);
    CHECK(checkpoint_step(own[1]) == 182);
    CHECK(checkpoint_step("step-0000000042.safetensors") == 42);
    CHECK(checkpoint_step("step-12345678901234.safetensors") == 12345678901234);
    for (const char* bad :
         {"step-.safetensors", "step-12a.safetensors", "step-1.safetensors.tmp", "epoch-1.safetensors"})
        CHECK(checkpoint_step(bad) == -1);
}

TEST_CASE("a checkpoint of another model is refused with exit code 4 and the reason") {
    Scratch s;
    const std::string cfg = s.config();
    const std::string out = s.out("run");
    {
        EnvGuard g("MIRRORED_TEST_STOP_AFTER_STEP", "10");
        REQUIRE(train_in_process(cfg, out) == kExitInterrupted);
    }
    std::string err;
    CHECK(run_cli({"train", cfg, "--output", out, "--set", "model.layers.0.units=16"}, {}, -1, &err) ==
          kExitCheckpoint);
    CHECK(err.find("different model") != std::string::npos);
    CHECK(err.find("dense units=32 activation=relu") != std::string::npos);
    CHECK(err.find("dense units=16 activation=relu") != std::string::npos);
}

TEST_CASE("export writes the weights under PyTorch names; they round-trip exactly") {
    Scratch s;
    const std::string cfg = s.config();
    const std::string out = s.out("run");
    REQUIRE(train_in_process(cfg, out) == kExitOk);
    const std::string ckpt = list_checkpoints(out + "/checkpoints").front();
    const std::string file = s.out("model.safetensors");
    CHECK(run_cli({"export", ckpt, "--out", file}) == kExitOk);
    const SafetensorsFile w = read_safetensors(file, false);
    const SafetensorsFile c = read_safetensors(ckpt, true);
    CHECK(w.tensors.size() == 4);
    for (const char* name : {"layers.0.weight", "layers.0.bias", "layers.2.weight", "layers.2.bias"}) {
        CAPTURE(name);
        REQUIRE(w.tensors.count(name) == 1);
        CHECK(w.tensors.at(name) == c.tensors.at(name));
    }
    CHECK(w.tensors.at("layers.0.weight").first == std::vector<int>{32, 20});
    CHECK(w.metadata.at("format") == "pt");
    // the header is what the safetensors format specifies: u64 length, JSON, 8-byte aligned
    std::ifstream in(file, std::ios::binary);
    uint64_t n = 0;
    in.read(reinterpret_cast<char*>(&n), 8);
    CHECK(n % 8 == 0);
    std::string header(n, ' ');
    in.read(header.data(), std::streamsize(n));
    const json h = json::parse(header);
    CHECK(h["layers.0.weight"]["dtype"] == "F32");
    CHECK(8 + n + (32 * 20 + 32 + 4 * 32 + 4) * 4 == fs::file_size(file));
    // evaluation of the checkpoint reproduces the run's final test metrics
    const EvalResult r = evaluate_checkpoint(load_config(cfg, {"run.output_dir=" + out}), ckpt);
    CHECK(r.accuracy == doctest::Approx(summary(out)["test_accuracy"].get<double>()));
}

TEST_CASE("CLI exit codes: 0, 2 usage/config, 3 data, 4 checkpoint, 5 device, 130 interrupted") {
    Scratch s;
    const std::string cfg = s.config();
    std::string err;
    CHECK(run_cli({"train", cfg, "--output", s.out("ok"), "--set", "train.epochs=1"}) == kExitOk);
    CHECK(run_cli({"train", cfg, "--bogus"}, {}, -1, &err) == kExitUsage);
    CHECK(run_cli({"nonsense"}) == kExitUsage);
    CHECK(run_cli({"train", cfg, "--set", "train.global_batch_size=0"}, {}, -1, &err) == kExitUsage);
    CHECK(err.rfind("error: --set train.global_batch_size=0: train.global_batch_size:", 0) == 0);
    CHECK(run_cli({"train", cfg, "--set", "train.global_batch_size=33"}, {}, -1, &err) == kExitUsage);
    CHECK(err.find("does not divide into 2 replicas") != std::string::npos);
    const std::string idx =
        "run: {name: x}\ndata: {dataset: idx, root: /nonexistent}\nmodel: {layers: [{type: flatten}, {type: dense, "
        "units: 10}]}\n";
    CHECK(run_cli({"train", s.config(idx, "idx.yaml"), "--output", s.out("data")}, {}, -1, &err) == kExitData);
    CHECK(err.find("/nonexistent/train-images-idx3-ubyte.gz: no such file (data root /nonexistent") !=
          std::string::npos);
    CHECK(run_cli({"eval", cfg, "--checkpoint", s.out("missing.safetensors")}, {}, -1, &err) == kExitCheckpoint);
    if (!test::have_cuda()) CHECK(run_cli({"train", cfg, "--devices", "cuda:0"}, {}, -1, &err) == kExitDevice);
    CHECK(run_cli({"train", cfg, "--output", s.out("int")}, {{"MIRRORED_TEST_STOP_AFTER_STEP", "4"}}) ==
          kExitInterrupted);
    CHECK(run_cli({"train", cfg, "--output", s.out("int")}) == kExitOk);
    CHECK(run_cli({"train", cfg, "--print-config"}) == kExitOk);
    CHECK(run_cli({"train", "--help"}) == kExitOk);
}

TEST_CASE(
    "alerts: input-bound over 10% data wait, communication-bound over 30%, gpu-idle over 30%, each naming what to "
    "change") {
    IntervalLoad calm;
    calm.data_share = 0.10;  // at the thresholds (and GPUs 25% idle): quiet
    calm.comm_share = 0.30;
    calm.device_step_s = 0.75e-3;  // 25% idle
    calm.wall_step_s = 1e-3;
    calm.loader_threads = 3;
    calm.prefetch = 4;
    calm.bucket_mb = 0.5;
    CHECK(find_bottlenecks(calm).empty());
    IntervalLoad cpu = calm;  // CPU replicas sample no device time: never gpu-idle
    cpu.device_step_s = 0;
    cpu.wall_step_s = 1;
    CHECK(find_bottlenecks(cpu).empty());

    IntervalLoad input = calm;
    input.data_share = 0.25;
    auto found = find_bottlenecks(input);
    REQUIRE(found.size() == 1);
    CHECK(found[0].kind == "input-bound");
    CHECK(found[0].message ==
          "25% of step time waits for data: raise data.loader_threads (now 3) or data.prefetch (now 4)");
    // with the loader's measured cost per batch it names the threads that keep up: 30 ms of a
    // thread per batch against 0.75 ms of step without the wait
    input.loader_batch_s = 30e-3;
    found = find_bottlenecks(input);
    REQUIRE(found.size() == 1);
    CHECK(found[0].message ==
          "25% of step time waits for data: raise data.loader_threads (now 3: a batch takes a loader thread 30 ms, a "
          "step without the wait 0.75 ms, so about 40 threads keep up) or data.prefetch (now 4)");
    input.loader_batch_s = 1e-3;  // 2 threads would keep up and 3 run: no number that says "raise"
    found = find_bottlenecks(input);
    REQUIRE(found.size() == 1);
    CHECK(found[0].message ==
          "25% of step time waits for data: raise data.loader_threads (now 3) or data.prefetch (now 4)");
    input.loader_batch_s = 0;

    IntervalLoad comm = calm;
    comm.comm_share = 0.45;
    found = find_bottlenecks(comm);
    REQUIRE(found.size() == 1);
    CHECK(found[0].kind == "communication-bound");
    CHECK(found[0].message.find("45% of step time is communication") == 0);
    CHECK(found[0].message.find("strategy.bucket_mb (now 0.5)") != std::string::npos);

    IntervalLoad idle = calm;
    idle.device_step_s = 0.25e-3;  // a quarter of the wall step: 75% idle
    found = find_bottlenecks(idle);
    REQUIRE(found.size() == 1);
    CHECK(found[0].kind == "gpu-idle");
    CHECK(found[0].message.find(
              "75% of each step the GPUs wait for the host (250 us of device work per 1000 us step)") == 0);
    CHECK(found[0].message.find("data loading") == std::string::npos);

    IntervalLoad all = idle;  // slow data also idles the GPUs: all three, the idle one says why
    all.data_share = 0.5;
    all.comm_share = 0.35;
    found = find_bottlenecks(all);
    REQUIRE(found.size() == 3);
    CHECK(found[0].kind == "input-bound");
    CHECK(found[1].kind == "communication-bound");
    CHECK(found[2].kind == "gpu-idle");
    CHECK(found[2].message.find("; data loading is also slow") != std::string::npos);
}

TEST_CASE("alerts need a bottleneck in two log intervals in a row: a single slow interval stays quiet") {
    IntervalLoad calm;
    calm.loader_threads = 2;
    calm.prefetch = 4;
    IntervalLoad input = calm, comm = calm;
    input.data_share = 0.4;
    comm.comm_share = 0.5;
    IntervalLoad both = input;
    both.comm_share = 0.5;
    SustainedBottlenecks alerts;
    CHECK(alerts.update(input).empty());  // first interval: pending
    CHECK(alerts.update(calm).empty());   // gone again: starts over
    CHECK(alerts.update(input).empty());
    auto found = alerts.update(both);  // input-bound twice in a row; communication once
    REQUIRE(found.size() == 1);
    CHECK(found[0].kind == "input-bound");
    found = alerts.update(comm);  // communication twice; input-bound not this time
    REQUIRE(found.size() == 1);
    CHECK(found[0].kind == "communication-bound");
    CHECK(alerts.update(input).empty());
    SustainedBottlenecks at_once(1);
    CHECK(at_once.update(input).size() == 1);
}

TEST_CASE("a diverging run stops with exit code 6 and writes no non-finite checkpoint") {
    Scratch s;
    const std::string cfg = s.config();
    std::string err;
    const int rc = run_cli({"train", cfg, "--output", s.out("nan"), "--set", "optimizer.lr=1e5", "--set",
                            "optimizer.grad_clip_norm=0", "--set", "checkpoint.every_steps=0"},
                           {}, -1, &err);
    CHECK(rc == kExitDiverged);
    CHECK(err.find("training diverged") != std::string::npos);
    CHECK(list_checkpoints(s.out("nan") + "/checkpoints").empty());
}

TEST_CASE("SIGINT, SIGTERM and SIGHUP finish the step, write a checkpoint and exit 130; resuming completes the run") {
    Scratch s;
    std::string text = kTiny;
    text.replace(text.find("epochs: 5"), 9, "epochs: 3000");  // far longer than the test waits
    const std::string cfg = s.config(text);
    for (int sig : {SIGINT, SIGTERM, SIGHUP}) {  // SIGHUP: a closed terminal, a dropped ssh session
        const std::string out = s.out("sig" + std::to_string(sig));
        // the signals as a terminal leaves them (this test's own runner may have been started with
        // SIGHUP ignored, which the trainer would rightly keep)
        const std::string stdout_path = out + ".stdout";
        const pid_t pid = spawn_program(cli(), {"train", cfg, "--output", out}, {}, "/dev/null", Stdout::file,
                                        stdout_path, [](const void*) { ::signal(SIGHUP, SIG_DFL); });
        // wait until training is under way (the first metrics line), then signal
        for (int i = 0; i < 400 && !(fs::exists(out + "/metrics.jsonl") && fs::file_size(out + "/metrics.jsonl") > 0);
             ++i)
            std::this_thread::sleep_for(std::chrono::milliseconds(25));
        ::kill(pid, sig);
        CHECK(wait_status_within(pid, 60) == kExitInterrupted);
        const json sum = summary(out);
        CHECK(sum["status"] == "interrupted");
        const auto ckpts = list_checkpoints(out + "/checkpoints");
        REQUIRE(!ckpts.empty());
        CHECK(sum["last_checkpoint_step"] == sum["steps"]);  // the checkpoint is of the last step taken
        CHECK(ckpts.front() == checkpoint_path(out + "/checkpoints", sum["steps"].get<int64_t>()));
        std::ifstream printed(stdout_path);
        const std::string text((std::istreambuf_iterator<char>(printed)), {});
        const std::string said = "interrupted: checkpoint written at step " +
                                 std::to_string(sum["steps"].get<int64_t>()) +
                                 "; run again to resume\n";  // the run's last line, whole
        CHECK(text.size() >= said.size());
        CHECK(text.substr(text.size() - std::min(text.size(), said.size())) == said);
    }
}

TEST_CASE("under nohup (SIGHUP ignored) a hang-up leaves the run training") {
    Scratch s;
    std::string text = kTiny;
    text.replace(text.find("epochs: 5"), 9, "epochs: 3000");
    const std::string cfg = s.config(text), out = s.out("nohup");
    const pid_t pid = spawn_program("nohup", {cli(), "train", cfg, "--output", out}, {}, "/dev/null", Stdout::discard);
    for (int i = 0; i < 400 && !(fs::exists(out + "/metrics.jsonl") && fs::file_size(out + "/metrics.jsonl") > 0); ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(25));
    ::kill(pid, SIGHUP);
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    int status = 0;
    CHECK(::waitpid(pid, &status, WNOHANG) == 0);  // still training
    ::kill(pid, SIGTERM);
    CHECK(wait_status_within(pid, 60) == kExitInterrupted);
    CHECK(summary(out)["status"] == "interrupted");
}

TEST_CASE("the shipped CSV example trains to high accuracy") {
    Scratch s;
    const std::string out = s.out("csv");
    CHECK(train_in_process("configs/csv_example.yaml", out, {"train.epochs=15", "strategy.devices=cpu:2"}) == kExitOk);
    CHECK(summary(out)["test_accuracy"].get<double>() > 0.9);
}

// Losses on float targets: regression by mean squared error and multi-label classification by
// binary cross-entropy, from the shipped CSV examples. Each learns; N replicas train as one
// replica does on the same global batch (within rounding); simulated GPUs, which order their
// work as GPUs do, give the CPU replicas' bits; a SIGTERM and a resume continue exactly.
TEST_CASE("losses on targets: mse and binary_cross_entropy learn from CSV columns; replicas agree; exact resume") {
    Scratch s;
    struct Case {
        const char* config;
        double bound;  // on the final test loss: the targets' noise variance is 0.0025 (mse)
    };
    for (const Case c : {Case{"configs/csv_regression.yaml", 0.02}, Case{"configs/csv_multilabel.yaml", 0.15}}) {
        CAPTURE(c.config);
        const std::string tag = std::string(c.config).substr(12, 8);  // "regressi", "multilab"
        const std::string one = s.out(tag + "1"), two = s.out(tag + "2"), sim = s.out(tag + "sim");
        const std::vector<std::string> few{"--set", "train.epochs=12", "--set", "checkpoint.resume=never"};
        auto train = [&](const std::string& out, const std::string& devices) {
            std::vector<std::string> args{"train", c.config, "--output", out, "--devices", devices};
            args.insert(args.end(), few.begin(), few.end());
            return run_cli(args);
        };
        REQUIRE(train(one, "cpu:1") == kExitOk);
        REQUIRE(train(two, "cpu:2") == kExitOk);
        REQUIRE(train(sim, "sim:0,1") == kExitOk);
        const json a = summary(one), b = summary(two);
        CHECK(a["test_loss"].get<double>() < c.bound);
        std::vector<json> m;  // the train records
        for (const json& r : metrics(one))
            if (r["type"] == "train") m.push_back(r);
        REQUIRE(m.size() >= 2);
        CHECK(m.back()["loss"].get<double>() < m.front()["loss"].get<double>() / 3);
        CHECK(std::fabs(a["test_loss"].get<double>() - b["test_loss"].get<double>()) <
              1e-3 * a["test_loss"].get<double>() + 1e-6);
        expect_same_run(two, sim);
        if (std::string(c.config).find("regression") != std::string::npos) {
            CHECK(a["test_accuracy"].is_null());  // mse has no accuracy
            CHECK(m.front()["accuracy"].is_null());
        } else {
            CHECK(a["test_accuracy"].get<double>() > 0.9);
        }
        // stopped after step 200 with a checkpoint, resumed: the uninterrupted run's bits
        const std::string resumed = s.out(tag + "resumed");
        std::vector<std::string> args{"train", c.config, "--output",        resumed, "--devices",
                                      "cpu:2", "--set",  "train.epochs=12", "--set", "checkpoint.every_steps=100"};
        CHECK(run_cli(args, {{"MIRRORED_TEST_STOP_AFTER_STEP", "200"}}) == kExitInterrupted);
        CHECK(run_cli(args) == kExitOk);
        CHECK(summary(resumed)["resumed_from_step"] == 200);
        expect_same_run(two, resumed);
    }
}

TEST_CASE("losses on targets: the labels the loss reads must be the data's, as many targets as outputs") {
    Scratch s;
    std::string err;
    // a classifier's loss on target columns, and a target loss on class labels
    CHECK(run_cli({"train", "configs/csv_regression.yaml", "--output", s.out("a"), "--set",
                   "model.loss=softmax_cross_entropy"},
                  {}, -1, &err) == kExitUsage);
    CHECK(err.find("data.csv.label_column: several label columns are float targets, but the loss takes one class "
                   "index per sample") != std::string::npos);
    CHECK(run_cli({"train", "configs/csv_example.yaml", "--output", s.out("b"), "--set", "model.loss=mse"}, {}, -1,
                  &err) == kExitUsage);
    CHECK(err.find("has 1 target(s) per sample: they must match") !=
          std::string::npos);  // the label column, as a target
    CHECK(run_cli({"train", "configs/synthetic_mlp.yaml", "--output", s.out("c"), "--set", "model.loss=mse"}, {}, -1,
                  &err) == kExitUsage);
    CHECK(err.find("model.loss: mse takes float targets per sample, but synthetic data has class indexes") !=
          std::string::npos);
    CHECK(run_cli({"train", "configs/csv_regression.yaml", "--output", s.out("d"), "--set", "model.layers.2.units=3"},
                  {}, -1, &err) == kExitUsage);
    CHECK(err.find("model.layers.2.units: the model has 3 outputs, but") != std::string::npos);
    CHECK(err.find("has 2 target(s) per sample: they must match") != std::string::npos);
    CHECK(run_cli({"train", "configs/csv_regression.yaml", "--output", s.out("e"), "--set", "model.loss=huber"}, {}, -1,
                  &err) == kExitUsage);
    CHECK(err.find("model.loss: expected one of softmax_cross_entropy, mse, binary_cross_entropy, got 'huber'") !=
          std::string::npos);
    // binary cross-entropy's targets are probabilities: one outside [0, 1], or not finite, is named
    std::string rows = "a,b,y,z\n";
    for (int i = 0; i < 40; ++i)
        rows += std::to_string(i % 7) + "," + std::to_string(i % 5) + ",0," + (i % 2 ? "1" : "0") + "\n";
    const std::string good = s.write("good.csv", rows);
    const std::string bad = s.write("bad.csv", rows + "1,2,1.5,0\n3,4,0,0\n");
    const std::string nan = s.write("nan.csv", rows + "1,2,0,nan\n");
    const std::string cfg = s.config(R"(run: {name: bce, seed: 1}
strategy: {devices: "cpu:1"}
data: {dataset: csv, root: ., train: {file: bad.csv}, test: {file: good.csv}, csv: {label_column: [y, z]}}
model: {layers: [{type: dense, units: 2}], loss: binary_cross_entropy}
train: {epochs: 1, global_batch_size: 8}
)",
                                     "bce.yaml");
    CHECK(run_cli({"train", cfg, "--output", s.out("f")}, {}, -1, &err) == kExitData);
    CHECK(err.find(bad + ": sample 40, target 0 is 1.5: model.loss binary_cross_entropy takes targets in [0, 1]") !=
          std::string::npos);
    CHECK(run_cli({"train", cfg, "--output", s.out("g"), "--set", "data.test.file=bad.csv", "--set",
                   "data.train.file=good.csv"},
                  {}, -1, &err) == kExitData);  // the test split too
    CHECK(err.find(bad + ": sample 40") != std::string::npos);
    const int rc = run_cli({"train", cfg, "--output", s.out("h"), "--set", "data.train.file=nan.csv"}, {}, -1, &err);
    CHECK(rc == kExitData);
    CHECK(err.find("nan.csv") != std::string::npos);
    // mse takes any finite target
    CHECK(run_cli({"train", cfg, "--output", s.out("i"), "--set", "model.loss=mse"}) == kExitOk);
}

TEST_CASE("CIFAR-10 files with augmentation train end to end") {
    // 3 classes of 32x32 RGB images whose brightest channel is the label, as CIFAR-10 batches
    Scratch s;
    test::Rng rng(17);
    auto write_batch = [&](const std::string& name, int records) {
        std::vector<unsigned char> b;
        for (int i = 0; i < records; ++i) {
            const int label = i % 3;
            b.push_back(static_cast<unsigned char>(label));
            for (int c = 0; c < 3; ++c)
                for (int p = 0; p < 1024; ++p)
                    b.push_back(static_cast<unsigned char>((c == label ? 120 : 40) + rng.integer(0, 100)));
        }
        std::ofstream(s.out(name), std::ios::binary)
            .write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
    };
    write_batch("data_batch_1.bin", 300);
    write_batch("data_batch_2.bin", 300);
    write_batch("test_batch.bin", 150);
    const std::string cfg = s.config(
        "run: {name: cifar, seed: 4}\n"
        "strategy: {devices: \"cpu:2\"}\n"
        "data: {dataset: cifar10, root: " +
            s.path().string() +
            ", train: {files: [data_batch_1.bin, data_batch_2.bin]},\n"
            "       augment: {random_crop_padding: 4, horizontal_flip: true}}\n"
            "model: {layers: [{type: flatten}, {type: dense, units: 32, activation: relu}, {type: dense, units: 10}]}\n"
            "optimizer: {type: adamw, lr: 0.003}\n"
            "train: {epochs: 4, global_batch_size: 40, log_every_steps: 10}\n",
        "cifar.yaml");
    const std::string out = s.out("cifar-run");
    CHECK(train_in_process(cfg, out) == kExitOk);
    const json sum = summary(out);
    CHECK(sum["test_accuracy"].get<double>() > 0.9);
    CHECK(sum["steps"] == 60);
}

TEST_CASE("simulated GPUs with random delays train bit-identically to CPU replicas: metrics, evaluation, checkpoints") {
    Scratch s;
    const std::string cfg = s.config();
    const std::string ref = s.out("cpu");
    REQUIRE(train_in_process(cfg, ref, {"strategy.devices=cpu:2"}) == kExitOk);
    sim_reset();
    sim_set_delays(30);
    for (const char* devices : {"sim:0,1", "sim:0,0"})
        for (const char* graph : {"false", "true"}) {  // uncaptured, and steps replayed from graphs
            CAPTURE(devices);
            CAPTURE(graph);
            const std::string out = s.out(std::string("sim") + devices[6] + graph);
            CHECK(train_in_process(cfg, out,
                                   {std::string("strategy.devices=") + devices,
                                    std::string("strategy.cuda_graph=") + graph}) == kExitOk);
            expect_same_run(ref, out);
            CHECK(summary(out)["device_type"] == "sim");
            const auto a = list_checkpoints(ref + "/checkpoints"), b = list_checkpoints(out + "/checkpoints");
            REQUIRE(a.size() == b.size());
            for (size_t i = 0; i < a.size(); ++i)
                CHECK(read_safetensors(a[i], true).tensors == read_safetensors(b[i], true).tensors);
        }
    sim_reset();
}

namespace {

// SIGKILL at a random moment of a run on `devices`, then the rerun: the uninterrupted run's bits;
// the same once more with every step replayed from captured graphs.
void kill_resume_graphs(const std::string& devices, const std::vector<std::pair<std::string, std::string>>& env,
                        int epochs) {
    Scratch s;
    std::string text = kTiny;
    text.replace(text.find("epochs: 5"), 9, "epochs: " + std::to_string(epochs));
    text.replace(text.find("every_steps: 7"), 14, "every_steps: 3");
    text.replace(text.find("\"cpu:2\""), 7, "\"" + devices + "\"");
    const std::string cfg = s.config(text);
    const std::string ref = s.out("ref"), out = s.out("killed");
    const double t0 = now_seconds();
    REQUIRE(run_cli({"train", cfg, "--output", ref}, env) == kExitOk);
    const double run_s = now_seconds() - t0;
    test::Rng rng(6);
    const double when = kill_point(run_s, rng);
    CAPTURE(when);
    const int first = run_cli({"train", cfg, "--output", out}, env, when);
    CHECK((first == 128 + SIGKILL || first == kExitOk));
    CHECK(run_cli({"train", cfg, "--output", out}, env) == kExitOk);
    expect_same_run(ref, out);
    // the killed run and its resumption replaying captured steps: still the uninterrupted run's bits
    const std::string graphed = s.out("killed-graph");
    const std::vector<std::string> graph{"--set", "strategy.cuda_graph=true"};
    std::vector<std::string> args{"train", cfg, "--output", graphed};
    args.insert(args.end(), graph.begin(), graph.end());
    const int killed = run_cli(args, env, kill_point(run_s, rng));
    CHECK((killed == 128 + SIGKILL || killed == kExitOk));
    CHECK(run_cli(args, env) == kExitOk);
    expect_same_run(ref, graphed);
}

}  // namespace

TEST_CASE(
    "simulated GPUs: SIGKILL at an arbitrary moment, then resume, is bit-identical to an uninterrupted run (graphs "
    "too)") {
    kill_resume_graphs("sim:0,1", {{"MIRRORED_SIM_DELAY_US", "20"}}, 20);
}

// The CLI end to end on the CUDA backend: pinned loader slots, copies, evaluation, checkpoints
// read back from GPU memory, captured steps. 20 epochs, as on the simulated GPU.
TEST_CASE("cuda: SIGKILL at an arbitrary moment, then resume, is bit-identical to an uninterrupted run (graphs too)" *
          doctest::test_suite("cuda")) {
    SKIP_WITHOUT_CUDA();
    kill_resume_graphs(cuda_device_count() >= 2 ? "cuda:0,1" : "cuda:0,0", {}, 20);
}

namespace {

// A run that fails on a device (`env` makes it fail): exit 5 (a hang instead fails run_cli's
// deadline), its error saying
// each of `said` (the failed device, the error, where), never "internal"; its checkpoints intact;
// the rerun without the failure (the GPU replaced) resumes from one and ends as the uninterrupted
// run `ref` did.
void expect_device_failure(const std::string& ref, const std::string& out, const std::vector<std::string>& args,
                           const std::vector<std::pair<std::string, std::string>>& env,
                           const std::vector<std::string>& said) {
    std::string err;
    const int rc = run_cli(args, env, -1, &err);
    CAPTURE(err);
    CHECK(rc == kExitDevice);
    for (const std::string& part : said) CHECK(err.find(part) != std::string::npos);
    CHECK(err.find("internal") == std::string::npos);
    const auto ckpts = list_checkpoints(out + "/checkpoints");
    REQUIRE(!ckpts.empty());
    CHECK_NOTHROW(read_safetensors(ckpts.front(), true));
    CHECK(run_cli(args) == kExitOk);
    CHECK(summary(out)["resumed_from_step"].get<int64_t>() > 0);
    expect_same_run(ref, out);
}

}  // namespace

TEST_CASE(
    "a device failure: exit 5 with the first error named, no hang, the last checkpoint kept; the rerun resumes "
    "exactly") {
    Scratch s;
    const std::string cfg = s.config();
    const std::string ref = s.out("ref");
    REQUIRE(train_in_process(cfg, ref, {"strategy.devices=sim:0,1"}) == kExitOk);
    for (const char* op : {"ring", "nccl"}) {
        CAPTURE(op);
        const std::string out = s.out(std::string("failed-") + op);
        expect_device_failure(
            ref, out,
            {"train", cfg, "--output", out, "--devices", "sim:0,1", "--set",
             std::string("strategy.cross_device_ops=") + op},
            {{"MIRRORED_SIM_FAULT", "1:1500"}, {"MIRRORED_SIM_DELAY_US", "20"}},
            {"error: sim:1: ", "illegal memory access", "sim_device.cpp:"});  // the failed device, first
    }
}

namespace {

// strategy.on_replica_failure: continue. The run that loses a device goes on without it and ends
// with exit 0; its result equals, bit for bit, the same run stopped at the checkpoint it continued
// from and resumed there on the survivors with the accumulation it chose (the same global batch).
struct Failing {
    std::string devices;                                   // the run's
    std::vector<std::pair<std::string, std::string>> env;  // the fault
    std::vector<std::string> sets;                         // every run's (the reference too)
    std::vector<std::string> failing_sets;                 // the failing run's only
    std::string said;                                      // in its stderr
};
struct Continued {
    std::string failed, survivors;
    int accumulation;
};

// The failing run (exit 0 after the failures `expected`), then the reference: stopped at each
// failure's checkpoint and resumed there on its survivors, equal bit for bit.
void expect_continued_run(const std::string& cfg, const std::string& out, const Failing& run,
                          const std::vector<Continued>& expected) {
    std::string err;
    std::vector<std::string> args{"train",     cfg,         "--output", out,
                                  "--devices", run.devices, "--set",    "strategy.on_replica_failure=continue"};
    for (const auto* sets : {&run.sets, &run.failing_sets})
        for (const std::string& set : *sets) args.insert(args.end(), {"--set", set});
    const int rc = run_cli(args, run.env, -1, &err);
    CAPTURE(err);
    REQUIRE(rc == kExitOk);
    CHECK(err.find("internal") == std::string::npos);
    CHECK(err.find(run.said) != std::string::npos);
    const json s = summary(out);
    CHECK(s["status"] == "completed");
    REQUIRE(s["replica_failures"].size() == expected.size());
    const std::string ref = out + "-ref";
    std::string devices = run.devices, accumulation = "1";
    for (size_t k = 0; k < expected.size(); ++k) {
        const Continued& c = expected[k];
        const json f = s["replica_failures"][k];
        CAPTURE(k);
        CHECK(err.find("alert: replica_failure: " + c.failed + " failed after step ") != std::string::npos);
        CHECK(err.find(c.survivors.rfind("cpu:", 0) == 0 ? " CPU replica" : "continuing on " + c.survivors + " (") !=
              std::string::npos);
        CHECK(f["device"] == c.failed);
        CHECK(f["devices"] == c.survivors);
        CHECK(f["accumulation"] == c.accumulation);
        CHECK(f["error"].get<std::string>().rfind(c.failed + ": ", 0) == 0);
        CHECK(f["after_fault_s"].get<double>() >= 0);
        const int64_t from = f["resume_step"].get<int64_t>();
        CHECK(from > 0);
        CHECK(f["redone_steps"].get<int64_t>() == f["step"].get<int64_t>() - from);
        if (k + 1 == expected.size()) CHECK(s["resumed_from_step"].get<int64_t>() == from);
        // the reference: up to this checkpoint on the devices so far, then on the survivors
        std::vector<std::string> stopped{
            "train",     cfg,     "--output", ref,
            "--devices", devices, "--set",    "train.grad_accumulation_steps=" + accumulation};
        for (const std::string& set : run.sets) stopped.insert(stopped.end(), {"--set", set});
        CHECK(run_cli(stopped, {{"MIRRORED_TEST_STOP_AFTER_STEP", std::to_string(from)}}) == kExitInterrupted);
        devices = c.survivors;
        accumulation = std::to_string(c.accumulation);
    }
    std::vector<std::string> resumed{"train",     cfg,     "--output", ref,
                                     "--devices", devices, "--set",    "train.grad_accumulation_steps=" + accumulation};
    for (const std::string& set : run.sets) resumed.insert(resumed.end(), {"--set", set});
    CHECK(run_cli(resumed) == kExitOk);
    expect_same_run(ref, out);
}

}  // namespace

TEST_CASE(
    "on_replica_failure: continue: a failed device is set aside and the run goes on from the last checkpoint, "
    "equal to a run resumed there on the survivors") {
    Scratch s;
    const std::string cfg = s.config();
    SUBCASE("simulated GPUs: 4 -> 2 (32 rows do not divide into 3 replicas), 2 micro-batches of 8 as before") {
        expect_continued_run(cfg, s.out("sim"),
                             {"sim:0,1,2,3",
                              {{"MIRRORED_SIM_FAULT", "1:1500"}, {"MIRRORED_SIM_DELAY_US", "20"}},
                              {},
                              {},
                              "illegal memory access"},
                             {{"sim:1", "sim:0,2", 2}});
    }
    // One bucket: the ring runs after backward, so a launch's number names the same kernel each run.
    SUBCASE("simulated GPUs: a hung kernel on one GPU, found by the watchdog (its step stopped, the others' not)") {
        expect_continued_run(cfg, s.out("hang"),
                             {"sim:0,1,2,3",
                              {{"MIRRORED_SIM_HANG", "1:1500"}, {"MIRRORED_SIM_DELAY_US", "20"}},
                              {"strategy.bucket_mb=4"},
                              {"strategy.step_timeout_s=8"},
                              " s (strategy.step_timeout_s): its step stopped while the other replicas' went on"},
                             {{"sim:1", "sim:0,2", 2}});
    }
    SUBCASE("simulated GPUs: a hang no one device is behind in (here inside the ring) still stops the run") {
        std::string err;
        CHECK(run_cli({"train", cfg, "--output", s.out("hang-ring"), "--devices", "sim:0,1,2,3", "--set",
                       "strategy.on_replica_failure=continue", "--set", "strategy.step_timeout_s=8", "--set",
                       "strategy.bucket_mb=4"},
                      {{"MIRRORED_SIM_HANG", "1:1512"}, {"MIRRORED_SIM_DELAY_US", "20"}}, -1, &err) == kExitDevice);
        CAPTURE(err);
        CHECK(err.find("error: no progress for ") != std::string::npos);
        CHECK(err.find("replica_failure") == std::string::npos);
    }
    SUBCASE("CPU replicas: a replica failing in step 40") {
        expect_continued_run(
            cfg, s.out("cpu"),
            {"cpu:4", {{"MIRRORED_TEST_REPLICA_FAULT", "2:40"}}, {}, {}, "MIRRORED_TEST_REPLICA_FAULT"},
            {{"cpu:2", "cpu:2", 2}});
    }
    // The continued process takes its own 40th step too (step 75), where replica 1 fails again.
    SUBCASE("CPU replicas: a second failure in the continued process: 4 -> 2 -> 1 replicas") {
        expect_continued_run(
            cfg, s.out("twice"),
            {"cpu:4", {{"MIRRORED_TEST_REPLICA_FAULT", "1:40"}}, {}, {}, "MIRRORED_TEST_REPLICA_FAULT"},
            {{"cpu:1", "cpu:2", 2}, {"cpu:1", "cpu:1", 4}});
        const json f = summary(s.out("twice"))["replica_failures"];
        CHECK(f[1]["resume_step"].get<int64_t>() > f[0]["step"].get<int64_t>());
    }
    // A run started from another run's checkpoint goes on from that one, not from step 0, when a
    // device fails before it wrote its own.
    SUBCASE("a run started from a named checkpoint: before its own first checkpoint, it goes on from that one") {
        const std::string base = s.out("base");
        REQUIRE(run_cli({"train", cfg, "--output", base, "--devices", "cpu:2"},
                        {{"MIRRORED_TEST_STOP_AFTER_STEP", "35"}}) == kExitInterrupted);
        const std::string named = base + "/checkpoints/step-0000000035.safetensors";
        REQUIRE(fs::exists(named));
        const std::string out = s.out("named");
        std::string err;
        REQUIRE(run_cli({"train", cfg, "--output", out, "--devices", "cpu:2", "--set",
                         "strategy.on_replica_failure=continue", "--set", "checkpoint.resume=" + named},
                        {{"MIRRORED_TEST_REPLICA_FAULT", "1:3"}}, -1, &err) == kExitOk);
        CAPTURE(err);
        const json sm = summary(out);
        REQUIRE(sm["replica_failures"].size() == 1);
        CHECK(sm["replica_failures"][0]["resume_step"] == 35);
        CHECK(sm["resumed_from_step"] == 35);
        const std::string ref = s.out("named-ref");
        REQUIRE(run_cli({"train", cfg, "--output", ref, "--devices", "cpu:1", "--set",
                         "train.grad_accumulation_steps=2", "--set", "checkpoint.resume=" + named}) == kExitOk);
        CHECK(summary(ref)["test_loss"] == sm["test_loss"]);
        CHECK(summary(ref)["replica_checksums"] == sm["replica_checksums"]);
    }
    SUBCASE("a failure before the first checkpoint starts the survivors from step 0, the folder kept") {
        const std::string out = s.out("early");
        std::string err;
        REQUIRE(run_cli({"train", cfg, "--output", out, "--devices", "cpu:2", "--set",
                         "strategy.on_replica_failure=continue"},
                        {{"MIRRORED_TEST_REPLICA_FAULT", "1:3"}}, -1, &err) == kExitOk);
        CAPTURE(err);
        const json sm = summary(out);
        REQUIRE(sm["replica_failures"].size() == 1);
        CHECK(sm["replica_failures"][0]["resume_step"] == 0);
        CHECK(sm["replicas"] == 1);
        CHECK(sm["resumed_from_step"] == 0);
        const std::string ref = s.out("early-ref");
        REQUIRE(run_cli({"train", cfg, "--output", ref, "--devices", "cpu:1", "--set",
                         "train.grad_accumulation_steps=2"}) == kExitOk);
        expect_same_run(ref, out);
    }
    SUBCASE("fewer than strategy.min_replicas left: exit 5 naming the failed device and the minimum") {
        const std::string out = s.out("min");
        std::string err;
        CHECK(run_cli({"train", cfg, "--output", out, "--devices", "sim:0,1", "--set",
                       "strategy.on_replica_failure=continue", "--set", "strategy.min_replicas=2"},
                      {{"MIRRORED_SIM_FAULT", "1:1500"}}, -1, &err) == kExitDevice);
        CAPTURE(err);
        CHECK(err.find("error: sim:1: ") != std::string::npos);
        CHECK(err.find("1 replica left (strategy.min_replicas: 2): stopping") != std::string::npos);
        CHECK(!list_checkpoints(out + "/checkpoints").empty());
    }
}

TEST_CASE("on_replica_failure: which replicas go on, and the hand-over to the next process") {
    const std::vector<std::string> four{"cuda:0", "cuda:1", "cuda:2", "cuda:3"};
    SurvivorPlan p = plan_survivors(four, "cuda:1", 48, 1, 1);  // 3 x 16 rows: as many rows as 4 x 12? no: 16 > 12
    CHECK(p.survivors == 3);
    CHECK(p.keep == std::vector<int>{0, 2, 3});
    CHECK(p.accumulation == 2);  // 3 replicas x 2 micro-batches of 8 rows (<= 12)
    p = plan_survivors(four, "cuda:3", 32, 1, 1);
    CHECK(p.keep == std::vector<int>{0, 1});  // 32 rows never divide into 3
    CHECK(p.accumulation == 2);
    p = plan_survivors({"cuda:0", "cuda:0", "cuda:1", "cuda:1"}, "cuda:0", 64, 2, 1);  // a GPU shared by 2
    CHECK(p.keep == std::vector<int>{2, 3});
    CHECK(p.accumulation == 4);
    p = plan_survivors(four, "cuda:2", 32, 1, 3);
    CHECK(p.keep.empty());
    CHECK(p.refused ==
          "3 replicas left, and no 3 or more of them share the global batch of 32 equally "
          "(strategy.min_replicas: 3)");
    p = plan_survivors({"sim:0", "sim:0"}, "sim:0", 32, 1, 1);
    CHECK(p.keep.empty());
    CHECK(p.refused == "0 replicas left (strategy.min_replicas: 1)");
    p = plan_survivors({"cpu:0", "cpu:1", "cpu:2"}, "cpu:9", 30, 1, 1);  // not one of them: nothing dropped
    CHECK(p.keep == std::vector<int>{0, 1, 2});
    CHECK(p.accumulation == 1);

    const Continuation c{"sim:0,2", 2, "sim:1", 1765000000123, 4, "/runs/a|b/checkpoints/step-0000000035.safetensors"};
    const Continuation back = decode_continuation(encode_continuation(c));
    CHECK(back.devices == c.devices);
    CHECK(back.accumulation == 2);
    CHECK(back.failed == "sim:1");
    CHECK(back.fault_ms == c.fault_ms);
    CHECK(back.lr_replicas == 4);
    CHECK(back.resume == c.resume);  // a '|' in the path is the path's
    CHECK(decode_continuation("cpu:1|2|cpu:1|5|2|").resume.empty());
    for (const char* bad :
         {"", "sim:0|2|sim:1|5|4", "sim:0|0|sim:1|5|4|", "|2|sim:1|5|4|", "sim:0|2||5|4|", "sim:0|2|sim:1|-5|4|",
          "sim:0|2|sim:1|5|0|", "sim:0|x|sim:1|5|4|", "sim:0|2|sim:1|99999999999999999999|4|"}) {
        CAPTURE(std::string(bad));
        CHECK_THROWS_AS(decode_continuation(bad), ConfigError);
    }
}

// A fault knob that does not parse is refused (exit 2, naming it and its form), never ignored: a
// test that sets one must not pass by its fault never happening.
TEST_CASE("fault knobs: a malformed MIRRORED_SIM_FAULT, _HANG, _CORRUPT or MIRRORED_TEST_NODE_FAULT is exit 2") {
    Scratch s;
    const std::string cfg = s.config();
    for (const char* knob : {"MIRRORED_SIM_FAULT", "MIRRORED_SIM_HANG", "MIRRORED_SIM_CORRUPT"})
        for (const char* value : {"::", "1", "1:", ":5", "0:0", "64:3", "0:3:1", "x:1", "0:1e3", "-1:4"}) {
            CAPTURE(std::string(knob));
            CAPTURE(std::string(value));
            std::string err;
            CHECK(run_cli({"train", cfg, "--output", s.out("knob"), "--devices", "sim:0,1", "--set",
                           "checkpoint.resume=never"},
                          {{knob, value}}, -1, &err) == kExitUsage);
            CHECK(err.find(std::string(knob) + "=" + value + ": expected GPU:COUNT") != std::string::npos);
        }
    std::string err;
    for (const char* value : {"1:40", "1:40:crash", "a:40:kill", "1:40:kill:now", "1:-2:hang"}) {
        CAPTURE(std::string(value));
        CHECK(
            run_cli({"train", cfg, "--output", s.out("node"), "--devices", "cpu:1", "--set", "checkpoint.resume=never"},
                    {{"MIRRORED_TEST_NODE_FAULT", value}}, -1, &err) == kExitUsage);
        CHECK(err.find("expected NODE:STEP:kill or NODE:STEP:hang") != std::string::npos);
    }
}

// The same on the CUDA backend's own code, on emulated GPUs (make test-cuda-emu), whose knob
// MIRRORED_CUDA_EMU_FAULT makes the K-th kernel run on a GPU meet an illegal address: on eager
// streams the launch's own check reports it, on asynchronous ones a later call on that GPU, as on
// a real one. Uncaptured and replayed from graphs, ring and direct (NCCL where built). A real GPU
// has no such knob: there the case says it skipped (suite "emulated").
TEST_CASE(
    "cuda: a GPU fault: exit 5 naming the GPU and the call, no hang, the last checkpoint kept; the rerun "
    "resumes exactly" *
    doctest::test_suite("emulated")) {
    SKIP_WITHOUT_CUDA();
    if (make_cuda_device(0)->description().rfind("emulated GPU", 0) != 0) {
        mark_runs_elsewhere("MIRRORED_CUDA_EMU_FAULT belongs to the emulated GPU (make test-cuda-emu), not a real one");
        return;
    }
    const bool two = cuda_device_count() >= 2;
    const std::string devices = two ? "cuda:0,1" : "cuda:0,0";
    Scratch s;
    const std::string cfg = s.config();
    const std::string ref = s.out("ref");
    REQUIRE(train_in_process(cfg, ref, {"strategy.devices=" + devices}) == kExitOk);
    struct Case {
        const char* op;
        bool graphs;
    };
    std::vector<Case> cases{{"ring", false}, {"ring", true}, {"direct", false}};
    if (two && nccl_compiled()) cases.push_back({"nccl", true});
    for (const Case& c : cases) {
        CAPTURE(c.op);
        CAPTURE(c.graphs);
        const std::string out = s.out(std::string("failed-") + c.op + (c.graphs ? "-graphs" : ""));
        expect_device_failure(ref, out,
                              {"train", cfg, "--output", out, "--devices", devices, "--set",
                               std::string("strategy.cross_device_ops=") + c.op, "--set",
                               std::string("strategy.cuda_graph=") + (c.graphs ? "true" : "false")},
                              {{"MIRRORED_CUDA_EMU_FAULT", two ? "1:1500" : "0:3000"}},
                              {two ? "error: cuda:1: " : "error: cuda:0: ",
                               "failed: an illegal memory access was encountered (kernels/cuda/"});
    }
}

namespace {

// A test of an emulated GPU's knob, on two GPUs: false, the case marked as run elsewhere, on a real
// GPU (which has no such knob) or with fewer than two.
bool on_two_emulated_gpus(const std::string& knob) {
    if (make_cuda_device(0)->description().rfind("emulated GPU", 0) != 0) {
        mark_runs_elsewhere(knob + " belongs to the emulated GPU (make test-cuda-emu), not a real one");
        return false;
    }
    if (cuda_device_count() < 2) {
        mark_runs_elsewhere("needs 2 or more GPUs, " + std::to_string(cuda_device_count()) + " visible");
        return false;
    }
    return true;
}

}  // namespace

// The same continuation on the CUDA backend's own code: a sticky error on emulated GPU 1 (an
// illegal address) names that GPU, and the run goes on on GPU 0 alone.
TEST_CASE("cuda: on_replica_failure: continue: a GPU's sticky error sets it aside, the run goes on exactly" *
          doctest::test_suite("emulated")) {
    SKIP_WITHOUT_CUDA();
    if (!on_two_emulated_gpus("MIRRORED_CUDA_EMU_FAULT")) return;
    Scratch s;
    expect_continued_run(s.config(), s.out("cuda"),
                         {"cuda:0,1", {{"MIRRORED_CUDA_EMU_FAULT", "1:1500"}}, {}, {}, "illegal memory access"},
                         {{"cuda:1", "cuda:0", 2}});
}

// A board that reports peer access but corrupts peer traffic (MIRRORED_CUDA_EMU_PEER_CORRUPT): the
// start-up self-test of each link stages that pair through the host and says so, and the run trains
// exactly as one on GPUs without peer access. Without the self-test the corrupted copies would make
// the replicas differ.
TEST_CASE("cuda: a peer link that corrupts data is found at start-up and staged; the run stays exact" *
          doctest::test_suite("emulated")) {
    SKIP_WITHOUT_CUDA();
    if (!on_two_emulated_gpus("MIRRORED_CUDA_EMU_PEER_CORRUPT")) return;
    Scratch s;
    const std::string cfg = s.config();
    auto train = [&](const std::string& out, const char* knob) {
        return run_cli(
            {"train", cfg, "--output", out, "--devices", "cuda:0,1", "--set", "strategy.shared_parameters=false"},
            {{knob, "1"}}, -1, nullptr, Stdout::file, out + ".txt");
    };
    const std::string staged = s.out("no-peer"), corrupt = s.out("corrupting-peer");
    REQUIRE(train(staged, "MIRRORED_CUDA_EMU_NO_PEER") == kExitOk);
    REQUIRE(train(corrupt, "MIRRORED_CUDA_EMU_PEER_CORRUPT") == kExitOk);
    CHECK(read_text(corrupt + ".txt").find("came back corrupted in the start-up self-test") != std::string::npos);
    expect_same_run(staged, corrupt);
}

namespace {

// A CNN with batchnorm (per replica and synchronised), dropout and a residual block, trained in
// fp16 with dynamic loss scaling whose scale both halves (the first steps overflow at 65536) and
// grows (every 4 good steps): everything resume must restore.
const char* kCnnFp16 = R"(run: {name: cnn16, seed: 5}
strategy: {devices: "cpu:2", bucket_mb: 0.0005, verify_every_steps: 5}
data: {dataset: synthetic, input_shape: [8, 8, 2], classes: 3, train_samples: 480, test_samples: 96}
model:
  layers:
    - {type: conv2d, filters: 6, kernel_size: 3, padding: same, bias: false}
    - {type: batchnorm, activation: relu}
    - type: residual
      activation: relu
      layers:
        - {type: conv2d, filters: 6, kernel_size: 3, padding: same, bias: false}
        - {type: batchnorm, sync: true}
    - {type: maxpool2d, kernel_size: 2}
    - {type: flatten}
    - {type: dropout, rate: 0.2}
    - {type: dense, units: 3}
optimizer: {type: sgd, lr: 0.01, momentum: 0.9}
train: {epochs: 12, global_batch_size: 24, precision: fp16, loss_scale_growth_interval: 4, log_every_steps: 5}
checkpoint: {every_steps: 3, keep: 2}
)";

}  // namespace

TEST_CASE("a CNN with batchnorm in fp16 with loss scaling: stop or SIGKILL, then resume, is bit-identical") {
    Scratch s;
    const std::string cfg = s.config(kCnnFp16, "cnn16.yaml");
    const std::string ref = s.out("ref");
    const double t0 = now_seconds();
    REQUIRE(run_cli({"train", cfg, "--output", ref}) == kExitOk);
    const double duration = now_seconds() - t0;
    // the scale moved both ways, so resume has something to get wrong
    std::set<double> scales;
    for (const auto& j : metrics(ref))
        if (j.contains("loss_scale")) scales.insert(j["loss_scale"].get<double>());
    CHECK(scales.size() >= 2);
    for (int stop : {4, 37}) {
        CAPTURE(stop);
        const std::string out = s.out("stop" + std::to_string(stop));
        {
            EnvGuard g("MIRRORED_TEST_STOP_AFTER_STEP", std::to_string(stop));
            CHECK(train_in_process(cfg, out) == kExitInterrupted);
        }
        CHECK(train_in_process(cfg, out) == kExitOk);
        expect_same_run(ref, out);
    }
    const std::string out = s.out("killed");
    test::Rng rng(8);
    const double when = kill_point(duration, rng);
    CAPTURE(when);
    const int first = run_cli({"train", cfg, "--output", out}, {}, when);
    CHECK((first == 128 + SIGKILL || first == kExitOk));
    CHECK(run_cli({"train", cfg, "--output", out}) == kExitOk);
    expect_same_run(ref, out);
    const auto a = list_checkpoints(ref + "/checkpoints"), b = list_checkpoints(out + "/checkpoints");
    REQUIRE(!a.empty());
    CHECK(read_safetensors(a.back(), true).tensors == read_safetensors(b.back(), true).tensors);
}

TEST_CASE("configs/cifar10_resnet20.yaml: ResNet-20 (0.27M parameters) trains on data in CIFAR-10's file format") {
    // CIFAR-10 itself is not on these machines: five small training batches and a test batch in
    // its binary format (label byte, then 3 x 1024 channel planes), the label the brightest channel.
    Scratch s;
    test::Rng rng(21);
    auto write_batch = [&](const std::string& name, int records) {
        std::vector<unsigned char> b;
        for (int i = 0; i < records; ++i) {
            const int label = i % 10;
            b.push_back(static_cast<unsigned char>(label));
            for (int c = 0; c < 3; ++c)
                for (int p = 0; p < 1024; ++p)
                    b.push_back(static_cast<unsigned char>((label % 3 == c ? 100 + 10 * (label / 3) : 30) +
                                                           rng.integer(0, 60)));
        }
        std::ofstream(s.out(name), std::ios::binary)
            .write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
    };
    for (int k = 1; k <= 5; ++k) write_batch("data_batch_" + std::to_string(k) + ".bin", 40);
    write_batch("test_batch.bin", 40);
    const std::string out = s.out("resnet");
    std::string err;
    const int rc = run_cli({"train", "configs/cifar10_resnet20.yaml", "--output", out, "--set",
                            "data.root=" + s.path().string(), "--set", "strategy.devices=cpu:2", "--set",
                            "train.steps=5", "--set", "train.global_batch_size=40", "--set", "train.log_every_steps=1"},
                           {}, -1, &err);
    CAPTURE(err);
    REQUIRE(rc == kExitOk);
    const json sum = summary(out);
    CHECK(sum["steps"] == 5);
    CHECK(sum["parameters"] == 272474);
    CHECK(std::isfinite(sum["test_loss"].get<double>()));
    CHECK(sum["replica_checksums"][0] == sum["replica_checksums"][1]);
    // the checkpoint holds every conv weight in PyTorch's [out, in, kh, kw] and the running statistics
    const auto tensors = read_safetensors(list_checkpoints(out + "/checkpoints").back(), true).tensors;
    int convs = 0, running = 0;
    for (const auto& [name, t] : tensors) {
        if (t.first.size() == 4 && name.starts_with("layers.")) ++convs;  // not the momentum buffers
        if (name.ends_with("running_var")) ++running;
    }
    CHECK(convs == 21);    // 19 3x3 convolutions and 2 projection shortcuts
    CHECK(running == 21);  // one batchnorm after each
}
