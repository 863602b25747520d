#include "mirrored/failover.h"

#include <cerrno>
#include <algorithm>
#include <cstdlib>

#include "base/error.h"

namespace mirrored {

namespace {
constexpr long kMaxAccumulation = 1 << 16;  // train.grad_accumulation_steps' limit
}

std::string encode_continuation(const Continuation& c) {
    return c.devices + "|" + std::to_string(c.accumulation) + "|" + c.failed + "|" + std::to_string(c.fault_ms) + "|" +
           std::to_string(c.lr_replicas) + "|" + c.resume;
}

Continuation decode_continuation(const std::string& text) {
    const auto fail = [&] {
        return ConfigError(std::string(kContinuationVar) + "=" + text +
                           ": expected DEVICES|ACCUMULATION|FAILED|FAULT_MS|LR_REPLICAS|CHECKPOINT, e.g. "
                           "sim:0,2|2|sim:1|1765000000000|4|/runs/x/checkpoints/step-0000000035.safetensors "
                           "(a run sets it for the process that continues it)");
    };
    std::vector<std::string> f;
    size_t from = 0;
    for (size_t bar; f.size() < 5 && (bar = text.find('|', from)) != std::string::npos; from = bar + 1)
        f.push_back(text.substr(from, bar - from));
    f.push_back(text.substr(from));  // the checkpoint's path: the rest
    if (f.size() != 6 || f[0].empty() || f[2].empty()) throw fail();
    const auto integer = [&](const std::string& s, long long lo, long long hi) {
        if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos) throw fail();
        errno = 0;
        const long long v = std::strtoll(s.c_str(), nullptr, 10);
        if (errno == ERANGE || v < lo || v > hi) throw fail();
        return v;
    };
    Continuation c;
    c.devices = f[0];
    c.accumulation = int(integer(f[1], 1, kMaxAccumulation));
    c.failed = f[2];
    c.fault_ms = integer(f[3], 0, int64_t(1) << 62);
    c.lr_replicas = int(integer(f[4], 1, 1 << 20));
    c.resume = f[5];
    return c;
}

SurvivorPlan plan_survivors(const std::vector<std::string>& replica_devices, const std::string& failed,
                            int global_batch, int accumulation, int min_replicas) {
    SurvivorPlan p;
    std::vector<int> healthy;
    for (size_t r = 0; r < replica_devices.size(); ++r)
        if (replica_devices[r] != failed) healthy.push_back(int(r));
    p.survivors = int(healthy.size());
    const int n = int(replica_devices.size());
    // The rows each replica computed at once: the new micro-batches may not be larger.
    const long before = n > 0 && accumulation > 0 ? long(global_batch) / (long(n) * accumulation) : 0;
    for (int m = p.survivors; m >= std::max(1, min_replicas) && before > 0; --m)
        for (long a = std::max<long>(accumulation, (global_batch + m * before - 1) / (m * before));
             a <= kMaxAccumulation && a * m <= global_batch; ++a)
            if (global_batch % (m * a) == 0 && global_batch / (m * a) <= before) {
                p.keep.assign(healthy.begin(), healthy.begin() + m);
                p.accumulation = int(a);
                return p;
            }
    p.refused = std::to_string(p.survivors) + " replica" + (p.survivors == 1 ? "" : "s") + " left";
    if (p.survivors >= min_replicas && p.survivors > 0)
        p.refused += ", and no " + std::to_string(min_replicas) + " or more of them share the global batch of " +
                     std::to_string(global_batch) + " equally";
    p.refused += " (strategy.min_replicas: " + std::to_string(min_replicas) + ")";
    return p;
}

std::string survivors_spec(const DeviceList& list, const std::vector<int>& keep) {
    const std::string name = list.backend->name;
    if (name == "cpu") return name + ":" + std::to_string(keep.size());  // CPU replicas are interchangeable
    std::string s = name + ":";
    for (size_t i = 0; i < keep.size(); ++i) s += (i ? "," : "") + std::to_string(list.ordinals[size_t(keep[i])]);
    return s;
}

}  // namespace mirrored
