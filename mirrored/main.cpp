// mirrored command line. Exit codes (README): 0 success, 2 usage or configuration error,
// 3 data error, 4 checkpoint error, 5 device error, 6 training diverged, 130 interrupted after a
// checkpoint was written.
#include <CLI/CLI.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <csignal>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "kernels/error.h"
#include "mirrored/checkpoint.h"
#include "mirrored/config.h"
#include "mirrored/tools/tools.h"
#include "mirrored/trainer.h"

using namespace mirrored;

namespace {

// "1,2,4" -> {1, 2, 4}: positive integers of at most 6 digits.
std::vector<int> parse_list(const std::string& s, const char* flag) {
    std::vector<int> out;
    size_t start = 0;
    while (start <= s.size()) {
        const size_t comma = std::min(s.find(',', start), s.size());
        const std::string item = s.substr(start, comma - start);
        if (item.empty() || item.size() > 6 || item.find_first_not_of("0123456789") != std::string::npos ||
            std::stoi(item) == 0)
            throw ConfigError(std::string(flag) + ": expected a list of positive integers like 1,2,4, got '" + s + "'");
        out.push_back(std::stoi(item));
        start = comma + 1;
    }
    return out;
}

// No file descriptor 0-2 may be closed: the next file opened (metrics.jsonl, say) would take its
// number, and progress lines meant for the terminal would land in it. A closed pipe must not kill
// the run with SIGPIPE before it can write a checkpoint: writes to it simply fail.
void protect_standard_streams() {
    for (int fd = 0; fd <= 2; ++fd)
        if (::fcntl(fd, F_GETFD) == -1 && errno == EBADF) {
            const int nfd = ::open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY);
            if (nfd != fd && nfd >= 0) ::close(nfd);
        }
    std::signal(SIGPIPE, SIG_IGN);
}

// A progress line may be open on a terminal: end it before an error is printed.
void end_status_line() {
    std::fflush(stdout);
    if (isatty(1)) std::printf("\n");
    std::fflush(stdout);
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
    else if (!unit.empty() && unit != "B") throw ConfigError(std::string(flag) + ": expected a size like 4K, 64M or 1G, got '" + s + "'");
    const double bytes = v * mult;
    if (end == s.c_str() || !(bytes >= 4) || bytes > double(uint64_t(64) << 30) || bytes != std::floor(bytes) ||
        std::fmod(bytes, 4.0) != 0)
        throw ConfigError(std::string(flag) + ": expected a whole number of floats (a multiple of 4 bytes) from 4 bytes to 64G, got '" + s + "'");
    return size_t(bytes);
}

}  // namespace

int main(int argc, char** argv) {
    protect_standard_streams();
    CLI::App app{"mirrored: single-node multi-GPU data-parallel training (one process, one replica per device)"};
    app.require_subcommand(1);
    app.set_help_all_flag("--help-all", "help for every command");

    std::string config, checkpoint, out, devices, output;
    std::vector<std::string> sets;
    bool print_config = false;

    auto* train = app.add_subcommand("train", "train a model from a YAML config");
    train->add_option("config", config, "YAML configuration file")->required();
    train->add_option("--set", sets, "override any key: --set model.layers.1.units=256 (repeatable)");
    train->add_option("--devices", devices, "shorthand for --set strategy.devices=SPEC (auto, cuda:0,1, cuda:0,0, cpu:4)");
    train->add_option("--output", output, "shorthand for --set run.output_dir=DIR");
    train->add_flag("--print-config", print_config, "print the resolved configuration (defaults included) and exit");

    auto* eval = app.add_subcommand("eval", "test-set loss and accuracy of a checkpoint");
    eval->add_option("config", config, "the run's YAML configuration")->required();
    eval->add_option("--checkpoint", checkpoint, "checkpoint file")->required();
    eval->add_option("--set", sets, "override a key (repeatable)");
    eval->add_option("--devices", devices, "device spec for evaluation");
    EvalDump dump;
    eval->add_option("--dump-inputs", dump.inputs, "write the test samples (normalised, NHWC) to this .npy file");
    eval->add_option("--dump-logits", dump.logits, "write the model's logits for them to this .npy file");
    eval->add_option("--limit", dump.limit, "dump only the first N test samples")->check(CLI::Range(1, 100000000));

    auto* exp = app.add_subcommand("export", "write a checkpoint's weights as a plain safetensors file");
    exp->add_option("checkpoint", checkpoint, "checkpoint file")->required();
    exp->add_option("--out", out, "output .safetensors file")->required();

    app.add_subcommand("devices", "list GPUs, peer access, links and versions (or the CPU)");

    LoaderBenchOptions lb;
    std::string lb_threads = "1,2";
    auto* bl = app.add_subcommand("bench-loader", "samples/s of the input pipeline alone");
    bl->add_option("--config", lb.config, "use this config's data section (default: Fashion-MNIST)");
    bl->add_option("--threads", lb_threads, "loader thread counts to measure, e.g. 1,2,4");
    bl->add_option("--batch", lb.batch, "global batch size")->check(CLI::Range(1, 1 << 24));
    bl->add_option("--seconds", lb.seconds, "seconds per measurement")->check(CLI::Range(0.01, 3600.0));
    bl->add_option("--json", lb.json_path, "also write the results here");

    AllReduceBenchOptions ab;
    std::string min_b = "4K", max_b = "64M";
    auto* ba = app.add_subcommand("bench-allreduce", "time, algbw and busbw of the all-reduce per size");
    ba->add_option("--devices", ab.devices, "replicas: auto, cuda:0,1, cuda:0,0,0,0, cpu:4");
    ba->add_option("--op", ab.op, "ring, nccl or reduce_to_one");
    ba->add_option("--min-bytes", min_b, "smallest size (4K)");
    ba->add_option("--max-bytes", max_b, "largest size (64M)");
    ba->add_option("--iters", ab.iters, "iterations per size (default: by size)")->check(CLI::Range(1, 1000000));
    ba->add_option("--transport", ab.transport, "CUDA peer reads: auto, direct (kernel loads peer memory), staged (copy, then add)");
    ba->add_option("--dtype", ab.dtype, "gradients on the wire: fp32 or bf16 (half the bytes, sums in f32)");
    ba->add_option("--json", ab.json_path, "also write the table here");

    StepBenchOptions sb;
    std::string sb_devices;
    auto* bs = app.add_subcommand("bench-step", "training throughput for 1..N replicas: the scaling test");
    bs->add_option("config", sb.config, "YAML config (default configs/synthetic_mlp.yaml)");
    bs->add_option("--set", sb.sets, "override a key (repeatable)");
    bs->add_option("--devices", sb_devices, "device lists separated by ';', e.g. 'cpu:1;cpu:2' (default: 1..all)");
    bs->add_option("--steps", sb.steps, "timed steps per device list")->check(CLI::Range(1, 10000000));
    bs->add_option("--warmup", sb.warmup, "untimed steps first")->check(CLI::Range(0, 1000000));
    bs->add_option("--per-replica-batch", sb.per_replica_batch, "global batch = this x replicas (weak scaling)")
        ->check(CLI::Range(1, 1 << 24));
    bs->add_option("--json", sb.json_path, "also write the results here");

    GemmBenchOptions gb;
    std::string gb_sizes = "128,512,1024,2048";
    auto* bg = app.add_subcommand("bench-gemm", "GEMM GFLOP/s of one device: the ceiling a step is measured against");
    bg->add_option("--device", gb.device, "cpu (one BLAS thread) or cuda:N");
    bg->add_option("--sizes", gb_sizes, "square sizes, e.g. 128,1024");
    bg->add_flag("--tf32", gb.tf32, "TF32 tensor cores (CUDA); the same as --precision tf32");
    std::string gb_precision = "fp32";
    bg->add_option("--precision", gb_precision, "fp32, tf32, bf16 or fp16 inputs (f32 accumulation and output)")
        ->check(CLI::IsMember({"fp32", "tf32", "bf16", "fp16"}));
    bg->add_option("--json", gb.json_path, "also write the results here");

    ConvLayoutBenchOptions cl;
    auto* bc = app.add_subcommand("bench-conv-layout", "a convolution's forward + backward with NHWC vs NCHW activations (CPU)");
    bc->add_option("--batch", cl.batch, "images per replica")->check(CLI::Range(1, 4096));
    bc->add_option("--reps", cl.reps, "timed repetitions (the median is reported)")->check(CLI::Range(1, 1000));
    bc->add_option("--json", cl.json_path, "also write the results here");

    if (argc >= 2 && argv[1][0] != '-') {
        bool known = false;
        for (const auto* sub : app.get_subcommands({})) known = known || sub->get_name() == argv[1];
        if (!known) {
            std::fprintf(stderr, "error: unknown command '%s' (commands: train, eval, export, devices, bench-loader, "
                                 "bench-allreduce, bench-step, bench-gemm, bench-conv-layout)\n", argv[1]);
            return kExitUsage;
        }
    }
    try {
        app.parse(argc, argv);
    } catch (const CLI::CallForHelp& e) {
        return app.exit(e);
    } catch (const CLI::CallForAllHelp& e) {
        return app.exit(e);
    } catch (const CLI::ParseError& e) {
        std::fprintf(stderr, "error: %s\n(run 'mirrored --help' or 'mirrored <command> --help')\n", e.what());
        return kExitUsage;
    }

    try {
        if (train->parsed() || eval->parsed()) {
            if (train->count("--devices") + eval->count("--devices") > 0) {
                if (devices.empty()) throw ConfigError("--devices: expected a device list such as auto, cpu:2 or cuda:0,1");
                sets.push_back("strategy.devices=" + devices);
            }
            if (train->count("--output") > 0) {
                if (output.empty()) throw ConfigError("--output: expected a folder");
                sets.push_back("run.output_dir=" + output);
            }
            const Config cfg = load_config(config, sets);
            if (print_config) {
                std::cout << config_to_yaml(cfg);
                return kExitOk;
            }
            if (train->parsed()) {
                install_signal_handlers();
                return run_training(cfg);
            }
            const EvalResult r = evaluate_checkpoint(cfg, checkpoint, dump);
            std::printf("checkpoint %s (step %lld): test loss %.6f, test accuracy %.4f over %zu samples\n",
                        checkpoint.c_str(), static_cast<long long>(r.step), r.loss, r.accuracy, r.samples);
            return kExitOk;
        }
        if (exp->parsed()) {
            std::error_code ec;
            if (std::filesystem::exists(out, ec) && std::filesystem::equivalent(out, checkpoint, ec))
                throw ConfigError("--out " + out + ": is the checkpoint itself; choose another file for the export");
            if (std::filesystem::is_directory(out, ec)) throw ConfigError("--out " + out + ": is a directory; name a file");
            SafetensorsFile f = read_safetensors(checkpoint, true);
            SafetensorsFile weights;
            for (auto& [name, t] : f.tensors)
                if (name.rfind("optimizer.", 0) != 0) weights.tensors[name] = std::move(t);
            // PyTorch's batchnorm also keeps how many batches updated its running statistics:
            // one per optimizer step here.
            const int64_t steps = std::strtoll(f.metadata["step"].c_str(), nullptr, 10);
            const std::string suffix = ".running_mean";
            for (const auto& [name, t] : weights.tensors)
                if (name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0)
                    weights.int_tensors[name.substr(0, name.size() - suffix.size()) + ".num_batches_tracked"] = {{}, {steps}};
            weights.metadata = {{"format", "pt"}, {"source", checkpoint}, {"step", f.metadata["step"]},
                                {"model", f.metadata["model"]}};
            write_safetensors(out, weights);
            std::printf("wrote %zu tensors to %s\n", weights.tensors.size() + weights.int_tensors.size(), out.c_str());
            return kExitOk;
        }
        if (app.got_subcommand("devices")) return print_devices();
        if (bl->parsed()) {
            lb.threads = parse_list(lb_threads, "--threads");
            return bench_loader(lb);
        }
        if (ba->parsed()) {
            ab.min_bytes = parse_bytes(min_b, "--min-bytes");
            ab.max_bytes = parse_bytes(max_b, "--max-bytes");
            return bench_allreduce(ab);
        }
        if (bg->parsed()) {
            gb.sizes = parse_list(gb_sizes, "--sizes");
            gb.precision = gb_precision == "tf32" ? Precision::tf32 : gb_precision == "bf16" ? Precision::bf16
                           : gb_precision == "fp16" ? Precision::fp16 : Precision::fp32;
            return bench_gemm(gb);
        }
        if (bc->parsed()) return bench_conv_layout(cl);
        if (bs->parsed()) {
            size_t start = 0;
            while (start < sb_devices.size()) {
                const size_t semi = std::min(sb_devices.find(';', start), sb_devices.size());
                if (semi > start) sb.devices.push_back(sb_devices.substr(start, semi - start));
                start = semi + 1;
            }
            return bench_step(sb);
        }
    } catch (const Error& e) {
        end_status_line();
        std::fprintf(stderr, "error: %s\n", e.what());
        if (e.code() == kExitDevice) {
            // A failed GPU context can hang the CUDA runtime's own teardown at exit; everything of
            // ours is already closed and flushed (the run's objects were destroyed while unwinding).
            std::fflush(nullptr);
            std::_Exit(kExitDevice);
        }
        return e.code();
    } catch (const std::bad_alloc&) {
        end_status_line();
        std::fprintf(stderr, "error: out of host memory (a dataset, model or batch too large for this machine)\n");
        return kExitDevice;
    } catch (const std::exception& e) {
        end_status_line();
        std::fprintf(stderr, "error: internal: %s\n", e.what());
        return kExitFailure;
    }
    return kExitUsage;
}
