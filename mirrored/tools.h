// Commands besides train/eval/export: the device report and the benchmarks.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "kernels/device.h"

namespace mirrored {

// `mirrored devices`: GPUs, peer-access matrix, links, versions; or the CPU when there is none.
int print_devices();

struct LoaderBenchOptions {
    std::string config;          // a YAML config whose data section is used; empty: Fashion-MNIST
    std::vector<int> threads{1, 2};
    int batch = 512;
    double seconds = 2.0;        // per measurement
    std::string json_path;
};
int bench_loader(const LoaderBenchOptions& o);

struct AllReduceBenchOptions {
    std::string devices = "auto";
    std::string op = "ring";
    size_t min_bytes = 4096, max_bytes = size_t(64) << 20;
    int iters = 0;               // 0: chosen per size
    std::string transport = "auto";  // CUDA peer reads: auto, direct (peer loads), staged (copy + add)
    std::string dtype = "fp32";      // the wire type: fp32 or bf16 (sizes stay f32 gradient bytes)
    std::string json_path;
};
int bench_allreduce(const AllReduceBenchOptions& o);

struct StepBenchOptions {
    std::string config = "configs/synthetic_mlp.yaml";
    std::vector<std::string> sets;
    std::vector<std::string> devices;  // each measured in turn, e.g. cpu:1 cpu:2
    int steps = 50, warmup = 5;
    int per_replica_batch = 0;  // > 0: global batch = this x replicas (weak scaling)
    std::string json_path;
};
// Training-step throughput of a config for each device list: the scaling test.
int bench_step(const StepBenchOptions& o);

struct GemmBenchOptions {
    std::string device = "cpu";  // cpu (one BLAS thread, as a replica uses) or cuda:N
    std::vector<int> sizes{128, 512, 1024, 2048};  // square m = n = k
    bool tf32 = false;  // shorthand for precision tf32
    Precision precision = Precision::fp32;
    double seconds = 1.0;
    std::string json_path;
};
// The GEMM ceiling a replica's step is measured against.
int bench_gemm(const GemmBenchOptions& o);

}  // namespace mirrored
