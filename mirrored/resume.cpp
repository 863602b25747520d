#include "mirrored/resume.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "base/io.h"
#include "base/output.h"
#include "kernels/blas.h"
#include "mirrored/run_dir.h"
#include "mirrored/run_log.h"
#include "mirrored/software.h"
#include "mirrored/util.h"

namespace mirrored {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// How to resume on the checkpoint's BLAS kernel, when only the OpenBLAS kernel differs (the
// measured choice can differ from the one made where the checkpoint was written: another
// machine, or a lost cache and a close second): "; to resume bit-identically, rerun with ...".
std::string blas_kernel_hint(const std::string& written, const std::string& now) {
    const auto split = [](const std::string& k) {
        const size_t plus = k.find(" + ");
        return std::pair{k.substr(0, plus), plus == std::string::npos ? std::string() : k.substr(plus)};
    };
    const auto [core, jit] = split(written);
    const auto [now_core, now_jit] = split(now);
    // the same kernels, each product's chosen another way (kernels/cpu/gemm_choice.h)
    const JitGemmChoice choice = split_jit_gemm_choice(jit);
    if (core == now_core && jit != now_jit && choice.kernels == split_jit_gemm_choice(now_jit).kernels)
        return "; to resume bit-identically, rerun with MIRRORED_JIT_GEMM=" + choice.env_value;
    const bool plain =
        !core.empty() && std::all_of(core.begin(), core.end(), [](char c) { return std::isalnum(uint8_t(c)); });
    if (!plain || core == now_core || jit != now_jit) return "";
    return "; to resume bit-identically, rerun with OPENBLAS_CORETYPE=" + core + " MIRRORED_BLAS_AUTO=0";
}

// The mirrored build that wrote a checkpoint ("" where it did not record one).
std::string written_by(const CheckpointData& ckpt) {
    const json j = json::parse(ckpt.software, nullptr, false);
    return j.is_object() && j.contains("mirrored") && j["mirrored"].is_string() ? j["mirrored"].get<std::string>() : "";
}

}  // namespace

std::string gemm_library(const MirroredStrategy& st, const Config& cfg) {
    return st.backend().gemm_library(cfg.strategy.fused_epilogues);
}

void adopt_gemm_choices(const CheckpointData& ckpt, const MirroredStrategy& st, const Config& cfg, std::FILE* out) {
    if (ckpt.gemm_choices.empty() || ckpt.blas_kernel != gemm_library(st, cfg)) return;
    size_t recorded = 0;
    const size_t adopted = st.backend().adopt_gemm_choices(ckpt.gemm_choices, &recorded);
    if (adopted)
        std::fprintf(out, "  GEMM kernels of %zu product shapes as the checkpoint's run measured them\n", adopted);
    if (recorded > adopted)
        std::fprintf(
            out,
            "  note: %zu of the checkpoint's %zu GEMM kernel choices are not ones this build can run here (another "
            "version's, a kernel not built here or not for this CPU): those products' kernels are chosen "
            "again (this machine's cache or a new measurement), so the resumed run may differ from an "
            "uninterrupted one in the last bits\n",
            recorded - adopted, recorded);
}

// cross_device_ops: auto, resuming: the op the checkpoint to resume from was written with, read
// from its header before anything is built, so that the strategy keeps it - a measurement could
// pick another op, which sums in another order, and the resume would not be bit-identical.
Config with_resume_hints(Config c) {
    if (c.strategy.cross_device_ops != "auto" || c.checkpoint.resume == "never") return c;
    std::string path = c.checkpoint.resume;
    if (path == "auto") {  // the newest; the lock is not held yet, so no temporary is touched
        const auto found = list_checkpoints((fs::path(c.run.output_dir) / "checkpoints").string(), nullptr, false);
        if (found.empty()) return c;
        path = found.front();
    }
    const auto meta = peek_checkpoint_metadata(path);
    if (const auto it = meta.find("cross_device_ops"); it != meta.end())
        c.strategy.resume_cross_device_ops = it->second;
    return c;
}

std::optional<CheckpointData> find_checkpoint(const Config& cfg, const Model& model, const std::string& ckpt_dir,
                                              std::FILE* out, std::string& used) {
    const uint64_t hash = model_config_hash(cfg);
    const std::string summary = model_config_summary(cfg);
    std::vector<std::string> candidates;
    const bool explicit_path = cfg.checkpoint.resume != "auto" && cfg.checkpoint.resume != "never";
    if (cfg.checkpoint.resume == "auto") {
        std::vector<std::string> ignored;
        candidates = list_checkpoints(ckpt_dir, &ignored);
        for (const std::string& path : ignored)
            std::fprintf(stderr,
                         "warning: ignoring %s: not a regular file, so not one the trainer wrote (name it in "
                         "checkpoint.resume to resume from it)\n",
                         path.c_str());
    } else if (explicit_path) candidates = {cfg.checkpoint.resume};
    for (const auto& path : candidates) {
        try {
            CheckpointData d = read_checkpoint(path, model, hash, summary);
            std::fprintf(out, "  resuming from %s (step %lld)\n", path.c_str(), static_cast<long long>(d.step));
            used = path;
            return d;
        } catch (const ForeignCheckpointError&) {
            throw;
        } catch (const CheckpointError& e) {
            if (explicit_path) throw;
            std::fprintf(stderr, "warning: skipping unusable checkpoint: %s\n", e.what());
        }
    }
    return std::nullopt;
}

void check_checkpoint_fits(const CheckpointData& ckpt, const std::string& path, const Config& cfg, size_t train_samples,
                           uint64_t train_data, int64_t batches_per_epoch, int64_t total_steps) {
    if (ckpt.seed != cfg.run.seed)
        throw ForeignCheckpointError(path + ": written with run.seed " + std::to_string(ckpt.seed) +
                                     ", this run uses " + std::to_string(cfg.run.seed));
    // The loader position counts global batches of the data the checkpoint saw: another batch
    // size or another training set cannot continue it.
    if (ckpt.global_batch != 0 && ckpt.global_batch != cfg.train.global_batch_size)
        throw CheckpointError(path + ": written with train.global_batch_size " + std::to_string(ckpt.global_batch) +
                              ", this run uses " + std::to_string(cfg.train.global_batch_size) +
                              ": resume with the same batch size, or set checkpoint.resume: never to start afresh");
    if (ckpt.train_samples != 0 && ckpt.train_samples != int64_t(train_samples))
        throw CheckpointError(path + ": written for a training set of " + std::to_string(ckpt.train_samples) +
                              " samples, this one has " + std::to_string(train_samples) +
                              ": the data changed; set checkpoint.resume: never to start afresh");
    // the same size, other contents (a regenerated file, a corrected label, another normalisation):
    // the loader can go on, but on other data than the checkpoint's run saw
    if (ckpt.train_data != 0 && ckpt.train_data != train_data)
        std::fprintf(stderr,
                     "warning: %s was trained on other training data than this run's (the same %zu samples, "
                     "other contents: fingerprint %s, now %s): training continues from it on this data; set "
                     "checkpoint.resume: never to start afresh\n",
                     path.c_str(), train_samples, hex64(ckpt.train_data).c_str(), hex64(train_data).c_str());
    if (ckpt.step > total_steps)
        throw CheckpointError(path + ": written at step " + std::to_string(ckpt.step) + ", beyond this run's " +
                              std::to_string(total_steps) +
                              " steps (train.epochs, train.steps): it is not a step of "
                              "this run; train longer, or set checkpoint.resume: never to start afresh");
    if (ckpt.loader.batch >= batches_per_epoch)
        throw CheckpointError(path + ": its loader position (batch " + std::to_string(ckpt.loader.batch) +
                              ") is outside an epoch of " + std::to_string(batches_per_epoch) +
                              " batches: the data or data.drop_last changed since it was written");
}

std::vector<std::string> resume_notes(const CheckpointData& ckpt, const MirroredStrategy& st, const Config& cfg) {
    std::vector<std::string> notes;
    const std::string tail = ": training continues correctly, but not bit-identically to an uninterrupted run";
    if (ckpt.replicas != st.all_replicas())
        notes.push_back("the checkpoint was written by " + std::to_string(ckpt.replicas) +
                        " replica(s), this run has " + std::to_string(st.all_replicas()) + tail);
    if (const std::string gemm = gemm_library(st, cfg); !ckpt.blas_kernel.empty() && ckpt.blas_kernel != gemm)
        notes.push_back("the checkpoint was written with GEMMs by " + ckpt.blas_kernel + ", this run uses " + gemm +
                        tail + blas_kernel_hint(ckpt.blas_kernel, gemm));
    if (const std::string writer = written_by(ckpt); !writer.empty() && writer != mirrored_version())
        notes.push_back(
            "the checkpoint was written by mirrored " + writer + ", this is " + mirrored_version() +
            ": training continues; if the two compute differently, not bit-identically to an uninterrupted run");
    if (st.all_replicas() > 1 && !ckpt.cross_device_ops.empty() && ckpt.cross_device_ops != st.cross_device_ops_name())
        notes.push_back("the checkpoint was written with cross-device ops " + ckpt.cross_device_ops +
                        ", this run uses " + st.cross_device_ops_name() + tail);
    return notes;
}

std::string set_aside_later_checkpoints(const std::string& out_dir, const std::string& ckpt_dir, int64_t step) {
    std::vector<std::string> later;
    for (const std::string& path : list_checkpoints(ckpt_dir))
        if (checkpoint_step(path) > step) later.push_back(path);
    const std::string aside = move_aside(out_dir, later);
    if (aside.empty()) return "";
    // the metrics and summary of those steps go with them (this run keeps its lines up to `step`)
    std::error_code ec;
    for (const char* f : {"metrics.jsonl", "metrics.csv", "summary.json"})
        if (fs::exists(fs::path(out_dir) / f, ec)) fs::copy_file(fs::path(out_dir) / f, fs::path(aside) / f, ec);
    return std::to_string(later.size()) + " checkpoint(s) of later steps than " + std::to_string(step) + " moved to " +
           aside + " with the metrics up to them (unusable, or of another timeline)";
}

RecoveredMetrics recover_metrics(const std::string& out_dir, int64_t up_to_step, bool write) {
    RecoveredMetrics r;
    const fs::path metrics_path = fs::path(out_dir) / "metrics.jsonl";
    std::string kept, csv = metrics_csv_header();
    if (std::ifstream in(metrics_path); in) {
        std::string line;
        while (std::getline(in, line)) {
            try {
                const json j = json::parse(line);
                const int64_t step = j.at("step").get<int64_t>();
                const std::string type = j.at("type").get<std::string>();
                // since the last resume: what came before it was counted by that resume (the
                // kept history - replica failures - would count it again)
                r.last_logged_step = type == "resume" ? step : std::max(r.last_logged_step, step);
                if (type == "alert" && j.value("kind", "") == "replica_failure") {
                    r.failures.push_back(j);
                } else if (type == "continued" && !r.failures.empty()) {
                    r.failures.back()["after_fault_s"] = j.value("after_fault_s", 0.0);
                } else if (step > up_to_step) {
                    continue;
                }
                kept += line + "\n";
                csv += metrics_csv_row(j);
                if (type == "train") {
                    const json acc = j.value("accuracy", json(nullptr));  // null for a loss without one
                    r.train = {j.at("loss").get<double>(), acc.is_null() ? 0.0 : acc.get<double>(), 1.0};
                } else if (type == "eval") {
                    const double n = j.at("samples").get<double>();
                    const json acc = j.value("test_accuracy", json(nullptr));
                    r.eval = {j.at("test_loss").get<double>() * n, acc.is_null() ? 0.0 : acc.get<double>() * n, n};
                    r.eval_step = step;
                }
            } catch (const json::exception&) {
                // a line cut short by the crash, or not ours
            }
        }
    }
    if (write) {  // metrics.csv: the same records (the run appends to both)
        write_file_atomic(metrics_path.string(), kept);
        write_file_atomic((fs::path(out_dir) / "metrics.csv").string(), csv);
    }
    return r;
}

}  // namespace mirrored
