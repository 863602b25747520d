// Running the mirrored CLI from tests: as a child process, with its exit status, its stderr, and
// standard output discarded, closed, a broken pipe or a file; a child that hangs is killed.
#pragma once

#include <doctest/doctest.h>
#include <grp.h>
#include <pwd.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace mirrored::test {

namespace fs = std::filesystem;

inline std::string cli() { return (fs::read_symlink("/proc/self/exe").parent_path() / "mirrored").string(); }

// Where a child's standard output goes.
enum class Stdout {
    discard,      // /dev/null
    closed,       // descriptor 1 closed (`>&-`)
    broken_pipe,  // a pipe whose reader has gone (`| head -1` after head exited)
    file,         // out_path
};

// Starts a program (a path, or a name looked up in PATH) with stdout as asked and stderr
// captured in err_path; in_child (system calls only: limits, user) runs in the child before exec.
inline pid_t spawn_program(const std::string& bin, const std::vector<std::string>& args,
                           const std::vector<std::pair<std::string, std::string>>& env, const std::string& err_path,
                           Stdout out = Stdout::discard, const std::string& out_path = "",
                           void (*in_child)(const void*) = nullptr, const void* in_child_arg = nullptr) {
    std::fflush(nullptr);  // else the child inherits unwritten output and writes it again
    const pid_t pid = ::fork();
    if (pid == 0) {
        if (in_child) in_child(in_child_arg);
        for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
        std::vector<char*> argv;
        argv.push_back(const_cast<char*>(bin.c_str()));
        for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
        argv.push_back(nullptr);
        if (!std::freopen(err_path.c_str(), "w", stderr)) ::_exit(99);
        if (out == Stdout::closed) {
            ::close(1);
        } else if (out == Stdout::broken_pipe) {
            int fds[2];
            if (::pipe(fds) != 0) ::_exit(99);
            ::close(fds[0]);  // nobody will ever read
            ::dup2(fds[1], 1);
            ::close(fds[1]);
        } else if (!std::freopen(out == Stdout::file ? out_path.c_str() : "/dev/null", "w", stdout)) {
            ::_exit(99);
        }
        ::execvp(bin.c_str(), argv.data());
        ::_exit(98);
    }
    return pid;
}

// A process limited to `nproc` processes and threads of its user, run as the unprivileged user
// 'nobody' (root ignores the limit): how `ulimit -u` or a container's pids limit refuses threads.
struct ThreadLimit {
    uid_t uid;
    gid_t gid;
    rlim_t nproc;
};

// Empty where this test process cannot impose one (not root, or no user 'nobody').
inline std::optional<ThreadLimit> thread_limit_as_nobody(rlim_t nproc) {
    const passwd* nobody = ::getpwnam("nobody");
    if (::geteuid() != 0 || !nobody) return std::nullopt;
    return ThreadLimit{nobody->pw_uid, nobody->pw_gid, nproc};
}

// In a forked child: become 'nobody' under the limit (spawn_program's in_child).
inline void apply_thread_limit(const void* arg) {
    const auto* l = static_cast<const ThreadLimit*>(arg);
    const rlimit r{l->nproc, l->nproc};
    if (::setrlimit(RLIMIT_NPROC, &r) != 0 || ::setgroups(0, nullptr) != 0 || ::setgid(l->gid) != 0 ||
        ::setuid(l->uid) != 0)
        ::_exit(97);
}

// The CLI (build/mirrored beside the test binary).
inline pid_t spawn_cli(const std::vector<std::string>& args,
                       const std::vector<std::pair<std::string, std::string>>& env, const std::string& err_path,
                       Stdout out = Stdout::discard, const std::string& out_path = "") {
    return spawn_program(cli(), args, env, err_path, out, out_path);
}

inline int wait_status(pid_t pid) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// Waits until the child runs mirrored (a forked child catches signals with the test's handlers
// until it execs) and catches `sig` (SigCgt in /proc: the program installs its handlers before main),
// at most deadline_s: a signal sent then meets mirrored's handler, however busy the machine.
inline bool wait_until_catches(pid_t pid, int sig, double deadline_s = 120) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(deadline_s);
    std::error_code ec;
    const fs::path exe = fs::canonical(cli());
    const std::string proc = "/proc/" + std::to_string(pid);
    while (std::chrono::steady_clock::now() < end) {
        const bool runs_mirrored = fs::read_symlink(proc + "/exe", ec) == exe;
        std::ifstream in(proc + "/status");
        std::string line;
        while (std::getline(in, line)) {
            if (line.rfind("State:", 0) == 0 && line.find('Z') != std::string::npos) return false;  // it ended
            if (runs_mirrored && line.rfind("SigCgt:", 0) == 0 &&
                ((std::stoull(line.substr(7), nullptr, 16) >> (sig - 1)) & 1))
                return true;
        }
        std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    return false;
}

// Waits for pid at most deadline_s; a process still running then is killed (a hang fails the
// test instead of stalling the suite) and reported as 128 + SIGKILL.
inline int wait_status_within(pid_t pid, double deadline_s) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(deadline_s);
    for (;;) {
        int status = 0;
        if (::waitpid(pid, &status, WNOHANG) == pid)
            return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        if (std::chrono::steady_clock::now() > end) {
            ::kill(pid, SIGKILL);
            ::waitpid(pid, &status, 0);
            FAIL_CHECK("the command did not finish within " << deadline_s << " s");
            return 128 + SIGKILL;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
}

// Runs the CLI; returns its exit status (128 + signal when killed).
inline int run_cli(const std::vector<std::string>& args,
                   const std::vector<std::pair<std::string, std::string>>& env = {}, double kill_after_s = -1,
                   std::string* stderr_text = nullptr, Stdout out = Stdout::discard, const std::string& out_path = "") {
    const std::string err_path =
        (fs::temp_directory_path() / ("mirrored_cli_err_" + std::to_string(::getpid()))).string();
    const pid_t pid = spawn_cli(args, env, err_path, out, out_path);
    if (kill_after_s >= 0) {
        std::this_thread::sleep_for(std::chrono::duration<double>(kill_after_s));
        ::kill(pid, SIGKILL);
    }
    const int rc = wait_status_within(pid, 300);
    if (stderr_text) {
        std::ifstream in(err_path);
        *stderr_text = std::string(std::istreambuf_iterator<char>(in), {});
    }
    fs::remove(err_path);
    return rc;
}

// Runs a program to its end (at most 10 minutes); its exit status, its standard error into *err.
inline int run_program(const std::string& bin, const std::vector<std::string>& args, std::string* err = nullptr) {
    const std::string err_path =
        (fs::temp_directory_path() / ("mirrored_test_program_" + std::to_string(::getpid()) + ".err")).string();
    const int rc = wait_status_within(spawn_program(bin, args, {}, err_path), 600);
    if (err) {
        std::ifstream in(err_path);
        *err = std::string(std::istreambuf_iterator<char>(in), {});
    }
    fs::remove(err_path);
    return rc;
}

inline const char* const kPython = "/usr/bin/python3";  // the distribution's, with its packages

void mark_skipped(const std::string& reason);  // tests/helpers.h

// Whether the distribution's python3 imports `modules` ("torch, numpy"); else the test says
// skipped, naming what is missing and its package.
inline bool python_has(const std::string& modules, const std::string& what, const std::string& package) {
    if (run_program(kPython, {"-c", "import " + modules}) == 0) return true;
    mark_skipped(what + " is not installed (Debian and Ubuntu: " + package + ")");
    return false;
}

inline std::string repo_script(const char* name) {
    return (fs::read_symlink("/proc/self/exe").parent_path().parent_path() / "scripts" / name).string();
}

// The "BLAS: ..." line `mirrored devices` prints in this environment (its output goes to `out`).
inline std::string devices_blas_line(const std::string& out,
                                     const std::vector<std::pair<std::string, std::string>>& env) {
    REQUIRE(run_cli({"devices"}, env, -1, nullptr, Stdout::file, out) == kExitOk);
    std::ifstream in(out);
    std::string line;
    while (std::getline(in, line))
        if (line.rfind("BLAS: ", 0) == 0) return line;
    return std::string();
}

}  // namespace mirrored::test
