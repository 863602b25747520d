// `bench-allreduce`: the cross-device ops' time and bandwidth over a range of sizes, every result
// verified.
#include "mirrored/tools/tools.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "data/datasets.h"
#include "data/loader.h"
#include "kernels/buffer.h"
#include "kernels/device.h"
#include "kernels/error.h"
#include "kernels/nccl.h"
#include "mirrored/util.h"
#include "mirrored/checkpoint.h"
#include "mirrored/config.h"
#include "mirrored/cross_device_ops.h"
#include "mirrored/replica_threads.h"
#include "mirrored/strategy.h"
#include "mirrored/trainer.h"

namespace mirrored {

using json = nlohmann::json;

int bench_allreduce(const AllReduceBenchOptions& o) {
    const DeviceList dl = parse_devices(o.devices);
    const int n = int(dl.ordinals.size());
    if (o.min_bytes > o.max_bytes) throw ConfigError("--min-bytes is larger than --max-bytes");
    if (o.transport != "auto" && o.transport != "direct" && o.transport != "staged")
        throw ConfigError("--transport: expected auto, direct or staged, got '" + o.transport + "'");
    if (o.dtype != "fp32" && o.dtype != "bf16") throw ConfigError("--dtype: expected fp32 or bf16, got '" + o.dtype + "'");
    const DType wire = o.dtype == "bf16" ? DType::bf16 : DType::f32;
    if (dl.type != DeviceType::cuda) cpu_set_blas_threads(1);
    const std::vector<StagedPair> staged = enable_peer_access(dl.type, dl.ordinals);
    set_peer_transport(o.transport == "direct" ? PeerTransport::direct
                       : o.transport == "staged" ? PeerTransport::staged
                                                 : PeerTransport::automatic);
    const size_t max_count = std::max<size_t>(o.max_bytes / sizeof(float), 1);
    std::vector<std::unique_ptr<Device>> devs;
    std::vector<DeviceBuffer<float>> bufs;
    std::vector<Device*> dp;
    std::vector<float*> bp;
    for (int r = 0; r < n; ++r) {
        devs.push_back(make_device(dl.type, dl.type == DeviceType::cpu ? r : dl.ordinals[r]));
        bufs.emplace_back(*devs.back(), max_count);
        dp.push_back(devs.back().get());
        bp.push_back(bufs.back().data());
    }
    ReplicaThreads threads(n);
    auto ops = make_cross_device_ops(o.op, dp, bp, max_count, threads.barrier(), wire);
    std::printf("all-reduce %s (%s on the wire) over %d replica(s) [%s] (%s)%s\n", ops->name(), o.dtype.c_str(), n,
                dl.describe().c_str(),
                dl.asynchronous() ? devs[0]->description().c_str() : cpu_model().c_str(),
                dl.asynchronous() ? (", peer transport " + o.transport).c_str() : "");
    for (const StagedPair& p : staged)
        std::printf("  %s:%d -> %s:%d: staged peer copies (%s)\n", device_type_name(dl.type), p.from,
                    device_type_name(dl.type), p.to, p.why.c_str());
    const double barrier_us = barrier_latency_us(threads);
    std::printf("replica barrier: %.2f us per crossing (%d threads, %s)\n", barrier_us, n,
                threads.barrier().spin_ns() > 0 ? "bounded spin, then sleep" : "sleeps at once: more replica threads than cores");
    std::printf("algbw = bytes / time; busbw = algbw * 2(n-1)/n, as nccl-tests define them%s\n\n",
                wire == DType::bf16 ? " (bytes: the f32 gradients; the wire carries half)" : "");
    std::printf("%10s %12s %6s %12s %12s %12s  %s\n", "bytes", "floats", "iters", "time (us)", "algbw GB/s", "busbw GB/s", "check");
    json rows = json::array();
    std::vector<float> host(max_count);
    bool all_ok = true;
    for (size_t bytes = o.min_bytes; bytes <= o.max_bytes; bytes *= 2) {
        const size_t count = std::max<size_t>(bytes / sizeof(float), 1);
        // correctness: replica r holds r+1 + (i mod 7), so the sum is exact in float (and in bf16
        // up to 256: n <= 12)
        for (int r = 0; r < n; ++r) {
            for (size_t i = 0; i < count; ++i) host[i] = float(r + 1 + int(i % 7));
            devs[r]->copy_to_device(devs[r]->compute_stream(), bufs[r].data(), host.data(), count * sizeof(float));
            devs[r]->synchronize();
        }
        threads.run([&](int r) {
            ops->all_reduce(r, 0, count);
            devs[r]->synchronize();
        });
        bool ok = true;
        for (int r = 0; r < n && ok; ++r) {
            devs[r]->copy_to_host(devs[r]->compute_stream(), host.data(), bufs[r].data(), count * sizeof(float));
            devs[r]->synchronize();
            for (size_t i = 0; i < count && ok; ++i)
                ok = host[i] == float(n * (n + 1) / 2 + n * int(i % 7));
        }
        all_ok = all_ok && ok;
        // timing on zeros (no overflow, no denormals)
        for (int r = 0; r < n; ++r) devs[r]->fill(devs[r]->compute_stream(), count, 0.0f, bufs[r].data());
        for (auto& d : devs) d->synchronize();
        int iters = o.iters > 0 ? o.iters : int(std::clamp<double>(2e9 / double(bytes) / std::max(n, 1), 5, 1000));
        threads.run([&](int r) {
            for (int i = 0; i < 3; ++i) ops->all_reduce(r, 0, count);
            devs[r]->synchronize();
        });
        const double t0 = now_s();
        threads.run([&](int r) {
            for (int i = 0; i < iters; ++i) ops->all_reduce(r, 0, count);
            devs[r]->synchronize();
        });
        const double t = (now_s() - t0) / iters;
        const double algbw = double(count * sizeof(float)) / t / 1e9;
        const double busbw = n > 1 ? algbw * 2.0 * (n - 1) / n : 0.0;
        std::printf("%10s %12zu %6d %12.1f %12.2f %12.2f  %s\n", human_bytes(count * sizeof(float)).c_str(), count, iters,
                    t * 1e6, algbw, busbw, ok ? "ok" : "WRONG");
        rows.push_back({{"bytes", count * sizeof(float)}, {"count", count}, {"iters", iters}, {"time_us", t * 1e6},
                        {"algbw_gbs", algbw}, {"busbw_gbs", busbw}, {"correct", ok}});
    }
    write_json(o.json_path, {{"benchmark", "allreduce"}, {"op", ops->name()}, {"devices", dl.describe()},
                             {"transport", o.transport}, {"dtype", o.dtype}, {"barrier_us", barrier_us},
                             {"replicas", n}, {"device", dl.type == DeviceType::cuda ? devs[0]->description() : cpu_model()},
                             {"results", rows}});
    return all_ok ? kExitOk : kExitFailure;
}

}  // namespace mirrored
