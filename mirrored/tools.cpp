// The device report and the benchmark commands. Benchmarks print a table and write the same
// numbers as JSON; none of them is a test (docs/PERFORMANCE.md records what they measured).
#include "mirrored/tools.h"

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

namespace {

std::string cpu_model() {
    std::ifstream in("/proc/cpuinfo");
    std::string line;
    while (std::getline(in, line))
        if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
    return "unknown CPU";
}

std::string version_str(int v) {
    return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}

void write_json(const std::string& path, const json& j) {
    if (path.empty()) return;
    write_file_atomic(path, j.dump(2) + "\n");
    std::printf("wrote %s\n", path.c_str());
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

}  // namespace

int print_devices() {
    const int n = cuda_device_count();
    std::printf("CPU: %s, %u hardware threads\n", cpu_model().c_str(), std::thread::hardware_concurrency());
    const CudaTopology t = cuda_topology();
    const CudaStatus status = cuda_status();
    if (cuda_compiled()) {
        const std::string nccl = nccl_compiled() ? "NCCL " + std::to_string(t.nccl_version / 10000) + "." +
                                                        std::to_string((t.nccl_version / 100) % 100) + "." +
                                                        std::to_string(t.nccl_version % 100)
                                                 : std::string("no NCCL (the nccl op is unavailable)");
        std::printf("built with CUDA runtime %s, %s; driver %s\n", version_str(t.cuda_runtime_version).c_str(),
                    nccl.c_str(), t.cuda_driver_version ? ("for CUDA " + version_str(t.cuda_driver_version)).c_str() : "none");
    } else {
        std::printf("this is a CPU-only build (nvcc was not found at build time): it cannot use GPUs\n");
        if (std::ifstream("/proc/driver/nvidia/version"))
            std::printf("an NVIDIA driver is loaded: install the CUDA toolkit (nvcc in /usr/local/cuda or CUDA_HOME) "
                        "and rebuild (make clean all) to train on the GPUs\n");
    }
    if (n == 0) {
        std::printf("GPUs: none (%s)\n", status.reason.c_str());
        if (status.state == CudaStatus::State::unusable)
            std::printf("strategy.devices auto -> refused (exit 5): fix the driver, or ask for --devices cpu\n");
        else
            std::printf("strategy.devices auto -> cpu:%u (one CPU replica per core)\n",
                        std::max(1u, std::thread::hardware_concurrency()));
        std::printf("simulated GPUs for tests and debugging: --devices sim:0,1 (kernels/sim/sim.h)\n");
        return kExitOk;
    }
    for (const auto& d : t.devices)
        std::printf("cuda:%d  %s  %.1f GiB  sm_%d%d  %d SMs\n", d.ordinal, d.name.c_str(), d.total_memory / 1073741824.0,
                    d.cc_major, d.cc_minor, d.multiprocessors);
    if (n > 1) {
        std::printf("\npeer access (row reads column; P2P performance rank, lower is faster)\n       ");
        for (int j = 0; j < n; ++j) std::printf(" cuda:%-3d", j);
        std::printf("\n");
        for (int i = 0; i < n; ++i) {
            std::printf("cuda:%-2d", i);
            for (int j = 0; j < n; ++j) {
                if (i == j) std::printf("   -     ");
                else if (t.peer_access[i][j]) std::printf("  yes/%-3d", t.perf_rank[i][j]);
                else std::printf("  no      ");
            }
            std::printf("\n");
        }
        std::printf("\nlinks\n");
        for (int i = 0; i < n; ++i)
            for (int j = i + 1; j < n; ++j) std::printf("cuda:%d <-> cuda:%d  %s\n", i, j, t.link[i][j].c_str());
    } else {
        std::printf("one GPU: several replicas can share it, e.g. --devices cuda:0,0,0,0\n");
    }
    std::printf("strategy.devices auto -> cuda:all (%d replica%s)\n", n, n > 1 ? "s" : "");
    return kExitOk;
}

int bench_loader(const LoaderBenchOptions& o) {
    DataConfig dc;
    std::string base;
    if (!o.config.empty()) {
        const Config c = load_config(o.config, {});
        dc = c.data;
        base = c.base_dir;
    }
    const double t0 = now_s();
    const Datasets data = load_datasets(dc, base, 1);
    const Dataset& ds = data.train;
    if (size_t(o.batch) > ds.count())
        throw ConfigError("--batch " + std::to_string(o.batch) + ": larger than the " + std::to_string(ds.count()) +
                          " training samples of " + ds.name);
    std::printf("dataset %s: %zu samples of %zu floats (loaded and normalised in %.2fs)\n", ds.name.c_str(), ds.count(),
                ds.feature_size(), now_s() - t0);
    std::printf("machine: %s, %u hardware threads; global batch %d\n\n", cpu_model().c_str(),
                std::thread::hardware_concurrency(), o.batch);
    // Ceiling: one thread copying the same bytes sequentially (what a batch costs at best).
    double ceiling_sps = 0;
    {
        const size_t per = ds.feature_size(), batch = size_t(o.batch);
        std::vector<float> dst(batch * per);
        const size_t batches = ds.count() / batch;
        size_t samples = 0, b = 0;
        const double start = now_s();
        double elapsed = 0;
        do {
            std::memcpy(dst.data(), ds.features.data() + (b % batches) * batch * per, batch * per * sizeof(float));
            samples += batch;
            ++b;
            elapsed = now_s() - start;
        } while (elapsed < o.seconds / 2);
        ceiling_sps = samples / elapsed;
        std::printf("ceiling: one thread memcpy of contiguous batches: %.0f samples/s (%.0f MB/s)\n\n", ceiling_sps,
                    ceiling_sps * per * sizeof(float) / 1e6);
    }
    std::printf("%8s %10s %14s %10s %12s\n", "threads", "augment", "samples/s", "MB/s", "of ceiling");
    json rows = json::array();
    const bool images = ds.shape.size() == 3;
    for (bool augment : {false, true}) {
        if (augment && !images) continue;
        for (int threads : o.threads) {
            LoaderOptions lo;
            lo.global_batch = o.batch;
            lo.threads = threads;
            lo.prefetch = std::max(4, 2 * threads);
            if (augment) {
                lo.augment.crop_padding = 2;
                lo.augment.horizontal_flip = true;
            }
            Loader loader(ds, lo);
            loader.start({});
            for (int i = 0; i < 8; ++i) loader.release(loader.next());  // warm up
            size_t samples = 0;
            const double start = now_s();
            double elapsed = 0;
            do {
                const Batch& b = loader.next();
                samples += size_t(b.rows);
                loader.release(b);
                elapsed = now_s() - start;
            } while (elapsed < o.seconds);
            loader.stop();
            const double sps = samples / elapsed;
            const double mbs = sps * ds.feature_size() * sizeof(float) / 1e6;
            std::printf("%8d %10s %14.0f %10.0f %11.0f%%\n", threads, augment ? "crop+flip" : "none", sps, mbs,
                        100 * sps / ceiling_sps);
            rows.push_back({{"threads", threads}, {"augment", augment}, {"samples_per_sec", sps}, {"mb_per_sec", mbs}});
        }
    }
    write_json(o.json_path, {{"benchmark", "loader"}, {"dataset", ds.name}, {"global_batch", o.batch},
                             {"memcpy_ceiling_samples_per_sec", ceiling_sps},
                             {"cpu", cpu_model()}, {"hardware_threads", std::thread::hardware_concurrency()},
                             {"results", rows}});
    return kExitOk;
}

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

int bench_gemm(const GemmBenchOptions& o) {
    std::unique_ptr<Device> d;
    if (o.device == "cpu") {
        cpu_set_blas_threads(1);
        d = make_cpu_device(0);
    } else {
        const DeviceList dl = parse_devices(o.device);
        if (dl.type != DeviceType::cuda || dl.ordinals.size() != 1)
            throw ConfigError("--device: expected cpu or one GPU such as cuda:0, got '" + o.device + "'");
        d = make_cuda_device(dl.ordinals[0]);
    }
    const Precision precision = o.tf32 ? Precision::tf32 : o.precision;
    d->set_precision(precision);
    const DType t = d->value_dtype();
    std::printf("GEMM in %s on %s (%s)\n\n", precision_name(precision), d->name().c_str(),
                d->type() == DeviceType::cpu ? (cpu_model() + ", one BLAS thread").c_str() : d->description().c_str());
    std::printf("%8s %8s %8s %12s %10s\n", "m", "n", "k", "time (us)", "GFLOP/s");
    json rows = json::array();
    for (int size : o.sizes) {
        const size_t n = size_t(size) * size;
        // inputs in the precision's type (filled in f32, then converted), output f32
        DeviceBuffer<float> a32(*d, n), b32(*d, n), c(*d, n);
        DeviceBuffer<unsigned char> a(*d, d->act_bytes(n)), b(*d, d->act_bytes(n));
        const Stream s = d->compute_stream();
        d->fill(s, n, 0.5f, a32.data());
        d->fill(s, n, 0.25f, b32.data());
        d->convert(s, n, a32.data(), DType::f32, a.data(), t);
        d->convert(s, n, b32.data(), DType::f32, b.data(), t);
        auto once = [&] {
            d->gemm(s, false, true, size, size, size, 1.0f, a.data(), size, b.data(), size, 0.0f, c.data(), size,
                    GemmTypes{t, t, DType::f32});
        };
        once();
        d->synchronize();
        int iters = 0;
        const double start = now_s();
        double elapsed = 0;
        do {
            for (int i = 0; i < 10; ++i) once();
            d->synchronize();
            iters += 10;
            elapsed = now_s() - start;
        } while (elapsed < o.seconds);
        const double t = elapsed / iters, gflops = 2.0 * size * size * double(size) / t / 1e9;
        std::printf("%8d %8d %8d %12.1f %10.1f\n", size, size, size, t * 1e6, gflops);
        rows.push_back({{"m", size}, {"n", size}, {"k", size}, {"time_us", t * 1e6}, {"gflops", gflops}});
    }
    write_json(o.json_path, {{"benchmark", "gemm"}, {"device", d->type() == DeviceType::cpu ? cpu_model() : d->description()},
                             {"precision", precision_name(precision)}, {"results", rows}});
    return kExitOk;
}

int bench_step(const StepBenchOptions& o) {
    const Config base = load_config(o.config, o.sets);
    std::vector<std::string> lists = o.devices;
    if (lists.empty()) {
        const DeviceList all = parse_devices("auto");
        const int n = int(all.ordinals.size());
        const char* kind = all.type == DeviceType::cuda ? "cuda:" : "cpu:";
        for (int k = 1; k <= n; k *= 2) {
            std::string spec = kind;
            if (all.type == DeviceType::cuda)
                for (int i = 0; i < k; ++i) spec += (i ? "," : "") + std::to_string(i);
            else spec += std::to_string(k);
            lists.push_back(spec);
            if (k * 2 > n && k != n) k = n / 2;  // end on n
        }
    }
    const double t0 = now_s();
    auto data = std::make_shared<const Datasets>(load_datasets(base.data, base.base_dir, base.run.seed));
    std::printf("config %s: %s, global batch %d; data ready in %.1fs\n\n", o.config.c_str(),
                model_config_summary(base).c_str(), base.train.global_batch_size, now_s() - t0);
    std::printf("%-28s %8s %12s %12s %9s %10s %9s %8s %8s %8s\n", "devices", "replicas", "samples/s", "per replica",
                "speedup", "efficiency", "GFLOP/s", "data%", "compute%", "comm%");
    json rows = json::array();
    double base_sps = 0;
    int base_n = 0;
    for (const auto& spec : lists) {
        Config cfg = base;
        cfg.strategy.devices = spec;
        if (o.per_replica_batch > 0)
            cfg.train.global_batch_size = o.per_replica_batch * int(parse_devices(spec).ordinals.size());
        auto s = make_session(cfg, data, true);
        MirroredStrategy& st = *s->strategy;
        Loader& loader = *s->train_loader;
        st.init_and_broadcast();
        loader.start({});
        const float lr = float(cfg.optimizer.lr);
        for (int i = 0; i < o.warmup; ++i) st.train_step(st.next_batch(loader), i, lr, cfg.run.seed, false);
        st.synchronize();
        TimeSplit split;
        st.collect_timing(split, 0);  // drop warm-up host timings
        split = {};
        const double wait0 = loader.wait_seconds();
        const double start = now_s();
        for (int i = 0; i < o.steps; ++i)
            st.train_step(st.next_batch(loader), o.warmup + i, lr, cfg.run.seed, i == o.steps - 1);
        st.synchronize();
        const double elapsed = now_s() - start;
        st.collect_timing(split, o.steps);
        split.data_wait_s = loader.wait_seconds() - wait0;
        loader.stop();
        const int n = st.replicas();
        const double sps = double(o.steps) * cfg.train.global_batch_size / elapsed;
        const double step_ms = 1e3 * elapsed / o.steps;
        if (base_n == 0) {
            base_sps = sps;
            base_n = n;
        }
        const double speedup = sps / base_sps;
        const double efficiency = speedup / (double(n) / base_n);
        const double busy = std::max(split.data_wait_s + split.compute_s + split.comm_s, 1e-12);
        const double gflops = sps * s->model->train_flops_per_sample() / 1e9;
        std::printf("%-28s %8d %12.0f %12.0f %8.2fx %9.0f%% %9.1f %8.1f %8.1f %8.1f\n", spec.c_str(), n, sps, sps / n,
                    speedup, 100 * efficiency, gflops, 100 * split.data_wait_s / busy, 100 * split.compute_s / busy,
                    100 * split.comm_s / busy);
        rows.push_back({{"devices", spec}, {"replicas", n}, {"global_batch", cfg.train.global_batch_size},
                        {"samples_per_sec", sps}, {"step_ms", step_ms},
                        {"gflops", gflops},
                        {"speedup", speedup}, {"efficiency", efficiency},
                        {"time_split", {{"data_wait_s", split.data_wait_s}, {"compute_s", split.compute_s}, {"comm_s", split.comm_s}}}});
    }
    if (o.per_replica_batch > 0)
        std::printf("\nspeedup and efficiency are relative to the first row; %d samples per replica per step (weak scaling)\n",
                    o.per_replica_batch);
    else
        std::printf("\nspeedup and efficiency are relative to the first row; the global batch is fixed (strong scaling):\n"
                    "--per-replica-batch B scales it with the replicas instead\n");
    write_json(o.json_path, {{"benchmark", "step"}, {"config", o.config}, {"global_batch", base.train.global_batch_size},
                             {"model", model_config_summary(base)}, {"cpu", cpu_model()}, {"results", rows}});
    return kExitOk;
}

}  // namespace mirrored
