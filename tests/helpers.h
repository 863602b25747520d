// Shared test helpers: devices to test on, random inputs, upload/download, error measures.
#pragma once

#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/buffer.h"
#include "kernels/device.h"
#include "kernels/sim/sim.h"
#include "kernels/ops/flat.h"

namespace mirrored::test {

void mark_skipped(const std::string& reason);
// Skips a case that can only run on another kind of machine (more GPUs, the emulated GPU): its
// reason starts "runs elsewhere: ", which scripts/gpu_check.sh lists apart instead of failing.
void mark_runs_elsewhere(const std::string& reason);

// A fresh folder under the system temporary directory, removed with its contents at scope exit.
class TempDir {
public:
    TempDir() {
        static int counter = 0;
        path_ = std::filesystem::temp_directory_path() /
                ("mirrored_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
        std::filesystem::remove_all(path_);
        std::filesystem::create_directories(path_);
    }
    ~TempDir() { std::filesystem::remove_all(path_); }
    TempDir(const TempDir&) = delete;
    TempDir& operator=(const TempDir&) = delete;
    const std::filesystem::path& path() const { return path_; }
    std::string operator/(const std::string& name) const { return (path_ / name).string(); }
    // Writes a text file in the folder and returns its path.
    std::string write(const std::string& name, const std::string& text) const {
        std::ofstream(path_ / name) << text;
        return (path_ / name).string();
    }

private:
    std::filesystem::path path_;
};

// A whole file as text ("" when it cannot be read).
inline std::string read_text(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), {});
}

// Fresh random inputs each run; MIRRORED_TEST_SEED repeats a run.
inline uint64_t base_seed() {
    static const uint64_t seed = []() -> uint64_t {
        if (const char* s = std::getenv("MIRRORED_TEST_SEED")) return std::strtoull(s, nullptr, 10);
        return (static_cast<uint64_t>(std::random_device{}()) << 32) | std::random_device{}();
    }();
    return seed;
}

inline bool have_cuda() { return cuda_device_count() > 0; }

// Skips the current test case (reported as skipped, not passed) when no GPU is visible.
#define SKIP_WITHOUT_CUDA()                                                                                   \
    do {                                                                                                      \
        if (!::mirrored::test::have_cuda()) {                                                                 \
            ::mirrored::test::mark_skipped("no CUDA device (" + ::mirrored::cuda_unavailable_reason() + ")"); \
            return;                                                                                           \
        }                                                                                                     \
    } while (0)

class Rng {
public:
    explicit Rng(uint64_t salt) : gen_(base_seed() ^ (salt * 0x9E3779B97F4A7C15ull)) {}
    std::vector<float> normal(size_t n, float stddev = 1.0f) {
        std::normal_distribution<float> d(0.0f, stddev);
        std::vector<float> v(n);
        for (auto& x : v) x = d(gen_);
        return v;
    }
    std::vector<float> uniform(size_t n, float lo, float hi) {
        std::uniform_real_distribution<float> d(lo, hi);
        std::vector<float> v(n);
        for (auto& x : v) x = d(gen_);
        return v;
    }
    std::vector<int32_t> labels(size_t n, int classes) {
        std::uniform_int_distribution<int32_t> d(0, classes - 1);
        std::vector<int32_t> v(n);
        for (auto& x : v) x = d(gen_);
        return v;
    }
    int integer(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(gen_); }
    std::mt19937_64& gen() { return gen_; }

private:
    std::mt19937_64 gen_;
};

template <typename T>
DeviceBuffer<T> upload(Device& d, const std::vector<T>& h) {
    DeviceBuffer<T> b(d, h.size());
    d.copy_to_device(d.compute_stream(), b.data(), h.data(), h.size() * sizeof(T));
    return b;
}

template <typename T>
std::vector<T> download(Device& d, const DeviceBuffer<T>& b) {
    std::vector<T> h(b.size());
    d.copy_to_host(d.compute_stream(), h.data(), b.data(), b.bytes());
    d.synchronize();
    return h;
}

// Output buffers start as NaN, so an element an op forgot to write fails the comparison.
inline DeviceBuffer<float> poisoned(Device& d, size_t n) {
    DeviceBuffer<float> b(d, n);
    fill_floats(d, d.compute_stream(), n, std::nanf(""), b.data());
    return b;
}

// max |got - want| / max(max |want|, floor): a normalised max error. NaN anywhere -> infinity.
template <typename A, typename B>
double rel_error(const std::vector<A>& got, const std::vector<B>& want, double floor = 1e-6) {
    if (got.size() != want.size()) return INFINITY;
    double scale = floor, err = 0.0;
    for (size_t i = 0; i < want.size(); ++i) scale = std::max(scale, std::fabs(double(want[i])));
    for (size_t i = 0; i < want.size(); ++i) {
        const double e = std::fabs(double(got[i]) - double(want[i]));
        if (!(e == e)) return INFINITY;
        err = std::max(err, e);
    }
    return err / scale;
}

// Simulated GPUs with random stream delays for the scope of a test case, reset afterwards.
struct SimScope {
    explicit SimScope(int delay_us = 40, bool peer_access = true) {
        sim_reset();
        sim_set_delays(delay_us);
        sim_set_peer_access(peer_access);
    }
    ~SimScope() {
        sim_reset();
        set_peer_transport(PeerTransport::automatic);
    }
};

}  // namespace mirrored::test
