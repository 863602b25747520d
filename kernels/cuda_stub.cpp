// Linked instead of kernels/cuda/ when the build found no nvcc: every CUDA entry point reports
// that the backend was not compiled in.
#include "kernels/device.h"
#include "kernels/error.h"
#include "kernels/nccl.h"

namespace mirrored {

bool cuda_compiled() { return false; }
int cuda_device_count() { return 0; }
std::string cuda_unavailable_reason() { return "this build has no CUDA backend (nvcc was not found)"; }
std::unique_ptr<Device> make_cuda_device(int ordinal) {
    throw DeviceError("cuda:" + std::to_string(ordinal) + ": " + cuda_unavailable_reason());
}
CudaTopology cuda_topology() { return {}; }
std::vector<std::pair<int, int>> cuda_enable_peer_access(const std::vector<int>&) { return {}; }
void cuda_set_peer_transport(PeerTransport) {}
bool nccl_compiled() { return false; }
std::unique_ptr<NcclGroup> make_nccl_group(const std::vector<Device*>&) {
    throw ConfigError("strategy.cross_device_ops: nccl needs the CUDA backend; " + cuda_unavailable_reason());
}

}  // namespace mirrored
