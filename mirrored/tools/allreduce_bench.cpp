// `bench-allreduce`: the cross-device ops' time and bandwidth over a range of sizes, every result
// verified; with --duration, the links' stress test: all-reduce for that long over the sizes,
// verify every result, report bandwidth over time, and fail (exit 5) on a wrong sum naming the
// replica pair whose link delivered it.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "mirrored/allreduce_rig.h"
#include "kernels/blas.h"
#include "kernels/op_math.h"
#include "kernels/ops/flat.h"
#include "mirrored/tools/tools.h"
#include "mirrored/util.h"
#include "mirrored/watchdog.h"

namespace mirrored {

using json = nlohmann::json;

namespace {

// Replica r's input for pattern p: r + 1 + (i mod 7), or r + 2 + (i mod 5). Small integers, so
// every sum is exact in f32 and in bf16 (n <= 12); two patterns, so a stale result fails too.
float pattern_value(int p, int r, size_t i) { return p == 0 ? float(r + 1 + int(i % 7)) : float(r + 2 + int(i % 5)); }
float pattern_sum(int p, int n, size_t i) {
    return p == 0 ? float(n * (n + 1) / 2 + n * int(i % 7)) : float(n * (n + 3) / 2 + n * int(i % 5));
}

PeerTransport transport_of(const std::string& t) {
    if (t != "auto" && t != "direct" && t != "staged")
        throw ConfigError("--transport: expected auto, direct or staged, got '" + t + "'");
    return t == "direct" ? PeerTransport::direct : t == "staged" ? PeerTransport::staged : PeerTransport::automatic;
}

DType wire_of(const std::string& d) {
    if (d != "fp32" && d != "bf16") throw ConfigError("--dtype: expected fp32 or bf16, got '" + d + "'");
    return d == "bf16" ? DType::bf16 : DType::f32;
}

std::vector<size_t> sizes_of(const AllReduceBenchOptions& o) {
    if (o.min_bytes > o.max_bytes) throw ConfigError("--min-bytes is larger than --max-bytes");
    std::vector<size_t> out;
    for (size_t b = o.min_bytes; b <= o.max_bytes; b *= 2) out.push_back(b);
    return out;
}

void print_header(const AllReduceBenchOptions& o, AllReduceRig& rig, DType wire) {
    const int n = rig.replicas();
    std::printf("all-reduce %s (%s on the wire) over %d replica(s) [%s] (%s)%s\n", rig.ops->name(), o.dtype.c_str(), n,
                rig.list.describe().c_str(),
                rig.list.traits().asynchronous ? rig.devs[0]->description().c_str() : cpu_model_name().c_str(),
                rig.list.traits().asynchronous ? (", peer transport " + o.transport).c_str() : "");
    for (const StagedPair& p : rig.staged)
        std::printf("  %s:%d -> %s:%d: staged peer copies (%s)\n", rig.list.backend->name, p.from,
                    rig.list.backend->name, p.to, p.why.c_str());
    std::printf("algbw = bytes / time; busbw = algbw * 2(n-1)/n, as nccl-tests define them%s\n",
                wire == DType::bf16 ? " (bytes: the f32 gradients; the wire carries half)" : "");
}

// Loads pattern p into every replica's buffer, from `pristine` (one copy per replica and
// pattern, on the device, so a stress iteration costs a device-side copy, not a host upload).
struct Patterns {
    std::vector<DeviceBuffer<float>> pristine;  // [replica * 2 + p]
    size_t count = 0;
    Patterns(AllReduceRig& rig, size_t floats) : count(floats) {
        std::vector<float> host(floats);
        for (int r = 0; r < rig.replicas(); ++r)
            for (int p = 0; p < 2; ++p) {
                Device& d = *rig.devs[size_t(r)];
                for (size_t i = 0; i < floats; ++i) host[i] = pattern_value(p, r, i);
                pristine.emplace_back(d, floats);
                d.copy_to_device(d.compute_stream(), pristine.back().data(), host.data(), floats * sizeof(float));
                d.synchronize();
            }
    }
    void load(AllReduceRig& rig, int p, size_t floats) {
        for (int r = 0; r < rig.replicas(); ++r) {
            Device& d = *rig.devs[size_t(r)];
            d.copy_from_peer(d.compute_stream(), rig.bufs[size_t(r)].data(), d,
                             pristine[size_t(r) * 2 + size_t(p)].data(), floats * sizeof(float));
        }
        for (auto& d : rig.devs) d->synchronize();
    }
};

// Each replica's checksum of its first `floats` against the expected sum's, computed on the host.
struct Verifier {
    std::vector<DeviceBuffer<uint64_t>> sums;
    std::vector<uint64_t> host;
    explicit Verifier(AllReduceRig& rig) : host(size_t(rig.replicas())) {
        for (auto& d : rig.devs) sums.emplace_back(*d, 1);
    }
    static uint64_t expected(int p, int n, size_t floats) {
        uint64_t s = 0;
        for (size_t i = 0; i < floats; ++i) s += checksum_term(float_bits(pattern_sum(p, n, i)), i);
        return s;
    }
    // The replicas whose result differs from `want`.
    std::vector<int> wrong(AllReduceRig& rig, size_t floats, uint64_t want) {
        for (int r = 0; r < rig.replicas(); ++r) {
            Device& d = *rig.devs[size_t(r)];
            checksum_floats(d, d.compute_stream(), floats, rig.bufs[size_t(r)].data(), sums[size_t(r)].data());
            d.copy_to_host(d.compute_stream(), &host[size_t(r)], sums[size_t(r)].data(), sizeof(uint64_t));
        }
        std::vector<int> bad;
        for (int r = 0; r < rig.replicas(); ++r) {
            rig.devs[size_t(r)]->synchronize();
            if (host[size_t(r)] != want) bad.push_back(r);
        }
        return bad;
    }
};

// "replica 2 (cuda:2) got 13 at element 7, expected 12: suspect the link from replica 1 (cuda:1)"
std::string describe_wrong(AllReduceRig& rig, const std::vector<int>& bad, int p, size_t floats) {
    const int n = rig.replicas();
    std::vector<bool> is_bad(size_t(n), false);
    for (int r : bad) is_bad[size_t(r)] = true;
    // The ring delivers into r from r-1: the first wrong replica whose sender is right names the link.
    int culprit = bad.front();
    for (int r : bad)
        if (!is_bad[size_t((r + n - 1) % n)]) {
            culprit = r;
            break;
        }
    const int from = (culprit + n - 1) % n;
    std::vector<float> got(floats);
    Device& d = *rig.devs[size_t(culprit)];
    d.copy_to_host(d.compute_stream(), got.data(), rig.bufs[size_t(culprit)].data(), floats * sizeof(float));
    d.synchronize();
    size_t at = 0;
    while (at < floats && got[at] == pattern_sum(p, n, at)) ++at;
    std::string text = std::to_string(bad.size()) + " of " + std::to_string(n) +
                       " replicas ended with a wrong sum; replica " + std::to_string(culprit) + " (" + d.name() + ")";
    if (at < floats)
        text += " has " + std::to_string(got[at]) + " at element " + std::to_string(at) + ", expected " +
                std::to_string(pattern_sum(p, n, at));
    return text + ": suspect the link from replica " + std::to_string(from) + " (" + rig.devs[size_t(from)]->name() +
           ") to replica " + std::to_string(culprit);
}

int table(const AllReduceBenchOptions& o, AllReduceRig& rig, const std::vector<size_t>& sizes, Watchdog& watchdog) {
    const int n = rig.replicas();
    const double barrier_us = barrier_latency_us(*rig.threads);
    std::printf("replica barrier: %.2f us per crossing (%d threads, %s)\n\n", barrier_us, n,
                rig.threads->barrier().spin_ns() > 0 ? "bounded spin, then sleep"
                                                     : "sleeps at once: more replica threads than cores");
    std::printf("%10s %12s %6s %12s %12s %12s  %s\n", "bytes", "floats", "iters", "time (us)", "algbw GB/s",
                "busbw GB/s", "check");
    Patterns patterns(rig, sizes.back() / sizeof(float));
    Verifier verify(rig);
    json rows = json::array();
    bool all_ok = true;
    watchdog.phase("the all-reduce table", 0);
    for (size_t bytes : sizes) {
        watchdog.tick(0);  // each size has the whole timeout
        const size_t count = std::max<size_t>(bytes / sizeof(float), 1);
        patterns.load(rig, 0, count);
        rig.run(count, 1);
        const bool ok = verify.wrong(rig, count, Verifier::expected(0, n, count)).empty();
        all_ok = all_ok && ok;
        rig.zero();
        const int iters =
            o.iters > 0 ? o.iters : int(std::clamp<double>(2e9 / double(bytes) / std::max(n, 1), 5, 1000));
        rig.run(count, 3);
        const double t = rig.run(count, iters) / iters;
        const double algbw = double(count * sizeof(float)) / t / 1e9;
        const double busbw = n > 1 ? algbw * 2.0 * (n - 1) / n : 0.0;
        std::printf("%10s %12zu %6d %12.1f %12.2f %12.2f  %s\n", human_bytes(count * sizeof(float)).c_str(), count,
                    iters, t * 1e6, algbw, busbw, ok ? "ok" : "WRONG");
        rows.push_back({{"bytes", count * sizeof(float)},
                        {"count", count},
                        {"iters", iters},
                        {"time_us", t * 1e6},
                        {"algbw_gbs", algbw},
                        {"busbw_gbs", busbw},
                        {"correct", ok}});
    }
    write_json(o.json, {{"benchmark", "allreduce"},
                        {"op", rig.ops->name()},
                        {"devices", rig.list.describe()},
                        {"transport", o.transport},
                        {"dtype", o.dtype},
                        {"barrier_us", barrier_us},
                        {"replicas", n},
                        {"device", rig.list.traits().gpu ? rig.devs[0]->description() : cpu_model_name()},
                        {"results", rows}});
    if (!all_ok) throw DeviceError("bench-allreduce: a result was wrong (marked WRONG above)");
    return kExitOk;
}

double percentile(std::vector<double> v, double q) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    return v[std::min(v.size() - 1, size_t(q * double(v.size() - 1) + 0.5))];
}

constexpr int kStressWindows = 10;

// busbw samples per size, in all and per time window (a tenth of the run each)
struct StressSamples {
    std::vector<std::vector<double>> all;
    std::vector<std::vector<std::vector<double>>> windows;
    uint64_t verified = 0;
};

// All-reduces of each size in turn, with alternating patterns, until the duration is up; each
// result verified (a wrong one throws, naming the replicas); a progress line per window.
StressSamples stress_loop(const AllReduceBenchOptions& o, AllReduceRig& rig, const std::vector<size_t>& sizes,
                          Watchdog& watchdog) {
    const int n = rig.replicas();
    Patterns patterns(rig, sizes.back() / sizeof(float));
    Verifier verify(rig);
    std::vector<uint64_t> want[2];
    for (int p = 0; p < 2; ++p)
        for (size_t bytes : sizes) want[p].push_back(Verifier::expected(p, n, bytes / sizeof(float)));
    StressSamples s;
    s.all.resize(sizes.size());
    s.windows.assign(sizes.size(), std::vector<std::vector<double>>(kStressWindows));
    const double start = now_s(), window_s = o.duration_s / kStressWindows;
    int reported = 0;
    for (uint64_t iter = 0;; ++iter) {
        const double now = now_s() - start;
        if (now >= o.duration_s) break;
        const int w = std::min(kStressWindows - 1, int(now / window_s));
        while (reported < w) {  // a line per finished window
            const size_t k = sizes.size() - 1;
            std::printf("  %6.1f s: %llu all-reduces verified; %s busbw median %.2f GB/s\n", (reported + 1) * window_s,
                        static_cast<unsigned long long>(s.verified), human_bytes(sizes[k]).c_str(),
                        percentile(s.windows[k][size_t(reported)], 0.5) / 1e9);
            std::fflush(stdout);
            ++reported;
        }
        const size_t k = iter % sizes.size();
        const int p = int((iter / sizes.size()) % 2);
        const size_t count = sizes[k] / sizeof(float);
        patterns.load(rig, p, count);
        const double t = rig.run(count, 1);
        const std::vector<int> bad = verify.wrong(rig, count, want[p][k]);
        if (!bad.empty()) {
            std::printf("\n");
            throw DeviceError("stress test: all-reduce " + std::to_string(iter + 1) + " of " + human_bytes(sizes[k]) +
                              " after " + std::to_string(int(now)) + " s: " + describe_wrong(rig, bad, p, count));
        }
        ++s.verified;
        watchdog.tick(0);
        const double busbw = 2.0 * (n - 1) / n * double(sizes[k]) / t;
        s.all[k].push_back(busbw);
        s.windows[k][size_t(w)].push_back(busbw);
    }
    return s;
}

int stress(const AllReduceBenchOptions& o, AllReduceRig& rig, const std::vector<size_t>& sizes, Watchdog& watchdog) {
    if (rig.replicas() < 2) throw ConfigError("--duration: the stress test needs at least 2 replicas (--devices)");
    std::printf("stress test for %.0f s over %zu size(s), %s to %s; every result verified\n\n", o.duration_s,
                sizes.size(), human_bytes(sizes.front()).c_str(), human_bytes(sizes.back()).c_str());
    watchdog.phase("the stress test", 0);
    const StressSamples s = stress_loop(o, rig, sizes, watchdog);
    std::printf("\n%10s %8s %12s %12s %12s %12s %12s\n", "bytes", "count", "min GB/s", "median GB/s", "max GB/s",
                "first 10%", "last 10%");
    json rows = json::array();
    std::vector<std::string> slow;
    for (size_t k = 0; k < sizes.size(); ++k) {
        const std::vector<double>& all = s.all[k];
        const double first = percentile(s.windows[k].front(), 0.5), last = percentile(s.windows[k].back(), 0.5);
        std::printf("%10s %8zu %12.2f %12.2f %12.2f %12.2f %12.2f\n", human_bytes(sizes[k]).c_str(), all.size(),
                    percentile(all, 0) / 1e9, percentile(all, 0.5) / 1e9, percentile(all, 1) / 1e9, first / 1e9,
                    last / 1e9);
        if (first > 0 && last > 0 && last < 0.85 * first)
            slow.push_back(human_bytes(sizes[k]) + ": " + std::to_string(int(100 - 100 * last / first)) + "% slower");
        json wj = json::array();
        for (const auto& win : s.windows[k]) wj.push_back(percentile(win, 0.5) / 1e9);
        rows.push_back({{"bytes", sizes[k]},
                        {"count", all.size()},
                        {"busbw_min_gbs", percentile(all, 0) / 1e9},
                        {"busbw_median_gbs", percentile(all, 0.5) / 1e9},
                        {"busbw_max_gbs", percentile(all, 1) / 1e9},
                        {"busbw_median_per_window_gbs", wj}});
    }
    std::printf("\n%llu all-reduces, every result correct. ", static_cast<unsigned long long>(s.verified));
    if (slow.empty()) std::printf("No slowdown over time (last 10%% of the run within 15%% of the first).\n");
    else {
        std::printf("Slowdown over time (last 10%% against the first):");
        for (const auto& sl : slow) std::printf(" %s;", sl.c_str());
        std::printf(" check the GPUs' clocks and temperatures (nvidia-smi -q -d PERFORMANCE).\n");
    }
    write_json(o.json, {{"benchmark", "allreduce_stress"},
                        {"op", rig.ops->name()},
                        {"devices", rig.list.describe()},
                        {"dtype", o.dtype},
                        {"duration_s", o.duration_s},
                        {"verified", s.verified},
                        {"slowdown", slow},
                        {"results", rows}});
    return kExitOk;
}

}  // namespace

int bench_allreduce(const AllReduceBenchOptions& o) {
    const DType wire = wire_of(o.dtype);
    const PeerTransport transport = transport_of(o.transport);
    const std::vector<size_t> sizes = sizes_of(o);
    // a link that stops answering is what the stress test is for: a verdict, not a process that waits forever
    Watchdog watchdog(o.timeout_s, "start-up (the devices, peer access, the cross-device op)",
                      "nothing was written; check the links (nvidia-smi topo -m, nvidia-smi nvlink -s)", "--timeout");
    AllReduceRig rig(o.devices, o.op, wire, sizes.back() / sizeof(float));
    set_peer_transport(transport);
    print_header(o, rig, wire);
    return o.duration_s > 0 ? stress(o, rig, sizes, watchdog) : table(o, rig, sizes, watchdog);
}

}  // namespace mirrored
