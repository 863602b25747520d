// The kinds of device, registered by name with their devices-spec parser and their traits: the
// one place that knows how a CPU replica, a GPU and a simulated GPU differ for the code above
// kernels/ (which asks DeviceTraits instead of comparing types).
#include <algorithm>
#include <set>
#include <thread>

#include "base/error.h"
#include "kernels/backends.h"
#include "kernels/blas.h"
#include "kernels/cpu/gemm_choice.h"
#include "kernels/device.h"
#include "kernels/nccl.h"
#include "kernels/peer_staging.h"

namespace mirrored {

namespace {

// "0,1,3" -> {0, 1, 3}; `example` is a valid spec of the same kind, for the error message.
std::vector<int> parse_int_list(const std::string& list, const std::string& spec, const std::string& example) {
    std::vector<int> out;
    size_t start = 0;
    while (start <= list.size()) {
        const size_t comma = std::min(list.find(',', start), list.size());
        const std::string item = list.substr(start, comma - start);
        if (item.empty() || item.find_first_not_of("0123456789") != std::string::npos)
            throw ConfigError("strategy.devices", "'" + spec + "': expected device numbers like " + example);
        if (item.size() > 6)
            throw ConfigError("strategy.devices", "'" + spec + "': device number " + item + " is out of range");
        out.push_back(std::stoi(item));
        start = comma + 1;
    }
    return out;
}

std::vector<int> first_n(int n) {
    std::vector<int> v;
    for (int i = 0; i < n; ++i) v.push_back(i);
    return v;
}

// "cpu" (one replica per core) or "cpu:N".
std::vector<int> parse_cpu(const std::string& spec, const std::string* tail, const CudaStatus&) {
    if (!tail) return first_n(int(std::max(1u, std::thread::hardware_concurrency())));
    const auto n = parse_int_list(*tail, spec, "cpu:4");
    if (n.size() != 1 || n[0] < 1 || n[0] > 1024)
        throw ConfigError("strategy.devices", "'" + spec + "': expected cpu:N with N replicas, 1 to 1024");
    return first_n(n[0]);
}

void need_gpus(const std::string& spec, const CudaStatus& cuda) {
    if (cuda.state != CudaStatus::State::ok)
        throw DeviceError("strategy.devices: '" + spec + "' asks for GPUs, but " + cuda.reason);
}

// "cuda", "cuda:all" (every visible GPU) or "cuda:0,1,3" (repeats share a GPU).
std::vector<int> parse_cuda(const std::string& spec, const std::string* tail, const CudaStatus& cuda) {
    if (!tail || *tail == "all") {
        need_gpus(spec, cuda);
        return first_n(cuda.devices);
    }
    std::vector<int> o = parse_int_list(*tail, spec, "cuda:0,1,3");
    need_gpus(spec, cuda);
    for (int g : o)
        if (g >= cuda.devices)
            throw DeviceError("strategy.devices: '" + spec + "': there is no cuda:" + std::to_string(g) + " (" +
                              std::to_string(cuda.devices) + " GPU(s) visible)");
    return o;
}

[[noreturn]] void unknown_spec(const std::string& spec) {
    throw ConfigError("strategy.devices",
                      "'" + spec + "': expected auto, cuda, cuda:all, cuda:0,1,..., cpu, cpu:N or sim:0,1,...");
}

// "sim:0,1" (two simulated GPUs) or "sim:0,0,0,0" (four replicas sharing one).
std::vector<int> parse_sim(const std::string& spec, const std::string* tail, const CudaStatus&) {
    if (!tail) unknown_spec(spec);
    std::vector<int> o = parse_int_list(*tail, spec, "sim:0,1 or sim:0,0,0,0");
    for (int g : o)
        if (g >= 64) throw ConfigError("strategy.devices", "'" + spec + "': simulated GPUs are numbered 0 to 63");
    return o;
}

std::vector<StagedPair> no_peers(const std::vector<int>&) { return {}; }

// The CPU backend's per-thread scratches (kernels/cpu/scratch.h), each grown to its largest use,
// by every kernel that may be measured on a product (kernels/cpu/gemm_choice.cpp):
// - the JIT kernels' transposed operand: A [rows, in] of a product with B transposed, at most
//   kCpuTransposedGemmMaxRows rows, or A^T of a weight gradient (at most all the rows by the
//   widest weight row) or of attention's products (positions by positions), at most
//   kCpuJitTransposedMaxFloats (one scratch serves them all);
// - two products of B transposed, turned around (the JIT kernel's and OpenBLAS's), each at most
//   kCpuTransposedGemmMaxRows rows by the widest outputs;
// - the JIT kernel's turned weight gradient, at most kCpuJitTurnedMaxCells;
// - a weight (or attention's keys: positions by inputs) turned around for A B^T: at most
//   kCpuJitSmallWeightFloats, or kCpuJitWeightMaxFloats where a product has more than
//   kCpuTransposedGemmMaxRows rows;
// - per-channel sums and maxima (batchnorm, pooling: kernels/cpu/cnn_loops.h), 32 bytes a channel;
// - where the model convolves, a padded image or output gradient (one image, counted as four of
//   the widest samples), a few-channel weight gradient turned around (a convolution's weight),
//   and a transposed operand of a block of convolution columns.
// A sequence's product rows are its samples' positions, and attention's products have one
// sample's positions as rows; a convolution's, a block of pixels (any count up to the limit).
uint64_t cpu_workspace(const WorkspaceNeeds& n) {
    const uint64_t positions = uint64_t(std::max(n.positions, 1));
    const uint64_t rows = uint64_t(n.micro_rows) * positions;
    uint64_t turned_rows = std::min<uint64_t>(rows, kCpuTransposedGemmMaxRows);
    if (!n.rows_met.empty() && !n.convolutions) {  // the most rows up to the turned kernels' limit
        turned_rows = positions > 1 && positions <= kCpuTransposedGemmMaxRows ? positions : 0;
        for (int r : n.rows_met)
            if (uint64_t(r) * positions <= kCpuTransposedGemmMaxRows)
                turned_rows = std::max(turned_rows, uint64_t(r) * positions);
    }
    const uint64_t weight_row = std::max(n.product.in, n.product.out);
    const uint64_t operand =
        std::max(turned_rows * n.product.in,
                 std::min<uint64_t>(std::max(rows * weight_row, positions * positions), kCpuJitTransposedMaxFloats));
    const uint64_t turned_gradient = std::min<uint64_t>(n.product.in * n.product.out, kCpuJitTurnedMaxCells);
    const uint64_t cap = kCpuTransposedGemmMaxRows;
    const bool many_rows = rows > cap || positions > cap || n.convolutions;  // a convolution's: blocks of pixels
    const uint64_t keys = positions > 1 ? positions * n.product.in : 0;
    const uint64_t turned_weight =
        many_rows ? std::max(n.product.weight, std::min<uint64_t>(keys, kCpuJitWeightMaxFloats))
                  : std::max(n.product.small_weight, std::min<uint64_t>(keys, kCpuJitSmallWeightFloats));
    const uint64_t channels = 32 * weight_row;
    const uint64_t convolving =
        n.convolutions ? (4 * n.widest + n.product.convolution) * sizeof(float) + kCpuColumnBlockBytes : 0;
    return (operand + 2 * turned_rows * n.product.out + turned_gradient + turned_weight) * sizeof(float) + channels +
           convolving;
}
// GPUs (real or simulated): cuBLAS's workspace (and cuBLASLt's for fused epilogues on CUDA), the
// scratch and the peer-staging buffers.
uint64_t gpu_workspace(const WorkspaceNeeds& n) {
    const uint64_t lt = n.fused_epilogues ? uint64_t(32) << 20 : 0;
    return (uint64_t(32) << 20) + lt + (uint64_t(4) << 20) + 2 * PeerStaging::kSliceBytes;
}
// Simulated GPUs allocate the peer-staging buffers alone: their products run the CPU reference
// on the streams' threads, with no cuBLAS workspace or device scratch.
uint64_t sim_workspace(const WorkspaceNeeds&) { return 2 * PeerStaging::kSliceBytes; }

// CPU replicas and the simulated GPUs (which compute with the CPU reference): the BLAS kernel.
std::string cpu_library(bool) { return blas_kernel(); }
std::string no_gemm_choices() { return ""; }
size_t adopt_no_gemm_choices(const std::string&, size_t* recorded) {
    if (recorded) *recorded = 0;
    return 0;
}
std::string cuda_library(bool fused) { return fused ? "cuBLAS, cuBLASLt epilogues" : "cuBLAS"; }

// data.loader_threads: auto. GPU replicas leave the cores to the loader. CPU replicas occupy every
// core and gather their own rows, so the loader only draws sample indices, on the trainer's
// thread: a loader thread would take turns with the replicas (measured on 2 cores: 9.5% more
// samples/s than one loader thread copying whole batches).
const Backend kCpuBackend{.name = "cpu",
                          .type = DeviceType::cpu,
                          .traits = {.display = "CPU",
                                     .asynchronous = false,
                                     .gpu = false,
                                     .one_memory = true,
                                     .replicas_alike = true,
                                     .shares_ordinals = false,
                                     .nccl = false,
                                     .nccl_capturable = false,
                                     .nccl_between_nodes = false,
                                     .stores_16bit = false,
                                     .graphs = false,
                                     .stable_description = false,
                                     .loader_threads = 0,
                                     .column_block_bytes = kCpuColumnBlockBytes,
                                     .fused_epilogues = "ignored: CPU replicas run the ops unfused",
                                     .note = ""},
                          .parse = parse_cpu,
                          .make = make_cpu_device,
                          .enable_peer_access = no_peers,
                          .workspace_bytes = cpu_workspace,
                          .gemm_library = cpu_library,
                          .gemm_choices = gemm_choices_text,
                          .adopt_gemm_choices = adopt_gemm_choices};

const Backend kCudaBackend{
    .name = "cuda",
    .type = DeviceType::cuda,
    .traits = {.display = "CUDA",
               .asynchronous = true,
               .gpu = true,
               .one_memory = false,
               .replicas_alike = false,
               .shares_ordinals = true,
               .nccl = nccl_compiled(),
               .nccl_capturable = true,
               .nccl_between_nodes = true,
               .stores_16bit = true,
               .graphs = true,
               .stable_description = true,
               .loader_threads = 2,
               .column_block_bytes = 0,
               .fused_epilogues = "dense layers' bias and ReLU in the GEMMs (cuBLASLt; not yet measured on a GPU)",
               .note = ""},
    .parse = parse_cuda,
    .make = make_cuda_device,
    .enable_peer_access = cuda_enable_peer_access,
    .workspace_bytes = gpu_workspace,
    .gemm_library = cuda_library,
    .gemm_choices = no_gemm_choices,
    .adopt_gemm_choices = adopt_no_gemm_choices};

// Simulated GPUs run the CPU reference on threads that behave like streams; their NCCL is a
// rendezvous of those threads, which a graph cannot capture.
const Backend kSimBackend{
    .name = "sim",
    .type = DeviceType::sim,
    .traits = {.display = "simulated-GPU",
               .asynchronous = true,
               .gpu = false,
               .one_memory = false,
               .replicas_alike = false,
               .shares_ordinals = true,
               .nccl = true,
               .nccl_capturable = false,
               .nccl_between_nodes = false,
               .stores_16bit = false,
               .graphs = true,
               .stable_description = true,
               .loader_threads = 1,
               .column_block_bytes = 0,
               .fused_epilogues = "the fused cases are counted as one launch, as on CUDA",
               .note = "simulated GPUs test the asynchronous host logic; their speed says nothing about a GPU's"},
    .parse = parse_sim,
    .make = make_sim_device,
    .enable_peer_access = sim_enable_peer_access,
    .workspace_bytes = sim_workspace,
    .gemm_library = cpu_library,
    .gemm_choices = gemm_choices_text,
    .adopt_gemm_choices = adopt_gemm_choices};

}  // namespace

const Registry<Backend>& backends() {
    static const Registry<Backend> all("backend", {&kCpuBackend, &kCudaBackend, &kSimBackend});
    return all;
}

const Backend& backend_of(DeviceType t) {
    for (const Backend* b : backends().entries())
        if (b->type == t) return *b;
    return kCpuBackend;
}

const Backend* find_backend(const std::string& name) { return backends().find(name); }

const DeviceTraits& Device::traits() const { return backend_of(type_).traits; }
bool Device::asynchronous() const { return traits().asynchronous; }
bool Device::supports_graphs() const { return traits().graphs; }
size_t Device::column_block_bytes() const { return traits().column_block_bytes; }
DType Device::act_dtype() const { return traits().stores_16bit ? value_dtype() : DType::f32; }

std::string DeviceList::describe() const {
    std::string s;
    for (size_t i = 0; i < ordinals.size(); ++i)
        s += (i ? "," : "") + std::string(backend->name) + ":" + std::to_string(ordinals[i]);
    return s;
}

size_t DeviceList::distinct() const { return std::set<int>(ordinals.begin(), ordinals.end()).size(); }

DeviceList parse_devices(const std::string& spec, const CudaStatus& cuda) {
    DeviceList d;
    if (spec == "auto") {
        if (cuda.state == CudaStatus::State::unusable)
            throw DeviceError("strategy.devices: auto: GPUs are present but unusable: " + cuda.reason +
                              " (--devices cpu trains on the CPU instead)");
        d.backend = cuda.state == CudaStatus::State::ok ? &kCudaBackend : &kCpuBackend;
        d.ordinals = d.backend->parse(spec, nullptr, cuda);
    } else {
        const size_t colon = spec.find(':');
        const std::string tail = colon == std::string::npos ? "" : spec.substr(colon + 1);
        d.backend = find_backend(spec.substr(0, colon));
        if (!d.backend) unknown_spec(spec);
        d.ordinals = d.backend->parse(spec, colon == std::string::npos ? nullptr : &tail, cuda);
    }
    if (d.ordinals.size() > 1024) throw ConfigError("strategy.devices", "'" + spec + "': at most 1024 replicas");
    return d;
}

}  // namespace mirrored
