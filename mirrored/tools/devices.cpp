// `mirrored devices`: GPUs, peer access, links and versions, or the CPU when there is none.
#include "mirrored/tools/tools.h"

#include "kernels/blas.h"

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
#include "base/error.h"
#include "kernels/nccl.h"
#include "mirrored/util.h"
#include "mirrored/checkpoint.h"
#include "mirrored/config.h"
#include "mirrored/cross_device_ops.h"
#include "mirrored/nodes.h"
#include "mirrored/replica_threads.h"
#include "mirrored/strategy.h"
#include "mirrored/session.h"

namespace mirrored {

using json = nlohmann::json;

int print_devices() {
    const int n = cuda_device_count();
    std::printf("CPU: %s, %u hardware threads\nBLAS: %s\n", cpu_model_name().c_str(),
                std::thread::hardware_concurrency(), blas_description().c_str());
    if (Nodes::available())
        std::printf("nodes: %s; several machines: mpirun -np NODES -H host1,host2 mirrored train CONFIG\n",
                    Nodes::library().c_str());
    else std::printf("nodes: this build has no MPI (libopenmpi-dev): one machine only\n");
    const CudaTopology t = cuda_topology();
    const CudaStatus status = cuda_status();
    if (cuda_compiled()) {
        const CudaVersions v = cuda_versions();
        const std::string nccl =
            nccl_compiled() ? "NCCL " + nccl_version_text(v.nccl) : std::string("no NCCL (the nccl op is unavailable)");
        std::printf("built with CUDA runtime %s, %s; driver %s\n", cuda_version_text(v.runtime).c_str(), nccl.c_str(),
                    v.driver ? ("for CUDA " + cuda_version_text(v.driver)).c_str() : "none");
    } else {
        std::printf("this is a CPU-only build (nvcc was not found at build time): it cannot use GPUs\n");
        if (std::ifstream("/proc/driver/nvidia/version"))
            std::printf(
                "an NVIDIA driver is loaded: install the CUDA toolkit (nvcc in /usr/local/cuda or CUDA_HOME) "
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
        std::printf("cuda:%d  %s  %.1f GiB  sm_%d%d  %d SMs\n", d.ordinal, d.name.c_str(),
                    d.total_memory / 1073741824.0, d.cc_major, d.cc_minor, d.multiprocessors);
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

}  // namespace mirrored
