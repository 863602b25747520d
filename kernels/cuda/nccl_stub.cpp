// Linked instead of kernels/cuda/nccl_group.cu when the build found no NCCL (it is not part of
// the CUDA toolkit): the nccl op explains how to get it; the ring needs nothing of it.
#include "base/error.h"
#include "kernels/nccl.h"

namespace mirrored {

bool nccl_compiled() { return false; }

std::unique_ptr<NcclGroup> make_cuda_nccl_group(const std::vector<Device*>&) {
    throw ConfigError("strategy.cross_device_ops",
                      "nccl: this build has no NCCL (nccl.h and libnccl were not found "
                      "at build time). Install NVIDIA's libnccl-dev (the CUDA repository) or set NCCL_HOME, then "
                      "rebuild (make clean all); the default ring needs no NCCL");
}

std::string nccl_unique_id() { return {}; }
std::unique_ptr<NcclNodeComm> make_nccl_node_comm(const std::string&, int, int, Device&) {
    throw ConfigError("strategy.devices",
                      "GPUs across nodes exchange gradients over NCCL, but this build has no NCCL "
                      "(nccl.h and libnccl were not found at build time); install libnccl-dev and rebuild");
}

}  // namespace mirrored
