#include "mirrored/run_dir.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>

#include "base/error.h"
#include "base/io.h"
#include "base/output.h"
#include "data/tokenizer.h"

namespace mirrored {

namespace fs = std::filesystem;

RunDirLock::~RunDirLock() {
    if (fd_ >= 0) ::close(fd_);  // releases the flock
}

RunDirLock::Result RunDirLock::acquire(const std::string& dir, std::string& holder) {
    const std::string path = (fs::path(dir) / ".lock").string();
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0) {
        if (errno == EROFS || errno == EACCES || errno == EPERM) return Result::read_only;
        throw ConfigError(path + ": cannot create the run folder's lock file: " + std::strerror(errno));
    }
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
        char buf[64] = {};
        const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
        ::close(fd);
        std::string pid = n > 0 ? std::string(buf, size_t(n)) : std::string();
        while (!pid.empty() && (pid.back() == '\n' || pid.back() == ' ')) pid.pop_back();
        holder = pid.empty() ? "another process" : "pid " + pid;
        return Result::busy;
    }
    const std::string me = std::to_string(::getpid()) + "\n";
    if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, me.data(), me.size(), 0) != ssize_t(me.size())) {
        // the lock holds; the pid is only for messages
    }
    fd_ = fd;
    return Result::locked;
}

std::string move_aside(const std::string& dir, const std::vector<std::string>& files) {
    std::vector<fs::path> present;
    std::error_code ec;
    for (const auto& f : files)
        if (fs::exists(f, ec)) present.emplace_back(f);
    if (present.empty()) return "";
    char stamp[32];
    const std::time_t t = std::time(nullptr);
    std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", std::localtime(&t));
    fs::path aside;
    for (int n = 1;; ++n) {
        aside = fs::path(dir) / (std::string("previous-") + stamp + (n > 1 ? "-" + std::to_string(n) : ""));
        if (fs::create_directory(aside, ec)) break;  // false: it exists already, take the next name
        if (ec) throw ConfigError(aside.string() + ": cannot create: " + ec.message());
        if (n > 1000) throw ConfigError(dir + ": too many previous-* folders");
    }
    for (const auto& p : present) {
        fs::rename(p, aside / p.filename(), ec);
        if (ec) throw ConfigError(p.string() + ": cannot move it aside to " + aside.string() + ": " + ec.message());
    }
    return aside.string();
}

void keep_tokenizer(const std::string& data_root, const std::string& dir) {
    const std::vector<std::string> files = tokenizer_files(data_root);
    if (files.empty()) return;
    const fs::path kept = fs::path(dir) / "tokenizer";
    std::error_code ec;
    fs::create_directories(kept, ec);
    if (ec) throw CheckpointError(kept.string() + ": cannot create: " + ec.message());
    for (const std::string& f : files)
        write_file_atomic((kept / fs::path(f).filename()).string(), read_regular_file(f, uint64_t(1) << 30));
}

}  // namespace mirrored
