// The files a command writes where its user points it (export --out, eval --dump-*, --json of the
// tools, scale --out) and the files the program keeps (the machine cache): a device node, a named
// pipe or a link is never replaced by a regular file, a checkpoint, a config being read or a run
// folder's file is not overwritten without --force, and no temporary is opened through a link.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <thread>

#include "base/error.h"
#include "base/output.h"
#include "mirrored/checkpoint.h"
#include "tests/cli.h"
#include "tests/helpers.h"

using namespace mirrored;
using namespace mirrored::test;

namespace {

const char* kRun = R"(run: {name: out, seed: 3}
strategy: {devices: "cpu:1"}
data: {dataset: synthetic, input_shape: [6], classes: 3, train_samples: 120, test_samples: 30}
model: {layers: [{type: dense, units: 8, activation: relu}, {type: dense, units: 3}]}
train: {epochs: 2, global_batch_size: 20, log_every_steps: 5}
checkpoint: {every_steps: 4, keep: 5}
)";

std::string read_all(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), {}};
}

bool is_kind(const std::string& path, mode_t kind, bool follow = false) {
    struct stat st {};
    if ((follow ? ::stat(path.c_str(), &st) : ::lstat(path.c_str(), &st)) != 0) return false;
    return (st.st_mode & S_IFMT) == kind;
}

// A trained run folder with checkpoints at steps 4 and 8 (and 12).
struct Trained {
    TempDir d;
    std::string cfg, run, ckpt, other;
    Trained() {
        cfg = d.write("c.yaml", kRun);
        run = d / "run";
        REQUIRE(run_cli({"train", cfg, "--output", run}) == kExitOk);
        const auto all = list_checkpoints(run + "/checkpoints");
        REQUIRE(all.size() >= 2);
        ckpt = all[0];
        other = all[1];
    }
};

}  // namespace

TEST_CASE("outputs: a device node, a named pipe and /dev/stdout are written into, never replaced") {
    Trained t;
    std::string err;
    if (::geteuid() == 0) {  // a character device made in the test's own folder, as /dev/null is (1, 3)
        const std::string node = t.d / "null";
        REQUIRE(::mknod(node.c_str(), S_IFCHR | 0666, makedev(1, 3)) == 0);
        CHECK(run_cli({"export", t.ckpt, "--out", node}, {}, -1, &err) == kExitOk);
        CAPTURE(err);
        CHECK(is_kind(node, S_IFCHR));
    } else {
        MESSAGE("not root: the device-node case needs mknod");
    }
    // a named pipe with a reader gets the bytes; without one the command says so instead of waiting
    const std::string fifo = t.d / "pipe";
    REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
    std::string got;
    std::thread reader([&] { got = read_all(fifo); });
    CHECK(run_cli({"export", t.ckpt, "--out", fifo}, {}, -1, &err) == kExitOk);
    reader.join();
    CHECK(got.size() > 100);
    CHECK(read_safetensors(InputFile("piped", reinterpret_cast<const unsigned char*>(got.data()), got.size(), false),
                           false)
              .tensors.size() == 4);
    CHECK(is_kind(fifo, S_IFIFO));
    CHECK(run_cli({"export", t.ckpt, "--out", fifo}, {}, -1, &err) == kExitCheckpoint);
    CHECK(err.find("no process reads this named pipe") != std::string::npos);
    // /dev/stdout: the bytes on standard output, wherever it goes
    const std::string captured = t.d / "stdout.bin";
    CHECK(run_cli({"export", t.ckpt, "--out", "/dev/stdout"}, {}, -1, &err, Stdout::file, captured) == kExitOk);
    CHECK(read_all(captured).find("layers.0.weight") != std::string::npos);
    // a link to a file: the file is replaced, the link stays a link
    const std::string target = t.d / "weights.safetensors", link = t.d / "link.safetensors";
    { std::ofstream(target) << "old"; }
    REQUIRE(::symlink(target.c_str(), link.c_str()) == 0);
    CHECK(run_cli({"export", t.ckpt, "--out", link}, {}, -1, &err) == kExitOk);
    CHECK(is_kind(link, S_IFLNK));
    CHECK(read_all(target).find("layers.0.weight") != std::string::npos);
    // what cannot be written to is refused before any work, naming the option (exit 2)
    CHECK(run_cli({"export", t.ckpt, "--out", t.d.path().string()}, {}, -1, &err) == kExitUsage);
    CHECK(err.find("--out " + t.d.path().string() + ": is a directory") != std::string::npos);
    CHECK(run_cli({"export", t.ckpt, "--out", t.d / "no/such/folder/w.safetensors"}, {}, -1, &err) == kExitUsage);
    CHECK(err.find("does not exist") != std::string::npos);
    CHECK(run_cli({"export", t.ckpt, "--out", ""}, {}, -1, &err) == kExitUsage);
    CHECK(err.find("--out: expected a file name") != std::string::npos);
}

TEST_CASE("outputs: a checkpoint, a config being read or a run folder's file is replaced only with --force") {
    Trained t;
    std::string err;
    const std::string before = read_all(t.other);
    // export one checkpoint over another, or over the run's config
    CHECK(run_cli({"export", t.ckpt, "--out", t.other}, {}, -1, &err) == kExitUsage);
    CHECK(err.find("is a checkpoint, which this command did not write") != std::string::npos);
    CHECK(err.find("--force") != std::string::npos);
    CHECK(read_all(t.other) == before);
    CHECK(run_cli({"export", t.ckpt, "--out", t.run + "/config.yaml"}, {}, -1, &err) == kExitUsage);
    CHECK(err.find("is a file of the run folder") != std::string::npos);
    // a checkpoint renamed is still known by its header
    const std::string renamed = t.d / "mine.bin";
    std::filesystem::copy_file(t.other, renamed);
    CHECK(run_cli({"plan", t.cfg, "--gpu", "h100", "--json", renamed}, {}, -1, &err) == kExitUsage);
    CHECK(err.find("is a checkpoint") != std::string::npos);
    // the tools' --json onto a checkpoint, or onto the config they read
    CHECK(run_cli({"plan", t.cfg, "--gpu", "h100", "--json", t.other}, {}, -1, &err) == kExitUsage);
    CHECK(read_all(t.other) == before);
    CHECK(run_cli({"bench-step", t.cfg, "--devices", "cpu:1", "--steps", "1", "--json", t.cfg}, {}, -1, &err) ==
          kExitUsage);
    CHECK(err.find("is the configuration file, which this command reads") != std::string::npos);
    CHECK(read_all(t.cfg) == kRun);
    // eval's dumps likewise
    CHECK(run_cli({"eval", t.cfg, "--checkpoint", t.ckpt, "--dump-logits", t.other}, {}, -1, &err) == kExitUsage);
    CHECK(read_all(t.other) == before);
    // --force: the user says so
    CHECK(run_cli({"export", t.ckpt, "--out", t.other, "--force"}, {}, -1, &err) == kExitOk);
    CHECK(read_all(t.other) != before);
    CHECK(run_cli({"plan", t.cfg, "--gpu", "h100", "--json", t.run + "/summary.json", "--force"}, {}, -1, &err) ==
          kExitOk);
    // a new file in a run folder is not something the user would lose
    CHECK(run_cli({"export", t.ckpt, "--out", t.run + "/weights.safetensors"}, {}, -1, &err) == kExitOk);
    // scale --out onto a file: exit 2, naming it
    const std::string file = t.d.write("a-file", "x");
    CHECK(run_cli({"scale", t.cfg, "--kind", "cpu", "--replicas", "1", "--steps", "1", "--out", file}, {}, -1, &err) ==
          kExitUsage);
    CHECK(err.find("--out " + file + ": is a file") != std::string::npos);
}

// The protected-file rule covers the data a command reads: a token file, an image folder's files.
TEST_CASE("outputs: --json and --dump-* never replace a data file the command reads, nor write into an image folder") {
    TempDir d;
    const std::string tokens(2 * 4096, '\x01');
    const std::string train = d.write("train.bin", tokens), val = d.write("val.bin", tokens.substr(0, 512));
    const std::string cfg = d.write("lm.yaml", R"(run: {name: lm, seed: 1}
strategy: {devices: "cpu:1"}
data: {dataset: tokens, root: ., train: train.bin, test: val.bin, context: 8, vocab: 32}
model: {layers: [{type: embedding, vocab: 32, dim: 16}, {type: position_embedding, max_len: 8},
                 {type: transformer_block, heads: 2}, {type: layernorm}, {type: lm_head}]}
optimizer: {type: adamw, lr: 0.001}
train: {epochs: 0, steps: 2, global_batch_size: 4}
)");
    std::string err;
    CHECK(run_cli({"bench-step", cfg, "--devices", "cpu:1", "--steps", "1", "--json", train}, {}, -1, &err) ==
          kExitUsage);
    CHECK(err.find("is data of data.tokens, which this command reads") != std::string::npos);
    CHECK(run_cli({"plan", cfg, "--gpu", "h100", "--json", val}, {}, -1, &err) == kExitUsage);
    CHECK(err.find("--json " + val + ": is data of data.tokens") != std::string::npos);
    // relative to the working folder, another spelling of the same file
    CHECK(run_cli({"plan", cfg, "--gpu", "h100", "--json", d / "./sub/../train.bin"}, {}, -1, &err) == kExitUsage);
    CHECK(run_cli({"eval", cfg, "--checkpoint", d / "none.safetensors", "--dump-inputs", train}, {}, -1, &err) ==
          kExitUsage);
    CHECK(err.find("--dump-inputs " + train + ": is data of data.tokens") != std::string::npos);
    CHECK(read_all(train) == tokens);
    CHECK(read_all(val) == tokens.substr(0, 512));
    // an image folder: a file under it is the data too, however named
    std::filesystem::create_directories(d.path() / "images/train/cat");
    std::filesystem::create_directories(d.path() / "images/val/cat");
    const std::string images = d.write("img.yaml", R"(run: {name: img, seed: 1}
data: {dataset: image_folder, root: images, train: train, test: val, size: 8}
model: {layers: [{type: dense, units: 3}]}
train: {epochs: 1, global_batch_size: 4}
)");
    CHECK(run_cli({"plan", images, "--gpu", "h100", "--json", d / "images/train/cat/plan.json"}, {}, -1, &err) ==
          kExitUsage);
    CHECK(err.find("is inside " + (d / "images/train") + ", data of data.image_folder, which") != std::string::npos);
    CHECK(!std::filesystem::exists(d.path() / "images/train/cat/plan.json"));
}

TEST_CASE("outputs: temporaries never go through a planted link; a cache path that is not a file is left alone") {
    TempDir d;
    // the atomic writer's temporary is a new file (O_EXCL): a link planted at the old fixed name
    // ".NAME.tmp" is neither followed nor replaced
    const std::string victim = d.write("victim", "keep me");
    const std::string target = d / "out.txt";
    REQUIRE(::symlink(victim.c_str(), (d / ".out.txt.tmp").c_str()) == 0);
    write_file_atomic(target, "new");
    CHECK(read_all(target) == "new");
    CHECK(read_all(victim) == "keep me");
    CHECK(is_kind(d / ".out.txt.tmp", S_IFLNK));
    // the machine cache: a link or a named pipe at its path is neither followed nor opened blocking
    const std::string cache = d / "cache";
    std::filesystem::create_directories(cache);
    REQUIRE(::symlink(victim.c_str(), (cache + "/cross-device-ops.txt").c_str()) == 0);
    REQUIRE(::mkfifo((cache + "/blas-kernel.txt").c_str(), 0600) == 0);
    const std::string cfg = d.write("c.yaml", kRun);
    std::string err;
    CHECK(run_cli({"train", cfg, "--output", d / "run", "--devices", "cpu:2", "--set", "strategy.cross_device_ops=auto",
                   "--set", "train.epochs=1"},
                  {{"MIRRORED_CACHE_DIR", cache}}, -1, &err) == kExitOk);
    CAPTURE(err);
    CHECK(read_all(victim) == "keep me");
    CHECK(is_kind(cache + "/cross-device-ops.txt", S_IFLNK));
    CHECK(is_kind(cache + "/blas-kernel.txt", S_IFIFO));
}
