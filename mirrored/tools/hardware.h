// The capacity planner's table of GPUs and links: published figures, each with its source
// (docs/SCALING.md lists them), every one overridable from the command line.
#pragma once

#include <string>
#include <vector>

#include "kernels/device.h"

namespace mirrored {

struct GpuSpec {
    std::string name;         // the --gpu name, e.g. h200
    std::string description;  // e.g. "NVIDIA H200 SXM 141 GB"
    double memory_gib = 0;
    // Peak dense (no sparsity) tensor throughput, TFLOP/s: fp32 (CUDA cores), tf32, bf16 and
    // fp16 with fp32 accumulation.
    double tflops_fp32 = 0, tflops_tf32 = 0, tflops_bf16 = 0, tflops_fp16 = 0;
    double memory_tbs = 0;  // memory bandwidth, TB/s
    std::string link;       // the link it usually comes with (the --link default)
    std::string source;
    double tflops(Precision p) const;
};

struct LinkSpec {
    std::string name;  // the --link name, e.g. nvlink4
    std::string description;
    // What a ring all-reduce achieves per GPU as bus bandwidth (nccl-tests' busbw), GB/s, and
    // the latency of one ring step, us.
    double bus_gbs = 0;
    double latency_us = 0;
    std::string source;
};

// Between nodes: what one node's network (all its NICs together) gives the all-reduce between
// the nodes, GB/s, and the latency of one ring step, us.
struct NetworkSpec {
    std::string name;  // the --network name, e.g. ib-ndr
    std::string description;
    double node_gbs = 0;
    double latency_us = 0;
    std::string source;
};

const std::vector<GpuSpec>& gpu_specs();
const std::vector<LinkSpec>& link_specs();
const std::vector<NetworkSpec>& network_specs();
// By name; an unknown name is a ConfigError (exit 2) listing the known ones.
const GpuSpec& find_gpu(const std::string& name);
const LinkSpec& find_link(const std::string& name);
const NetworkSpec& find_network(const std::string& name);

}  // namespace mirrored
