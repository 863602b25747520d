#include "base/output.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "base/error.h"

namespace mirrored {

namespace fs = std::filesystem;

namespace {

// Errors name the file being written, not its temporary: that is the file the user asked for.
constexpr const char* kNothingReplaced = " (any earlier file of that name is untouched; the partial write was removed)";

void fsync_dir(const fs::path& dir) {
    const int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY);
    if (fd >= 0) {
        ::fsync(fd);
        ::close(fd);
    }
}

std::string error_text(int err) { return std::strerror(err); }

// The kind of thing at `path`, following links when `follow`; ENOENT as `missing`.
enum class Kind { missing, regular, directory, symlink, stream, other };
Kind kind_of(const std::string& path, bool follow) {
    struct stat st {};
    if ((follow ? ::stat(path.c_str(), &st) : ::lstat(path.c_str(), &st)) != 0) return Kind::missing;
    if (S_ISREG(st.st_mode)) return Kind::regular;
    if (S_ISDIR(st.st_mode)) return Kind::directory;
    if (S_ISLNK(st.st_mode)) return Kind::symlink;
    if (S_ISCHR(st.st_mode) || S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode)) return Kind::stream;
    return Kind::other;  // a block device
}

// What a user would lose if `path` (an existing regular file) were replaced, or "" for nothing the
// project knows of: a checkpoint, or a file of a run folder (where a run keeps its .lock).
std::string protected_as(const fs::path& path) {
    const std::string name = path.filename().string();
    const fs::path folder = path.parent_path().empty() ? fs::path(".") : path.parent_path();
    std::error_code ec;
    const bool checkpoint_name = name.rfind("step-", 0) == 0 && path.extension() == ".safetensors";
    if (checkpoint_name && folder.filename() == "checkpoints") return "a checkpoint";
    if (std::ifstream in{path,
                         std::ios::binary}) {  // a checkpoint by its header (in its first 64 KiB), whatever its name
        std::string head(size_t(1) << 16, '\0');
        in.read(head.data(), std::streamsize(head.size()));
        if (std::string_view(head.data(), size_t(in.gcount())).find("mirrored-checkpoint") != std::string_view::npos)
            return "a checkpoint";
    }
    if (fs::exists(folder / ".lock", ec) || fs::exists(folder / "metrics.jsonl", ec) ||
        fs::exists(folder / "summary.json", ec))
        return "a file of the run folder " + folder.string();
    return "";
}

// The path to write once links are followed: the link's target, not the link (a link is never
// replaced by a file).
std::string resolved(const std::string& path) {
    std::error_code ec;
    const fs::path p = fs::weakly_canonical(path, ec);
    return ec ? path : p.string();
}

// Whether `path` lies under the folder `folder` (both resolved; false when folder is no folder).
bool inside_folder(const std::string& path, const std::string& folder) {
    std::error_code ec;
    if (!fs::is_directory(folder, ec)) return false;
    const fs::path f = fs::weakly_canonical(folder, ec);
    if (ec) return false;
    const fs::path p = fs::weakly_canonical(path, ec);
    if (ec) return false;
    const auto [end, at] = std::mismatch(f.begin(), f.end(), p.begin(), p.end());
    return end == f.end() && at != p.end();
}

}  // namespace

void write_all(int fd, const std::string& path, const std::string& tmp, const char* p, size_t n) {
    while (n > 0) {
        const ssize_t w = ::write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            const std::string err = error_text(errno);
            ::close(fd);
            if (!tmp.empty()) ::unlink(tmp.c_str());
            throw CheckpointError(path + ": write failed: " + err + (tmp.empty() ? "" : kNothingReplaced));
        }
        p += w;
        n -= size_t(w);
    }
}

void write_file_atomic(const std::string& path, const std::function<void(int fd, const std::string& tmp)>& fill) {
    const fs::path p(path);
    const fs::path folder = p.parent_path();
    // mkostemps: O_CREAT | O_EXCL, so neither an existing file nor a planted link is ever opened;
    // ".NAME.XXXXXX.tmp", which a reader of the folder knows as a write that may not have finished.
    // Its lock is held while it is written: remove_stale_temporaries tells a live write from a
    // killed one by it (the kernel lets the lock go with the process; O_CLOEXEC keeps it from the
    // programs this one starts). One removed by another process between the create and the lock
    // (it has no link then) is made again.
    const std::string pattern =
        ((folder.empty() ? fs::path(".") : folder) / ("." + p.filename().string() + ".XXXXXX.tmp")).string();
    std::string tmp;
    int fd = -1;
    for (int attempt = 0; attempt < 8 && fd < 0; ++attempt) {
        tmp = pattern;
        fd = ::mkostemps(tmp.data(), 4, O_CLOEXEC);
        if (fd < 0) throw CheckpointError(path + ": cannot create a temporary beside it: " + error_text(errno));
        struct stat st {};
        if (::flock(fd, LOCK_EX) == 0 && ::fstat(fd, &st) == 0 && st.st_nlink > 0) break;
        ::close(fd);
        fd = -1;
    }
    if (fd < 0)
        throw CheckpointError(path +
                              ": its temporaries were removed as they were made; is another process "
                              "cleaning this folder?");
    const mode_t mask = ::umask(0);  // the mode a plain create would give: 0666 less the umask
    ::umask(mask);
    ::fchmod(fd, 0666 & ~mask);
    try {
        fill(fd, tmp);
    } catch (...) {  // nothing replaced, and no partial temporary left behind
        ::unlink(tmp.c_str());
        throw;
    }
    const int synced = ::fsync(fd) == 0 ? 0 : errno;
    const int closed = ::close(fd) == 0 ? 0 : errno;
    if (synced || closed) {
        ::unlink(tmp.c_str());
        throw CheckpointError(path + ": write failed: " + error_text(synced ? synced : closed) + kNothingReplaced);
    }
    if (std::rename(tmp.c_str(), path.c_str()) != 0) {
        const std::string err = error_text(errno);
        ::unlink(tmp.c_str());
        throw CheckpointError(path + ": rename failed: " + err + kNothingReplaced);
    }
    fsync_dir(folder);
}

void remove_stale_temporaries(const std::string& path) {
    const fs::path p(path);
    const fs::path folder = p.parent_path().empty() ? fs::path(".") : p.parent_path();
    const std::string prefix = "." + p.filename().string() + ".";
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(folder, ec)) {
        const std::string name = e.path().filename().string();
        if (name.size() != prefix.size() + 6 + 4 || name.rfind(prefix, 0) != 0 ||
            name.compare(name.size() - 4, 4, ".tmp") != 0 || e.symlink_status(ec).type() != fs::file_type::regular)
            continue;
        const int fd = ::open(e.path().c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
        if (fd < 0) continue;
        if (::flock(fd, LOCK_EX | LOCK_NB) == 0) ::unlink(e.path().c_str());  // its writer is gone
        ::close(fd);
    }
}

void write_file_atomic(const std::string& path, std::string_view contents) {
    write_file_atomic(
        path, [&](int fd, const std::string& tmp) { write_all(fd, path, tmp, contents.data(), contents.size()); });
}

bool same_file(const std::string& a, const std::string& b) {
    std::error_code ec;
    if (fs::exists(a, ec) && fs::exists(b, ec)) return fs::equivalent(a, b, ec);
    const fs::path ca = fs::weakly_canonical(a, ec), cb = fs::weakly_canonical(b, ec);
    return !ec && ca == cb;
}

void check_output(const OutputTarget& t) {
    const std::string named = t.option + " " + t.path;
    if (t.path.empty()) throw ConfigError(t.option + ": expected a file name");
    if (t.path == "-") return;  // standard output
    for (const auto& [what, input] : t.inputs) {
        if (input.empty()) continue;
        if (same_file(t.path, input))
            throw ConfigError(named + ": is " + what + ", which this command reads; choose another file");
        if (inside_folder(t.path, input))  // an image folder: every file under it is read
            throw ConfigError(named + ": is inside " + input + ", " + what +
                              ", which this command reads; choose a file elsewhere");
    }
    const std::string target = resolved(t.path);
    switch (kind_of(t.path, /*follow=*/true)) {
        case Kind::stream:
            return;  // written directly: /dev/null, a terminal, a pipe, a named pipe
        case Kind::directory:
            throw ConfigError(named + ": is a directory; name a file");
        case Kind::other:
            throw ConfigError(named + ": is a block device or another special file, not a file to write");
        case Kind::missing: {
            std::error_code ec;
            if (kind_of(t.path, /*follow=*/false) == Kind::symlink && kind_of(target, false) == Kind::missing &&
                !fs::is_directory(fs::path(target).parent_path().empty() ? "." : fs::path(target).parent_path(), ec))
                throw ConfigError(named + ": a link to " + target + ", whose folder does not exist");
            const fs::path folder = fs::path(target).parent_path();
            if (!folder.empty() && !fs::is_directory(folder, ec))
                throw ConfigError(named + ": the folder " + folder.string() + " does not exist");
            return;
        }
        case Kind::regular: {
            const std::string lost = protected_as(target);
            if (!lost.empty() && !t.force)
                throw ConfigError(named + ": is " + lost +
                                  ", which this command did not write; choose another file, or "
                                  "add --force to replace it");
            return;
        }
        case Kind::symlink:
            break;  // not after following
    }
}

void write_output(const OutputTarget& t, std::string_view contents) {
    check_output(t);
    if (t.path == "-") {
        write_all(STDOUT_FILENO, "standard output", "", contents.data(), contents.size());
        return;
    }
    if (kind_of(t.path, /*follow=*/true) != Kind::stream) {
        write_file_atomic(resolved(t.path), contents);
        return;
    }
    // A stream: opened without blocking (a FIFO nobody reads would wait forever), written as is.
    const int fd = ::open(t.path.c_str(), O_WRONLY | O_NOCTTY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        throw CheckpointError(t.option + " " + t.path + ": cannot open for writing: " +
                              (errno == ENXIO ? std::string("no process reads this named pipe") : error_text(errno)));
    const int flags = ::fcntl(fd, F_GETFL);
    if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
    write_all(fd, t.path, "", contents.data(), contents.size());
    if (::close(fd) != 0) throw CheckpointError(t.path + ": write failed: " + error_text(errno));
}

}  // namespace mirrored
