// What the tools share: the machine's description, result files, sizes, the barrier's cost.
#include "mirrored/tools/tools.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include <sys/wait.h>
#include <unistd.h>

#include "data/datasets.h"
#include "data/loader.h"
#include "kernels/buffer.h"
#include "kernels/device.h"
#include "base/error.h"
#include "base/output.h"
#include "kernels/nccl.h"
#include "mirrored/util.h"
#include "mirrored/checkpoint.h"
#include "mirrored/config.h"
#include "mirrored/cross_device_ops.h"
#include "mirrored/replica_threads.h"
#include "mirrored/strategy.h"
#include "mirrored/session.h"
#include "mirrored/watchdog.h"

namespace mirrored {

using json = nlohmann::json;

void write_json(const OutputTarget& target, const json& j) {
    if (target.path.empty()) return;
    write_output(target, j.dump(2) + "\n");
    std::printf("wrote %s\n", target.path.c_str());
}

std::unique_ptr<Watchdog> steps_watchdog(double timeout_s) {
    return step_timeout_watchdog(timeout_s, "start-up (loading data, building the replicas)",
                                 "nothing was written: run it again");
}

std::string human_bytes(size_t b) {
    char s[32];
    if (b >= (size_t(1) << 30)) std::snprintf(s, sizeof s, "%zuG", b >> 30);
    else if (b >= (size_t(1) << 20)) std::snprintf(s, sizeof s, "%zuM", b >> 20);
    else if (b >= 1024) std::snprintf(s, sizeof s, "%zuK", b >> 10);
    else std::snprintf(s, sizeof s, "%zu", b);
    return s;
}

// Mean time of one crossing of the replica barrier with every replica thread arriving at once:
// the host-side cost each ring step pays on CPU replicas.
double barrier_latency_us(ReplicaThreads& threads) {
    constexpr int kRounds = 2000;
    threads.run([&](int) {
        for (int i = 0; i < 100; ++i) threads.barrier().arrive_and_wait();
    });
    const double t0 = now_s();
    threads.run([&](int) {
        for (int i = 0; i < kRounds; ++i) threads.barrier().arrive_and_wait();
    });
    return (now_s() - t0) / kRounds * 1e6;
}

int run_project_script(const std::string& name, const std::vector<std::string>& args) {
    namespace fs = std::filesystem;
    std::error_code ec;
    const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
    const fs::path script = exe.parent_path().parent_path() / "scripts" / name;
    if (ec || !fs::exists(script, ec)) return kScriptMissing;
    std::fflush(stdout);
    // The distribution's python first: that is where python3-matplotlib installs (a python3
    // earlier on PATH, pyenv's say, may not see it).
    const char* python = fs::exists("/usr/bin/python3", ec) ? "/usr/bin/python3" : "python3";
    std::vector<std::string> argv_text{python, script.string()};
    argv_text.insert(argv_text.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (std::string& a : argv_text) argv.push_back(a.data());
    argv.push_back(nullptr);
    const pid_t pid = ::fork();
    if (pid == 0) {
        ::execvp(python, argv.data());
        std::_Exit(kNoPython);
    }
    int status = 0;
    if (pid < 0 || ::waitpid(pid, &status, 0) < 0) return kNoPython;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}

}  // namespace mirrored
