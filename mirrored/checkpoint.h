// Checkpoints: safetensors files (so Python's safetensors package opens them) holding the
// parameters under their PyTorch names, the optimizer state as "optimizer.<state>.<name>", and
// the training state as string metadata. Format: docs/CHECKPOINTS.md.
//
// Writes are atomic: a temporary file in the same folder, fsync, rename, fsync of the folder.
// A CRC-32 over the tensor bytes and the metadata detects corruption and truncation.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "base/io.h"
#include "data/loader.h"
#include "base/error.h"
#include "mirrored/model.h"

namespace mirrored {

struct CheckpointData {
    int64_t step = 0;                                  // optimizer steps completed
    LoaderPosition loader;                             // the next batch the loader delivers
    uint64_t seed = 0;                                 // the run seed: with step and epoch it fixes every random draw
    std::vector<std::array<double, 3>> train_metrics;  // per replica: loss sum, correct, count since last log
    std::vector<float> params;                         // flat, the model's layout
    std::vector<std::pair<std::string, std::vector<float>>> optimizer;  // flat, same layout
    uint64_t model_hash = 0;
    std::string model_summary;
    std::string config_yaml;
    int replicas = 0;
    std::string devices;
    std::string blas_kernel;       // the GEMMs: another kernel sums in another order (empty: unknown)
    std::string gemm_choices;      // the kernel each product's shape ran, where measured (Backend::gemm_choices)
    std::string cross_device_ops;  // another op may sum in another order (empty: unknown)
    int64_t global_batch = 0;      // what the loader position counts in (0: not recorded)
    std::array<float, 2> loss_scale{1.0f, 0.0f};  // fp16: scale and good steps in a row
    int64_t train_samples = 0;                    // the training set's size then (0: not recorded)
    uint64_t train_data = 0;                      // fingerprint() of the training set then (0: not recorded)
    std::string software;     // mirrored/software.h's JSON object of the writer (empty: not recorded)
    double device_hours = 0;  // the run's device hours up to this checkpoint, every process's (0: not recorded)
};

// Writes path atomically. Tensors are cut out of the flat buffers with the model's layout.
void write_checkpoint(const std::string& path, const Model& model, const CheckpointData& data);
std::string checkpoint_bytes(const Model& model, const CheckpointData& data);  // the same file's bytes
// Reads and fully validates (size, header, checksum). With a model, also checks the hash and
// scatters tensors into flat buffers; a foreign model is a CheckpointError saying why.
CheckpointData read_checkpoint(const std::string& path, const Model& model, uint64_t expected_hash,
                               const std::string& expected_summary);
CheckpointData read_checkpoint(InputFile&& in, const Model& model, uint64_t expected_hash,
                               const std::string& expected_summary);

// A checkpoint written for another model or optimizer: never skipped over, always reported.
struct ForeignCheckpointError : CheckpointError {
    explicit ForeignCheckpointError(const std::string& w) : CheckpointError(w) {}
};

// Any safetensors file of F32 tensors (and I64 ones, such as batchnorm's num_batches_tracked):
// name -> (shape, values), plus metadata.
struct SafetensorsFile {
    std::map<std::string, std::pair<std::vector<int>, std::vector<float>>> tensors;
    std::map<std::string, std::pair<std::vector<int>, std::vector<int64_t>>> int_tensors;
    std::map<std::string, std::string> metadata;
};
// With verify_checksum, a mirrored checkpoint's CRC is checked too.
SafetensorsFile read_safetensors(const std::string& path, bool verify_checksum);
SafetensorsFile read_safetensors(InputFile&& in, bool verify_checksum);  // from memory too (fuzzing)
// with_checksum: adds the mirrored checksum over the tensors and metadata (as checkpoints carry).
// The test hook MIRRORED_TEST_KILL_DURING_CHECKPOINT: the step whose checkpoint write kills the
// process half-way (-1: none). Read once; the trainer reads it before training, so that a bad
// value is an error then (exit 2), not at the first checkpoint.
int64_t checkpoint_kill_hook();
void write_safetensors(const std::string& path, const SafetensorsFile& file, bool with_checksum = false);
// The same file's bytes, for a writer that decides where they go (export's --out).
std::string safetensors_bytes(const SafetensorsFile& file, bool with_checksum = false);

// Checkpoint files of a run folder, newest (highest step) first; removes stale temporaries. Only
// regular files named as checkpoint_path names them: a directory, a symbolic link or a device
// of that name is nothing the trainer wrote, and is neither read nor removed (`ignored` gets them).
// Only the run folder's lock holder removes temporaries (another trainer's write may be in flight).
std::vector<std::string> list_checkpoints(const std::string& dir, std::vector<std::string>* ignored = nullptr,
                                          bool remove_stale = true);
// A checkpoint's metadata from its header alone (no tensor read, no checksum): a hint, read before
// a model exists; empty when the file is not a readable safetensors file.
std::map<std::string, std::string> peek_checkpoint_metadata(const std::string& path);
std::map<std::string, std::string> peek_checkpoint_metadata(InputFile&& in);  // from memory too (fuzzing)
// The same, read strictly: CheckpointError (exit 4) naming the path and why when it is not a
// readable checkpoint (missing, a folder or another special file, empty, cut short, corrupt).
std::map<std::string, std::string> read_checkpoint_metadata(const std::string& path);
std::string checkpoint_path(const std::string& dir, int64_t step);
// The step in a checkpoint's file name ("step-0000000468.safetensors" -> 468), -1 if none.
int64_t checkpoint_step(const std::string& path);
// Removes all but the `keep` newest checkpoints up to step `upto` (the one just written); any
// of a later step is left alone.
void prune_checkpoints(const std::string& dir, int keep, int64_t upto);

}  // namespace mirrored
