#include "kernels/blas.h"

#include <cblas.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "kernels/cpu/gemm_choice.h"
#include "kernels/cpu/jit_gemm.h"
#include "base/machine_cache.h"
#include "base/signals.h"

extern "C" char* openblas_get_corename(void);
extern "C" char* openblas_get_config(void);

namespace mirrored {

namespace {

constexpr const char* kProbeVar = "MIRRORED_BLAS_PROBE";    // this process is a probe child
constexpr const char* kChosenVar = "MIRRORED_BLAS_CHOSEN";  // set on our re-exec: "core|gflops|own|own_gflops"
// The same marker, kept for the processes a re-executed one starts (the tests' CLI runs, `scale`'s
// children): they inherit OPENBLAS_CORETYPE and must run that kernel, not measure again from it -
// a second measurement, noisy, could pick another kernel, and the two would round differently.
constexpr const char* kInheritedVar = "MIRRORED_BLAS_INHERITED";

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

std::string core_name() {
    const char* c = openblas_get_corename();
    return c ? c : "unknown";
}

// What the CPU and a kernel can do: 3 AVX-512, 2 AVX2 + FMA, 1 older.
int cpu_level() {
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512dq"))
        return 3;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return 2;
#endif
    return 1;
}

int kernel_level(const std::string& core) {
    for (const char* c : {"SkylakeX", "Cooperlake", "SapphireRapids"})
        if (core == c) return 3;
    for (const char* c : {"Haswell", "Zen"})
        if (core == c) return 2;
    return 1;
}

std::vector<std::string> candidates(int level) {
    std::vector<std::string> c;
    if (level >= 3) c.insert(c.end(), {"SkylakeX", "Cooperlake"});
    if (level >= 2) c.insert(c.end(), {"Haswell", "Zen"});
    return c;
}

// A deterministic pseudo-random matrix in [-1, 1).
std::vector<float> matrix(size_t n, uint32_t seed) {
    std::vector<float> m(n);
    for (auto& v : m) {
        seed = seed * 1664525u + 1013904223u;
        v = float(seed >> 8) / float(1 << 24) * 2.0f - 1.0f;
    }
    return m;
}

// Every transpose combination of an odd-sized sgemm against a double-precision loop.
bool results_correct() {
    const int m = 67, n = 45, k = 129;
    const auto a = matrix(size_t(m) * k, 1), b = matrix(size_t(k) * n, 2);
    for (int ta = 0; ta < 2; ++ta)
        for (int tb = 0; tb < 2; ++tb) {
            std::vector<float> c(size_t(m) * n, 0.5f);
            cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k, 1.25f,
                        a.data(), ta ? m : k, b.data(), tb ? k : n, 0.5f, c.data(), n);
            for (int i = 0; i < m; ++i)
                for (int j = 0; j < n; ++j) {
                    double s = 0, mag = 0;
                    for (int l = 0; l < k; ++l) {
                        const double x = ta ? a[size_t(l) * m + i] : a[size_t(i) * k + l];
                        const double y = tb ? b[size_t(j) * k + l] : b[size_t(l) * n + j];
                        s += x * y;
                        mag += std::fabs(x * y);
                    }
                    const double want = 1.25 * s + 0.25;
                    if (!(std::fabs(c[size_t(i) * n + j] - want) <= 1e-5 * (1.25 * mag + 0.25))) return false;
                }
        }
    return true;
}

// sgemm GFLOP/s on the shapes a replica's step runs: a 64-row shard through a wide layer, and a
// square product.
double gflops() {
    struct Shape {
        int m, n, k;
    };
    double total_flops = 0, total_s = 0;
    for (const Shape s : {Shape{64, 512, 784}, Shape{384, 384, 384}}) {
        const auto a = matrix(size_t(s.m) * s.k, 3), b = matrix(size_t(s.k) * s.n, 4);
        std::vector<float> c(size_t(s.m) * s.n);
        auto once = [&] {
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, s.m, s.n, s.k, 1.0f, a.data(), s.k, b.data(), s.n,
                        0.0f, c.data(), s.n);
        };
        once();
        int iters = 0;
        const double t0 = now();
        do {
            once();
            ++iters;
        } while (now() - t0 < 0.06);
        total_s += now() - t0;
        total_flops += 2.0 * s.m * s.n * double(s.k) * iters;
    }
    return total_flops / total_s / 1e9;
}

struct Choice {
    std::string core;
    double gflops = 0;
    std::string own;
    double own_gflops = 0;
    bool cached = false;  // read from the machine cache, measured by an earlier start
};

// A child process of this binary measuring one kernel; < 0 when it failed, crashed (an
// instruction the CPU lacks) or took too long.
double probe(const std::string& core) {
    int fds[2];
    if (::pipe(fds) != 0) return -1;
    std::fflush(nullptr);
    const pid_t pid = ::fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        ::dup2(fds[1], 1);
        ::close(fds[0]);
        ::close(fds[1]);
        const int null = ::open("/dev/null", O_WRONLY);
        if (null >= 0) ::dup2(null, 2);
        ::setenv("OPENBLAS_CORETYPE", core.c_str(), 1);
        ::setenv("OPENBLAS_NUM_THREADS", "1", 1);
        ::setenv(kProbeVar, std::to_string(::getppid()).c_str(), 1);  // the parent that reads the answer
        ::unsetenv(kChosenVar);
        ::execl("/proc/self/exe", "mirrored-blas-probe", static_cast<char*>(nullptr));
        ::_exit(127);
    }
    ::close(fds[1]);
    std::string out;
    char buf[256];
    const double deadline = now() + 20;
    for (;;) {
        pollfd p{fds[0], POLLIN, 0};
        const int left_ms = int(std::max(0.0, deadline - now()) * 1000);
        if (left_ms == 0 || ::poll(&p, 1, left_ms) <= 0) {
            ::kill(pid, SIGKILL);
            break;
        }
        const ssize_t got = ::read(fds[0], buf, sizeof buf);
        if (got <= 0) break;
        out.append(buf, size_t(got));
    }
    ::close(fds[0]);
    int status = 0;
    ::waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return -1;
    // "<core> <gflops>": the kernel OpenBLAS actually loaded must be the one asked for
    char name[64] = {};
    double g = -1;
    if (std::sscanf(out.c_str(), "%63s %lf", name, &g) != 2 || core != name) return -1;
    return g;
}

// The machine and the library build: a choice is reused only for exactly these. The model name
// alone is not the machine: VMs of different generations report one ("Intel(R) Xeon(R)
// Processor") and may share a home directory, so the instruction-set class is part of it. Not
// the kernel this process started on - a process started on the chosen kernel (OPENBLAS_CORETYPE
// inherited) must find the same answer as one started on OpenBLAS's own pick, not measure again.
std::string cache_key() {
    std::string config = openblas_get_config() ? openblas_get_config() : "";
    // The config names the loaded kernel: " <core> " becomes " ". (Appends and erase, not `+` and
    // replace(): on those g++ 12's -Wrestrict warns of an overlap that cannot happen.)
    const std::string core = std::string(" ").append(core_name()).append(" ");
    if (const size_t at = config.find(core); at != std::string::npos) config.erase(at + 1, core.size() - 1);
    std::string key = cpu_model_name();
    key.append("|class ").append(std::to_string(cpu_level())).append("|").append(config);
    return key;
}

// "core|gflops|own|own_gflops[|cached]", as reexec writes it (a process of an older build leaves
// out whether the choice came from the cache).
bool parse_marker(const std::string& text, Choice& c) {
    char core[64] = {}, own[64] = {};
    int cached = 0;
    if (std::sscanf(text.c_str(), "%63[^|]|%lf|%63[^|]|%lf|%d", core, &c.gflops, own, &c.own_gflops, &cached) < 4)
        return false;
    c.core = core;
    c.own = own;
    c.cached = cached != 0;
    return true;
}

std::string how_chosen(const Choice& c) {
    char how[320];
    std::snprintf(how, sizeof how,
                  "chosen by mirrored by measurement%s: %.0f GFLOP/s against %.0f for %s, the kernel it "
                  "started with",
                  c.cached ? " on an earlier start (from the machine cache, blas-kernel.txt)" : "", c.gflops,
                  c.own_gflops, c.own.c_str());
    return how;
}

// An entry as write_cache wrote it, for this process's kernel (the one the measurement started
// from, or the one it chose: a process started on the choice finds the same answer): anything
// else (edited, truncated, a NaN, another kernel's) is not used, and is measured again.
bool read_cache(const std::string& key, const std::string& own, Choice& c) {
    const auto v = cache_lookup("blas-kernel.txt", key);
    char core[64] = {}, from[64] = {}, rest = 0;
    if (!v || std::sscanf(v->c_str(), "%63s %lf %63s %lf %c", core, &c.gflops, from, &c.own_gflops, &rest) != 4)
        return false;
    const auto plausible = [](double g) { return std::isfinite(g) && g > 0 && g < 1e7; };
    if ((from != own && core != own) || !plausible(c.gflops) || !plausible(c.own_gflops) || c.gflops < c.own_gflops)
        return false;
    c.core = core;
    c.own = from;
    c.cached = true;
    return true;
}

void write_cache(const std::string& key, const Choice& c) {
    cache_store("blas-kernel.txt", key,
                c.core + " " + std::to_string(c.gflops) + " " + c.own + " " + std::to_string(c.own_gflops));
}

[[noreturn]] void reexec(char** argv, const Choice& c) {
    char marker[256];
    std::snprintf(marker, sizeof marker, "%s|%.1f|%s|%.1f|%d", c.core.c_str(), c.gflops, c.own.c_str(), c.own_gflops,
                  c.cached ? 1 : 0);
    ::setenv("OPENBLAS_CORETYPE", c.core.c_str(), 1);
    ::setenv(kChosenVar, marker, 1);
    ::setenv(kInheritedVar, marker, 1);
    exec_self(argv);
    std::fprintf(stderr, "mirrored: could not re-execute with BLAS kernel %s (%s); continuing with %s\n",
                 c.core.c_str(), std::strerror(errno), c.own.c_str());
    std::fflush(stderr);
    ::_exit(1);  // unreachable in practice; never continue half-configured
}

Choice g_choice;  // what blas_description reports
std::string g_how = "OpenBLAS's own pick";

}  // namespace

double blas_probe_gflops() { return results_correct() ? gflops() : -1.0; }

namespace {

// In a process this one re-executed with the kernel it chose (kChosenVar set): keep the choice if
// the kernel loaded and computes correctly; otherwise go back to the kernel it started with,
// re-executing once more (which does not return).
void settle_chosen_kernel(char** argv, const std::string& own, const std::string& chosen) {
    ::unsetenv(kChosenVar);  // not for the processes this one starts (they get kInheritedVar)
    if (chosen == "rejected") {
        g_how = "the kernel it started with: the faster one failed its check on start-up";
        ::unsetenv(kInheritedVar);
        return;
    }
    Choice c;
    const bool parsed = parse_marker(chosen, c);
    if (parsed && own == c.core && results_correct()) {
        g_choice = c;
        g_how = how_chosen(c);
        return;
    }
    if (parsed && kernel_level(c.own) > 0) ::setenv("OPENBLAS_CORETYPE", c.own.c_str(), 1);  // back to where it started
    cache_erase("blas-kernel.txt", cache_key());  // if the choice came from there, the next start measures again
    ::unsetenv(kInheritedVar);
    ::setenv(kChosenVar, "rejected", 1);
    exec_self(argv);
}

// Started by a process that chose this kernel (kInheritedVar): its choice, if OPENBLAS_CORETYPE
// still names it.
bool adopt_inherited_kernel(const std::string& own, const char* marker) {
    Choice c;
    if (parse_marker(marker, c) && own == c.core) {
        g_choice = c;
        g_how = how_chosen(c) + " (by the process that started this one)";
        return true;
    }
    ::unsetenv(kInheritedVar);  // OPENBLAS_CORETYPE was changed since: choose afresh
    return false;
}

// Every kernel of this CPU's classes probed in a child process; the fastest by a clear margin.
Choice measure_kernels(const std::string& own, int level) {
    Choice c;
    c.own = own;
    c.core = own;
    c.own_gflops = c.gflops = probe(own);
    for (const std::string& k : candidates(level)) {
        if (k == own) continue;
        const double g = probe(k);
        if (g > c.gflops * 1.05) {  // a clear gain, not noise
            c.core = k;
            c.gflops = g;
        }
    }
    return c;
}

}  // namespace

void choose_blas_kernel(char** argv) {
    // A probe child: started by its parent as "mirrored-blas-probe" with the parent's pid in
    // kProbeVar, it measures, reports and leaves. The variable anywhere else (a user's
    // environment, a child of a probe's parent) is not an instruction: dropped.
    if (const char* probe_of = std::getenv(kProbeVar); probe_of && argv && argv[0] &&
                                                       std::string(argv[0]) == "mirrored-blas-probe" && !argv[1] &&
                                                       std::string(probe_of) == std::to_string(::getppid())) {
        const double g = blas_probe_gflops();
        std::printf("%s %.3f\n", core_name().c_str(), g);
        std::fflush(stdout);
        ::_exit(g > 0 ? 0 : 1);
    }
    ::unsetenv(kProbeVar);
    const std::string own = core_name();
    g_choice.core = own;
    if (const char* chosen = std::getenv(kChosenVar)) return settle_chosen_kernel(argv, own, chosen);
    if (const char* marker = std::getenv(kInheritedVar); marker && adopt_inherited_kernel(own, marker)) return;
    // OPENBLAS_CORETYPE set in the environment (machine images do) is where OpenBLAS starts; a
    // faster kernel still wins unless MIRRORED_BLAS_AUTO=0 says to keep it.
    const char* env_core = std::getenv("OPENBLAS_CORETYPE");
    g_how = env_core ? "OPENBLAS_CORETYPE in the environment" : "OpenBLAS's own pick";
    if (const char* a = std::getenv("MIRRORED_BLAS_AUTO"); a && std::string(a) == "0") {
        g_how += ", MIRRORED_BLAS_AUTO=0";
        return;
    }
    const int level = cpu_level();
    if (kernel_level(own) >= level) return;  // already the best class of kernel for this CPU
    const std::string key = cache_key();
    Choice c;
    const auto runnable = [&](const std::string& core) {  // a cache edited, or written by another CPU
        const auto all = candidates(level);
        return core == own || std::find(all.begin(), all.end(), core) != all.end();
    };
    if (!read_cache(key, own, c) || !runnable(c.core)) {
        c = measure_kernels(own, level);
        write_cache(key, c);
    }
    if (c.core != own && c.gflops > 0) reexec(argv, c);
    g_how += c.cached ? ", the fastest of the kernels this CPU runs as measured on an earlier start (from the "
                        "machine cache, blas-kernel.txt)"
                      : ", measured the fastest of the kernels this CPU runs";
}

std::string cpu_model_name() {
    std::ifstream in("/proc/cpuinfo");
    std::string line;
    while (std::getline(in, line))
        if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
    return "unknown CPU";
}

std::string blas_kernel() {
    const std::string jit = jit_gemm_description();
    if (jit.empty()) return core_name();
    return core_name() + " + " + jit + gemm_kernel_choice_name(gemm_kernel_choice()).suffix;
}

JitGemmChoice split_jit_gemm_choice(const std::string& jit) {
    for (const GemmKernelChoiceName& n : gemm_kernel_choice_names()) {
        const size_t len = std::strlen(n.suffix);
        if (len > 0 && jit.size() > len && jit.ends_with(n.suffix)) return {jit.substr(0, jit.size() - len), n.env};
    }
    return {jit, gemm_kernel_choice_name(GemmKernelChoice::rules).env};
}

std::string blas_machine_key() { return cache_key() + "|" + blas_kernel(); }

std::string blas_library() {
    if (const char* cfg = openblas_get_config()) {
        const std::string s = cfg;
        const size_t sp = s.find(' ', 9);
        return s.substr(0, sp == std::string::npos ? s.size() : sp);
    }
    return "OpenBLAS";
}

std::string blas_description() {
    const std::string jit = jit_gemm_description();
    return blas_library() + ", kernel " + core_name() + " (" + g_how + ")" + (jit.empty() ? "" : "; JIT GEMMs " + jit);
}

}  // namespace mirrored
