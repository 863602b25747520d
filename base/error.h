// Errors that end a run, each with the documented exit code the CLI returns for it.
#pragma once

#include <stdexcept>
#include <string>
#include <utility>

namespace mirrored {

enum ExitCode {
    kExitOk = 0,
    kExitFailure = 1,       // a bug: an internal invariant broke
    kExitUsage = 2,         // bad command line or configuration
    kExitData = 3,          // missing, truncated or corrupt data files
    kExitCheckpoint = 4,    // unusable or foreign checkpoint
    kExitDevice = 5,        // CUDA / NCCL / out of memory / replica divergence / threads refused
    kExitDiverged = 6,      // training diverged: non-finite loss or parameters
    kExitInterrupted = 130  // SIGINT/SIGTERM, after a checkpoint was written
};

class Error : public std::runtime_error {
public:
    Error(ExitCode code, const std::string& what) : std::runtime_error(what), code_(code) {}
    ExitCode code() const { return code_; }

private:
    ExitCode code_;
};

struct ConfigError : Error {
    explicit ConfigError(const std::string& w) : Error(kExitUsage, w) {}
    // About one configuration key, found after the file was read: what() is "<key>: <detail>",
    // and the session prefixes the key's "<file>:<line>:" (or "--set ...") from the config.
    ConfigError(const std::string& key, const std::string& detail)
        : Error(kExitUsage, key + ": " + detail), key_(key), detail_(detail) {}
    const std::string& key() const { return key_; }
    const std::string& detail() const { return detail_; }

private:
    std::string key_, detail_;
};
struct DataError : Error {
    explicit DataError(const std::string& w) : Error(kExitData, w) {}
};
struct CheckpointError : Error {
    explicit CheckpointError(const std::string& w) : Error(kExitCheckpoint, w) {}
};
struct DeviceError : Error {
    explicit DeviceError(const std::string& w) : Error(kExitDevice, w) {}
    // A fault of one device ("cuda:1", "sim:1", "cpu:2"): a sticky error such as an illegal
    // address, an ECC error or a lost GPU, not a refused call. strategy.on_replica_failure:
    // continue sets that device aside; an error without one stops the run.
    DeviceError(const std::string& w, std::string device) : Error(kExitDevice, w), device_(std::move(device)) {}
    const std::string& device() const { return device_; }

private:
    std::string device_;
};

}  // namespace mirrored
