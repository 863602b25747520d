// The run folder (run.output_dir): one writer at a time, and earlier results never lost.
#pragma once

#include <string>
#include <vector>

namespace mirrored {

// An exclusive lock on a run folder: flock() on <dir>/.lock, which the kernel releases when the
// process ends however it ends, so a crashed run never leaves a stale lock. The file holds the
// holder's pid, for the message a second trainer gets.
class RunDirLock {
public:
    enum class Result { locked, busy, read_only };
    RunDirLock() = default;
    ~RunDirLock();
    RunDirLock(const RunDirLock&) = delete;
    RunDirLock& operator=(const RunDirLock&) = delete;
    // busy: `holder` says who holds it ("pid 1234"); read_only: the folder cannot be written.
    Result acquire(const std::string& dir, std::string& holder);

private:
    int fd_ = -1;
};

// Moves `files` (those that exist) into a new folder <dir>/previous-<YYYYmmdd-HHMMSS>[-N] that
// did not exist before, so two fresh starts within one second never share one. Returns its path
// ("" when there was nothing to move).
std::string move_aside(const std::string& dir, const std::vector<std::string>& files);

// The tokenizer of a language model's token files (the files `mirrored tokenize` put beside them in
// data_root) copied into <dir>/tokenizer, so `generate` prints text for the run's checkpoints
// wherever the data goes. Nothing where data_root holds no tokenizer.
void keep_tokenizer(const std::string& data_root, const std::string& dir);

}  // namespace mirrored
