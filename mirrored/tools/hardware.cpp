// Figures from the vendors' datasheets and from published nccl-tests results; docs/SCALING.md
// gives each source. TFLOP/s are dense (the datasheets' "with sparsity" figures halved).
#include "mirrored/tools/hardware.h"

#include "base/error.h"

namespace mirrored {

double GpuSpec::tflops(Precision p) const {
    switch (p) {
        case Precision::tf32:
            return tflops_tf32;
        case Precision::bf16:
            return tflops_bf16;
        case Precision::fp16:
            return tflops_fp16;
        default:
            return tflops_fp32;
    }
}

const std::vector<GpuSpec>& gpu_specs() {
    static const std::vector<GpuSpec> specs{
        {"h200", "NVIDIA H200 SXM 141 GB", 141, 67, 494.7, 989.4, 989.4, 4.8, "nvlink4", "NVIDIA H200 datasheet"},
        {"h100", "NVIDIA H100 SXM5 80 GB", 80, 67, 494.7, 989.4, 989.4, 3.35, "nvlink4", "NVIDIA H100 datasheet"},
        {"h100-pcie", "NVIDIA H100 PCIe 80 GB", 80, 51, 378, 756.5, 756.5, 2.0, "pcie5", "NVIDIA H100 datasheet"},
        {"a100-80g", "NVIDIA A100 SXM4 80 GB", 80, 19.5, 156, 312, 312, 2.039, "nvlink3", "NVIDIA A100 datasheet"},
        {"a100-40g", "NVIDIA A100 SXM4 40 GB", 40, 19.5, 156, 312, 312, 1.555, "nvlink3", "NVIDIA A100 datasheet"},
        {"l40s", "NVIDIA L40S 48 GB", 48, 91.6, 183, 362, 362, 0.864, "pcie4", "NVIDIA L40S datasheet"},
        {"rtx4090", "NVIDIA GeForce RTX 4090 24 GB", 24, 82.6, 82.6, 165.2, 165.2, 1.008, "pcie4-host",
         "NVIDIA Ada Lovelace architecture whitepaper, appendix A (fp16/bf16 with fp32 accumulation)"},
    };
    return specs;
}

const std::vector<LinkSpec>& link_specs() {
    static const std::vector<LinkSpec> specs{
        {"nvlink4", "NVLink 4 through NVSwitch (H100/H200 SXM, 900 GB/s per GPU both ways)", 370, 1.0,
         "nccl-tests all_reduce busbw, 8x H100, ring: about 370 GB/s (NVIDIA/nccl-tests issues 212, 309)"},
        {"nvlink3", "NVLink 3 through NVSwitch (A100 SXM, 600 GB/s per GPU both ways)", 233, 1.0,
         "nccl-tests all_reduce busbw, 8x A100: about 233 GB/s (NVIDIA/nccl-tests issue 175)"},
        {"pcie5", "PCIe 5.0 x16 with peer-to-peer (63 GB/s each way)", 50, 3.0,
         "PCI-SIG rate; 80% of it assumed achievable"},
        {"pcie4", "PCIe 4.0 x16 with peer-to-peer (31.5 GB/s each way)", 25, 3.0,
         "PCI-SIG rate; 80% of it assumed achievable"},
        {"pcie3", "PCIe 3.0 x16 with peer-to-peer (15.8 GB/s each way)", 12.6, 3.0,
         "PCI-SIG rate; 80% of it assumed achievable"},
        {"pcie5-host", "PCIe 5.0 x16, no peer-to-peer (consumer GPUs: through host memory)", 28, 3.0,
         "NCCL all_reduce busbw, 8x RTX 5090: about 28 GB/s (NVIDIA/nccl issue 1639)"},
        {"pcie4-host", "PCIe 4.0 x16, no peer-to-peer (consumer GPUs: through host memory)", 14, 3.0,
         "half of pcie5-host (assumed: half the link rate)"},
    };
    return specs;
}

const std::vector<NetworkSpec>& network_specs() {
    static const std::vector<NetworkSpec> specs{
        {"eth-100", "100 Gb/s Ethernet with RoCE, one NIC per node", 10, 10,
         "IEEE 802.3 line rate 12.5 GB/s; 80% assumed achievable"},
        {"eth-200", "200 Gb/s Ethernet with RoCE, one NIC per node", 20, 10,
         "IEEE 802.3 line rate 25 GB/s; 80% assumed achievable"},
        {"eth-400", "400 Gb/s Ethernet with RoCE, one NIC per node", 40, 8,
         "IEEE 802.3 line rate 50 GB/s; 80% assumed achievable"},
        {"ib-hdr", "InfiniBand HDR 200 Gb/s, one NIC per node", 22.5, 5,
         "IBTA line rate 25 GB/s; 90% assumed achievable (NCCL over InfiniBand)"},
        {"ib-ndr", "InfiniBand NDR 400 Gb/s, one NIC per node", 45, 5,
         "IBTA line rate 50 GB/s; 90% assumed achievable (NCCL over InfiniBand)"},
        {"ib-ndr-x8", "8 x InfiniBand NDR 400 Gb/s per node, one per GPU (DGX H100/H200 compute fabric)", 360, 5,
         "NVIDIA DGX H100/H200 user guide: eight ConnectX-7 400 Gb/s ports; 90% assumed achievable"},
    };
    return specs;
}

namespace {

template <typename Spec>
const Spec& find_spec(const std::vector<Spec>& specs, const std::string& name, const char* flag) {
    std::string known;
    for (const Spec& s : specs) {
        if (s.name == name) return s;
        known += (known.empty() ? "" : ", ") + s.name;
    }
    throw ConfigError(std::string(flag) + ": unknown '" + name + "' (known: " + known +
                      "; or give the figures with the override flags)");
}

}  // namespace

const GpuSpec& find_gpu(const std::string& name) { return find_spec(gpu_specs(), name, "--gpu"); }
const LinkSpec& find_link(const std::string& name) { return find_spec(link_specs(), name, "--link"); }
const NetworkSpec& find_network(const std::string& name) { return find_spec(network_specs(), name, "--network"); }

}  // namespace mirrored
