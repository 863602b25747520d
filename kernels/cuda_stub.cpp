// Linked instead of kernels/cuda/ when the build found no nvcc: every CUDA entry point reports
// that the backend was not compiled in.
#include "kernels/backends.h"
#include "kernels/device.h"
#include "base/error.h"
#include "kernels/nccl.h"

namespace mirrored {

bool cuda_compiled() { return false; }
CudaStatus cuda_status() {
    CudaStatus s;
    s.state = CudaStatus::State::not_compiled;
    s.reason = "this build has no CUDA backend (nvcc was not found at build time)";
    return s;
}
int cuda_device_count() { return 0; }
std::string cuda_unavailable_reason() { return cuda_status().reason; }
std::unique_ptr<Device> make_cuda_device(int ordinal) {
    throw DeviceError("cuda:" + std::to_string(ordinal) + ": " + cuda_unavailable_reason());
}
CudaTopology cuda_topology() { return {}; }
CudaVersions cuda_versions() { return {}; }
uint64_t cuda_free_memory(int) { return 0; }
std::vector<StagedPair> cuda_enable_peer_access(const std::vector<int>&) { return {}; }
bool nccl_compiled() { return false; }
std::unique_ptr<NcclGroup> make_cuda_nccl_group(const std::vector<Device*>&) {
    throw ConfigError("strategy.cross_device_ops", "nccl needs the CUDA backend; " + cuda_unavailable_reason());
}

std::string nccl_unique_id() { return {}; }
std::unique_ptr<NcclNodeComm> make_nccl_node_comm(const std::string&, int, int, Device&) {
    throw ConfigError("strategy.devices", "GPUs across nodes need the CUDA backend; " + cuda_unavailable_reason());
}

}  // namespace mirrored
