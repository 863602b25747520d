// NCCL backend of the cross-device ops: ncclCommInitAll plus grouped ncclAllReduce calls on the
// replicas' communication streams. Built only when the build found nccl.h and libnccl
// (kernels/cuda/nccl_stub.cpp otherwise).
#include <nccl.h>

#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/error.h"
#include "kernels/nccl.h"

#define NCCL_CHECK(device, stmt)                                                                 \
    do {                                                                                         \
        const ncclResult_t r_ = (stmt);                                                          \
        if (r_ != ncclSuccess)                                                                   \
            ::mirrored::cuda_fail(#stmt, ncclGetErrorString(r_), __FILE__, __LINE__, (device));  \
    } while (0)

namespace mirrored {

namespace {

class NcclGroupImpl final : public NcclGroup {
public:
    explicit NcclGroupImpl(const std::vector<Device*>& devices) : devices_(devices) {
        std::vector<int> ordinals;
        for (Device* d : devices) ordinals.push_back(d->ordinal());
        comms_.resize(devices.size());
        NCCL_CHECK(ordinals[0], ncclCommInitAll(comms_.data(), static_cast<int>(comms_.size()), ordinals.data()));
    }
    // Finalize every communicator in one group (each waits for the others' outstanding work),
    // then free them. After abort() they are already gone.
    ~NcclGroupImpl() override {
        if (aborted_) return;
        ncclGroupStart();
        for (ncclComm_t c : comms_)
            if (c) ncclCommFinalize(c);
        ncclGroupEnd();
        for (ncclComm_t c : comms_)
            if (c) ncclCommDestroy(c);
    }

    void all_reduce_sum(const std::vector<void*>& buffers, DType t, size_t count) override {
        if (aborted_) throw DeviceError("nccl: the communicators were aborted after a failure");
        if (count == 0) return;
        check_wire_dtype(*devices_[0], t);
        const ncclDataType_t type = t == DType::bf16 ? ncclBfloat16 : ncclFloat;
        NCCL_CHECK(devices_[0]->ordinal(), ncclGroupStart());
        for (size_t r = 0; r < devices_.size(); ++r) {
            Device* d = devices_[r];
            CUDA_CHECK(d->ordinal(), cudaSetDevice(d->ordinal()));
            NCCL_CHECK(d->ordinal(), ncclAllReduce(buffers[r], buffers[r], count, type, ncclSum, comms_[r],
                                                   static_cast<cudaStream_t>(d->comm_stream().handle)));
        }
        NCCL_CHECK(devices_[0]->ordinal(), ncclGroupEnd());
    }

    void abort() noexcept override {
        if (aborted_) return;
        aborted_ = true;
        for (ncclComm_t& c : comms_)
            if (c) {
                ncclCommAbort(c);  // frees the communicator; its ranks stop waiting for each other
                c = nullptr;
            }
    }

private:
    std::vector<Device*> devices_;
    std::vector<ncclComm_t> comms_;
    bool aborted_ = false;
};

}  // namespace

bool nccl_compiled() { return true; }

std::unique_ptr<NcclGroup> make_cuda_nccl_group(const std::vector<Device*>& devices) {
    return std::make_unique<NcclGroupImpl>(devices);
}

}  // namespace mirrored
