#include "kernels/ops/peer_sums.h"

#include <string>
#include <vector>

#include "base/error.h"
#include "kernels/cpu/loop_clones.h"
#include "kernels/op_math.h"

namespace mirrored {

PeerSumKernels peer_sum_cuda;

namespace cpu {
CPU_LOOP_CLONES void sum_into_rows(float* const* ptr, int count, int into, size_t offset, size_t n) {
    host_sum_into(ptr, count, into, offset, n);
}
}  // namespace cpu

void sum_to_all(Device& d, Stream s, const PeerBuffers& b, size_t offset, size_t n, DType t) {
    check_wire_dtype(d, t);
    if (d.runs_cuda_kernels()) return launch_cuda(d, s, peer_sum_cuda.sum_to_all, "sum_to_all", b, offset, n, t);
    run_on_host(d, s, "sum_to_all", [=](const Device&) { host_sum_to_all(b, offset, n, t); });
}

void sum_into(Device& d, Stream s, float* const* buffers, int count, int into, size_t offset, size_t n) {
    const bool cuda = d.runs_cuda_kernels();
    if (count < 1 || (cuda && count > PeerBuffers::kMax) || into < 0 || into >= count)
        throw DeviceError(d.name() + ": sum_into over " + std::to_string(count) + " buffers into buffer " +
                          std::to_string(into) + " (" +
                          (cuda ? "1 to " + std::to_string(PeerBuffers::kMax) : std::string("at least 1")) +
                          " buffers, into one of them)");
    if (cuda) {
        PeerBuffers b;
        for (int k = 0; k < count; ++k) b.ptr[k] = buffers[k];
        b.count = count;
        return launch_cuda(d, s, peer_sum_cuda.sum_into, "sum_into", b, into, offset, n);
    }
    if (!d.asynchronous()) return cpu::sum_into_rows(buffers, count, into, offset, n);
    std::vector<float*> ptrs(buffers, buffers + count);  // the caller's array may not outlive the call
    run_on_host(d, s, "sum_into", [=, ptrs = std::move(ptrs)](const Device&) {
        cpu::sum_into_rows(ptrs.data(), count, into, offset, n);
    });
}

}  // namespace mirrored
