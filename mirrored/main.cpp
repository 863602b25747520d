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
#include <string_view>
#include <vector>

#include "kernels/blas.h"
#include "kernels/device.h"
#include "base/error.h"
#include "base/output.h"
#include "base/signals.h"
#include "mirrored/adaptation.h"
#include "mirrored/checkpoint.h"
#include "mirrored/config.h"
#include "mirrored/export_names.h"
#include "mirrored/hf_models.h"
#include "mirrored/model.h"
#include "mirrored/nodes.h"
#include "mirrored/software.h"
#include "mirrored/tools/commands.h"
#include "mirrored/evaluation.h"
#include "mirrored/trainer.h"

using namespace mirrored;

namespace {

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

// The commands that run or read a model: train, eval, export, devices.
struct ModelCommands {
    std::string config, checkpoint, out, devices, output, names = "mirrored";
    bool force = false, merge = false;
    std::vector<std::string> sets;
    bool print_config = false;
    EvalDump dump;
    std::unique_ptr<Nodes> nodes;  // a multi-node `train`, started by mpirun
    CLI::App *train = nullptr, *eval = nullptr, *exp = nullptr, *devices_cmd = nullptr;
    char** argv;  // this command line, for a run that continues without a failed device

    ModelCommands(CLI::App& app, char** args) : argv(args) {
        train = app.add_subcommand("train", "train a model from a YAML config");
        train->add_option("config", config, "YAML configuration file")->required();
        train->add_option("--set", sets, "override any key: --set model.layers.1.units=256 (repeatable)");
        train->add_option("--devices", devices,
                          "shorthand for --set strategy.devices=SPEC (auto, cuda:0,1, cuda:0,0, cpu:4)");
        train->add_option("--output", output, "shorthand for --set run.output_dir=DIR");
        train->add_flag("--print-config", print_config,
                        "print the resolved configuration (defaults included) and exit");

        eval = app.add_subcommand("eval", "test-set loss and accuracy of a checkpoint (or of model.init_from)");
        eval->add_option("config", config, "the run's YAML configuration")->required();
        eval->add_option("--checkpoint", checkpoint, "checkpoint file (none: model.init_from's weights as they are)");
        eval->add_option("--set", sets, "override a key (repeatable)");
        eval->add_option("--devices", devices, "device spec for evaluation");
        eval->add_option("--dump-inputs", dump.inputs, "write the test samples (normalised, NHWC) to this .npy file");
        eval->add_option("--dump-logits", dump.logits, "write the model's logits for them to this .npy file");
        eval->add_option("--limit", dump.limit, "dump only the first N test samples")->check(CLI::Range(1, 100000000));
        eval->add_flag("--force", dump.force, "let --dump-* replace a checkpoint or a file of a run folder");

        exp = app.add_subcommand("export", "write a checkpoint's weights as a plain safetensors file");
        exp->add_option("checkpoint", checkpoint, "checkpoint file")->required();
        exp->add_option("--out", out, "output .safetensors file (--names hf: a folder)")->required();
        exp->add_flag("--force", force, "let --out replace a checkpoint or a file of a run folder");
        exp->add_option("--names", names,
                        "mirrored (PyTorch's nn.Module names of the config's layers), nanogpt (nanoGPT's GPT: "
                        "transformer.wte, transformer.h.N..., lm_head) or hf (a GPT-2 or Llama-style model as a "
                        "Hugging Face folder: model.safetensors, config.json)")
            ->check(CLI::IsMember({"mirrored", "nanogpt", "hf"}));
        exp->add_flag("--merge", merge,
                      "--names hf of a LoRA run: the adapters merged into the weights (a whole model), instead of "
                      "PEFT's adapter_model.safetensors and adapter_config.json");

        devices_cmd = app.add_subcommand("devices", "list GPUs, peer access, links and versions (or the CPU)");
    }

    // The exit code, or -1 when none of these commands was given.
    int run() {
        if (train->parsed() || eval->parsed()) return train_or_eval();
        if (exp->parsed()) return export_weights();
        if (devices_cmd->parsed()) return print_devices();
        return -1;
    }

private:
    // A node that printed its configuration and left would leave the others waiting for it: every
    // node of a job prints (node 0 alone writes it out) or every node trains.
    void agree_on_print_config(Nodes& n) const {
        const std::vector<std::string> all =
            n.all_gather(print_config ? "1" : "0", "the exchange of the command lines");
        for (size_t k = 1; k < all.size(); ++k)
            if (all[k] != all[0])
                throw ConfigError("--print-config: node " + std::to_string(k) + " was started " +
                                  (all[k] == "1" ? "with" : "without") + " it, node 0 " +
                                  (all[0] == "1" ? "with" : "without") +
                                  ": start every node of the job with the same command line");
    }

    int train_or_eval() {
        if (train->count("--devices") + eval->count("--devices") > 0) {
            if (devices.empty()) throw ConfigError("--devices: expected a device list such as auto, cpu:2 or cuda:0,1");
            sets.push_back("strategy.devices=" + devices);
        }
        if (train->count("--output") > 0) {
            if (output.empty()) throw ConfigError("--output: expected a folder");
            sets.push_back("run.output_dir=" + output);
        }
        Failover failover;
        if (train->parsed()) failover = continuation();
        const Config cfg = load_config(config, sets);
        if (train->parsed()) {
            nodes = Nodes::join(nullptr, nullptr);
            if (nodes) cpu_gemm_use_rules();  // each node measuring would pick its own GEMM kernels
            if (nodes) agree_on_print_config(*nodes);
        }
        if (print_config) {
            if (!nodes || nodes->leader()) std::cout << config_to_yaml(cfg);
            return kExitOk;
        }
        if (train->parsed()) return run_training(cfg, nodes.get(), stdout, failover);
        if (checkpoint.empty() && cfg.model.init_from.empty())
            throw ConfigError("eval: --checkpoint is required (or a config with model.init_from)");
        std::vector<std::pair<std::string, std::string>> read = {{"the checkpoint", checkpoint},
                                                                 {"the configuration file", config}};
        for (auto& input : data_inputs(cfg.data, cfg.base_dir)) read.push_back(std::move(input));
        if (!dump.inputs.empty()) check_output({"--dump-inputs", dump.inputs, dump.force, read});
        if (!dump.logits.empty()) {
            auto taken = read;
            taken.push_back({"the file --dump-inputs writes", dump.inputs});
            check_output({"--dump-logits", dump.logits, dump.force, taken});
        }
        const EvalResult r = evaluate_checkpoint(cfg, checkpoint, dump);
        if (checkpoint.empty())
            std::printf("%s (pretrained): test loss %.6f, test accuracy %.4f over %zu samples\n",
                        cfg.model.init_from.c_str(), r.loss, r.accuracy, r.samples);
        else
            std::printf("checkpoint %s (step %lld): test loss %.6f, test accuracy %.4f over %zu samples\n",
                        checkpoint.c_str(), static_cast<long long>(r.step), r.loss, r.accuracy, r.samples);
        return kExitOk;
    }

    // strategy.on_replica_failure: continue. A run hands itself to this program again, on its
    // surviving devices, through MIRRORED_CONTINUATION; in such a process the survivors, their
    // accumulation and a resume from the run's own last checkpoint override the command line.
    Failover continuation() {
        Failover f;
        f.restart = [this](const Continuation& c) {
            if (::setenv(kContinuationVar, encode_continuation(c).c_str(), 1) == 0) exec_self(argv);
        };
        const char* handed = std::getenv(kContinuationVar);
        if (!handed || !*handed) return f;
        f.continued = decode_continuation(handed);
        ::unsetenv(kContinuationVar);  // not for the processes this one starts
        sets.push_back("strategy.devices=" + f.continued->devices);
        sets.push_back("train.grad_accumulation_steps=" + std::to_string(f.continued->accumulation));
        sets.push_back("checkpoint.resume=" + (f.continued->resume.empty() ? "auto" : f.continued->resume));
        return f;
    }

    // The checkpoint's embedded config (as the model was trained).
    Config embedded_config(const std::map<std::string, std::string>& metadata) const {
        const auto it = metadata.find("config");
        if (it == metadata.end()) throw CheckpointError(checkpoint + ": no embedded config: not a mirrored checkpoint");
        try {
            return load_config_text(it->second, checkpoint, {});
        } catch (const ConfigError& e) {
            throw CheckpointError(checkpoint + ": its embedded config does not load: " + e.what());
        }
    }

    // Every tensor of the model the checkpoint describes (its embedded config), of the model's
    // shape and finite, as a resume would check: an export is not a way around those checks.
    void check_complete(const SafetensorsFile& f) const {
        const Config c = embedded_config(f.metadata);
        const auto built = build_model(c);
        (void)read_checkpoint(checkpoint, *built, model_config_hash(c), model_config_summary(c));
    }

    // The weights without the optimizer state, under PyTorch's names (or nanoGPT's).
    int export_weights() {
        if (names == "hf") return export_hf();
        if (merge) throw ConfigError("--merge: only with --names hf (a Hugging Face folder of the merged model)");
        const OutputTarget target{"--out", out, force, {{"the checkpoint", checkpoint}}};
        check_output(target);
        SafetensorsFile f = read_safetensors(checkpoint, true);
        check_complete(f);
        SafetensorsFile weights;
        for (auto& [name, t] : f.tensors)
            if (name.rfind("optimizer.", 0) != 0) weights.tensors[name] = std::move(t);
        if (names == "nanogpt") {
            const Config c = embedded_config(f.metadata);
            std::vector<std::string> mine;
            for (const auto& [name, t] : weights.tensors) mine.push_back(name);
            SafetensorsFile renamed;
            for (const auto& [from, to] : nanogpt_names(c.model.layers, mine))
                renamed.tensors[to] = weights.tensors[from];
            weights.tensors = std::move(renamed.tensors);
        }
        // PyTorch's batchnorm also keeps how many batches updated its running statistics: one per
        // optimizer step here.
        const int64_t steps = std::strtoll(f.metadata["step"].c_str(), nullptr, 10);
        const std::string suffix = ".running_mean";
        for (const auto& [name, t] : weights.tensors)
            if (name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0)
                weights.int_tensors[name.substr(0, name.size() - suffix.size()) + ".num_batches_tracked"] = {{},
                                                                                                             {steps}};
        weights.metadata = {
            {"format", "pt"}, {"source", checkpoint}, {"step", f.metadata["step"]}, {"model", f.metadata["model"]}};
        write_output(target, safetensors_bytes(weights));
        std::printf("wrote %zu tensors to %s\n", weights.tensors.size() + weights.int_tensors.size(), out.c_str());
        return kExitOk;
    }

    // A Hugging Face model folder: --out/model.safetensors and --out/config.json.
    int export_hf() {
        std::error_code ec;
        if (std::filesystem::exists(out, ec) && !std::filesystem::is_directory(out, ec))
            throw ConfigError("--out: " + out + " is not a folder (--names hf writes a Hugging Face model folder)");
        const Config c = embedded_config(read_checkpoint_metadata(checkpoint));
        const auto built = build_model(c);
        const Model& model = *built;
        const bool lora = model.adaptation().lora_rank > 0;
        if (merge && !lora) throw ConfigError("--merge: the checkpoint's model has no LoRA adapters (model.lora)");
        std::vector<float> params =
            read_checkpoint(checkpoint, model, model_config_hash(c), model_config_summary(c)).params;
        if (merge) params = merged_params(model, params.data());
        // a model it cannot be: nothing made
        const bool adapters = lora && !merge;
        const HfModelFiles m =
            adapters ? hf_adapter_files(model, params.data(), c.model.init_from) : hf_model_files(model, params.data());
        const std::string weights_file = adapters ? "adapter_model.safetensors" : "model.safetensors",
                          config_file = adapters ? "adapter_config.json" : "config.json";
        std::vector<OutputTarget> targets = {
            {"--out", out + "/" + weights_file, force, {{"the checkpoint", checkpoint}}},
            {"--out", out + "/" + config_file, force, {{"the checkpoint", checkpoint}}}};
        // the tokenizer of the folder the run started from travels with the model
        std::vector<std::string> tokenizer;
        for (const char* f : {"tokenizer.json", "tokenizer.model", "tokenizer_config.json", "special_tokens_map.json",
                              "vocab.json", "merges.txt", "generation_config.json"}) {
            const std::string from = c.model.init_from + "/" + f;
            if (c.model.init_from.empty() || !std::filesystem::is_regular_file(from, ec)) continue;
            tokenizer.push_back(from);
            targets.push_back({"--out", out + "/" + f, force, {{"the checkpoint", checkpoint}, {"its source", from}}});
        }
        const bool made = !std::filesystem::exists(out, ec);
        std::filesystem::create_directories(out, ec);
        try {
            for (const OutputTarget& t : targets) check_output(t);
        } catch (...) {
            if (made) std::filesystem::remove(out, ec);
            throw;
        }
        write_output(targets[0], safetensors_bytes(m.weights));
        write_output(targets[1], m.config_json);
        for (size_t k = 0; k < tokenizer.size(); ++k)
            write_output(targets[2 + k], read_regular_file(tokenizer[k], uint64_t(1) << 30));
        std::printf("wrote %zu tensors to %s/%s and its %s%s\n", m.weights.tensors.size(), out.c_str(),
                    weights_file.c_str(), config_file.c_str(), tokenizer.empty() ? "" : ", and the tokenizer's files");
        return kExitOk;
    }
};

// An unknown first word is named with the list of commands (CLI11 would call it an extra
// positional argument).
bool known_command(CLI::App& app, int argc, char** argv) {
    if (argc < 2 || argv[1][0] == '-') return true;
    std::string names;
    for (const auto* sub : app.get_subcommands({})) {
        if (sub->get_name() == argv[1]) return true;
        names += (names.empty() ? "" : ", ") + sub->get_name();
    }
    std::fprintf(stderr, "error: unknown command '%s' (commands: %s)\n", argv[1], names.c_str());
    return false;
}

std::string node_prefix(const Nodes* nodes) {
    return nodes ? "node " + std::to_string(nodes->rank()) + " (" + nodes->host() + "): " : std::string();
}

// Every error leaves through here: one line naming what is wrong, and the documented exit code.
// In a multi-node run the other nodes must stop too (they would wait for this one's next
// collective): MPI_Abort ends the whole job with the same exit code.
int report_error(const Error& e, Nodes* nodes) {
    end_status_line();
    std::fprintf(stderr, "error: %s%s\n", node_prefix(nodes).c_str(), e.what());
    if (nodes) nodes->abort(e.code());
    if (e.code() == kExitDevice) {
        // A failed GPU context can hang the CUDA runtime's own teardown at exit; everything of
        // ours is already closed and flushed (the run's objects were destroyed while unwinding).
        std::fflush(nullptr);
        std::_Exit(kExitDevice);
    }
    return e.code();
}

}  // namespace

// A training run interrupted at any point ends with exit 130, also while it starts (choosing the
// BLAS kernel, reading the config): before training there is nothing to save. The handlers go in
// from the executable's pre-initialisers, which the dynamic loader calls (with argc and argv) as
// soon as the shared libraries are mapped and relocated, before any library's initialisers run
// (cuBLASLt's alone take ~50 ms). The handler needs no initialised state: its flags are constant-
// initialised atomics. Signals a re-execution blocked (the BLAS kernel's choice) are let through
// once the handlers are in.
void handle_signals_early(int argc, char** argv, char**) {
    if (argc > 1 && argv && argv[1] && std::string_view(argv[1]) == "train") install_signal_handlers();
}
__attribute__((section(".preinit_array"), used)) void (*const kHandleSignalsFirst)(int, char**,
                                                                                   char**) = handle_signals_early;

int main(int argc, char** argv) {
    const sigset_t held = interrupt_signal_set();
    ::sigprocmask(SIG_UNBLOCK, &held, nullptr);
    choose_blas_kernel(argv);  // may re-execute the process with a faster BLAS kernel: first, before any thread
    protect_standard_streams();
    CLI::App app{"mirrored: single-node multi-GPU data-parallel training (one process, one replica per device)"};
    app.require_subcommand(1);
    app.set_help_all_flag("--help-all", "help for every command");
    app.set_version_flag("--version", version_text,
                         "this build and the libraries it runs on (what every node of a job must share)");
    ModelCommands model(app, argv);
    ToolCommands tools(app);
    if (!known_command(app, argc, argv)) return kExitUsage;
    try {
        app.parse(argc, argv);
    } catch (const CLI::CallForHelp& e) {
        return app.exit(e);
    } catch (const CLI::CallForAllHelp& e) {
        return app.exit(e);
    } catch (const CLI::CallForVersion& e) {
        return app.exit(e);
    } catch (const CLI::ParseError& e) {
        std::fprintf(stderr, "error: %s\n(run 'mirrored --help' or 'mirrored <command> --help')\n", e.what());
        return kExitUsage;
    }
    try {
        if (const int rc = model.run(); rc >= 0) return rc;
        if (const int rc = tools.run(); rc >= 0) return rc;
    } catch (const Error& e) {
        return report_error(e, model.nodes.get());
    } catch (const std::bad_alloc&) {
        return report_error(DeviceError("out of host memory (a dataset, model or batch too large for this machine)"),
                            model.nodes.get());
    } catch (const std::exception& e) {
        return report_error(Error(kExitFailure, std::string("internal: ") + e.what()), model.nodes.get());
    }
    return kExitUsage;
}
