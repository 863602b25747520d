// Writing files without destroying what the writer did not create.
//
// Files the program owns (checkpoints, summary.json, config.yaml, metrics.jsonl, the machine
// cache) are replaced atomically: the contents go to a new temporary in the same folder, created
// with O_CREAT | O_EXCL | O_NOFOLLOW (never an existing file, never through a planted link),
// synced, then renamed over the path. A failure leaves the old file as it was.
//
// A file the user names (--out, --json, --dump-*) is an OutputTarget: a new path or a regular
// file is written atomically as above; a character device, FIFO or socket (/dev/null, /dev/stdout
// on a terminal or a pipe, a named pipe) is written directly, never replaced; anything else
// (a directory, a block device) is refused. So is, unless the user says --force, a file the
// command reads (its config, its checkpoint), a checkpoint, or a file of a run folder - what the
// user would lose is named in the message.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace mirrored {

// `path` replaced by what `fill` writes to the descriptor of its temporary (`tmp` names the
// temporary, for messages); CheckpointError (exit 4) naming `path` when anything fails. Where
// `fill` throws, the temporary is removed and `path` left as it was.
void write_file_atomic(const std::string& path, const std::function<void(int fd, const std::string& tmp)>& fill);
void write_file_atomic(const std::string& path, std::string_view contents);
// Removes the temporaries of writes of `path` whose process is gone (killed mid-write): each is
// locked while it is written, so a live write's is left alone.
void remove_stale_temporaries(const std::string& path);
// Writes all of [p, p + n) to fd; on an error closes fd, removes tmp, and throws CheckpointError
// naming path.
void write_all(int fd, const std::string& path, const std::string& tmp, const char* p, size_t n);

struct OutputTarget {
    std::string option;  // "--out": what the user wrote, for messages
    std::string path;
    bool force = false;  // --force: a protected existing file may be replaced
    // The files the command reads: (what, path), never written to.
    std::vector<std::pair<std::string, std::string>> inputs;
};
// Refuses (ConfigError, exit 2) what write_output would refuse: run before any work, so that a
// long command does not fail at its end.
void check_output(const OutputTarget& t);
void write_output(const OutputTarget& t, std::string_view contents);

// Whether two paths name one file (the same inode, or the same path once resolved).
bool same_file(const std::string& a, const std::string& b);

}  // namespace mirrored
