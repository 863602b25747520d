// NCCL backend of the cross-device ops: ncclCommInitAll plus grouped ncclAllReduce calls on the
// replicas' communication streams. Built only when the build found nccl.h and libnccl
// (kernels/cuda/nccl_stub.cpp otherwise).
#include <nccl.h>

#include <cstring>
#include <string>

#include "kernels/cuda/cuda_check.h"
#include "base/error.h"
#include "kernels/nccl.h"

#define NCCL_CHECK(device, stmt)                                                                                   \
    do {                                                                                                           \
        const ncclResult_t r_ = (stmt);                                                                            \
        if (r_ != ncclSuccess) ::mirrored::cuda_fail(#stmt, ncclGetErrorString(r_), __FILE__, __LINE__, (device)); \
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

    // One ncclReduce per chunk, rooted at its owner, for every rank; the non-roots' receive
    // buffer is not written (NCCL ignores it), so the same in-place pointer serves.
    void reduce_scatter_sum(const std::vector<void*>& buffers, const Chunks& chunks) override {
        chunk_collective(buffers, chunks, [this](int r, int root, float* p, size_t n, cudaStream_t s) {
            NCCL_CHECK(devices_[size_t(r)]->ordinal(),
                       ncclReduce(p, p, n, ncclFloat, ncclSum, root, comms_[size_t(r)], s));
        });
    }
    void all_gather(const std::vector<void*>& buffers, const Chunks& chunks) override {
        chunk_collective(buffers, chunks, [this](int r, int root, float* p, size_t n, cudaStream_t s) {
            NCCL_CHECK(devices_[size_t(r)]->ordinal(), ncclBroadcast(p, p, n, ncclFloat, root, comms_[size_t(r)], s));
        });
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
    // call(rank, root, chunk's start in the rank's buffer, length, comm stream) for every rank and
    // every non-empty chunk, all in one group: NCCL runs the chunks' collectives together.
    template <typename Call>
    void chunk_collective(const std::vector<void*>& buffers, const Chunks& chunks, Call call) {
        if (aborted_) throw DeviceError("nccl: the communicators were aborted after a failure");
        const int ranks = int(devices_.size());
        NCCL_CHECK(devices_[0]->ordinal(), ncclGroupStart());
        for (int r = 0; r < ranks; ++r) {
            Device* d = devices_[size_t(r)];
            CUDA_CHECK(d->ordinal(), cudaSetDevice(d->ordinal()));
            const auto stream = static_cast<cudaStream_t>(d->comm_stream().handle);
            for (int k = 0; k < ranks; ++k)
                if (chunks.length(k) > 0)
                    call(r, k, static_cast<float*>(buffers[size_t(r)]) + chunks.begin(k), chunks.length(k), stream);
        }
        NCCL_CHECK(devices_[0]->ordinal(), ncclGroupEnd());
    }

    std::vector<Device*> devices_;
    std::vector<ncclComm_t> comms_;
    bool aborted_ = false;
};

class NcclNodeCommImpl final : public NcclNodeComm {
public:
    NcclNodeCommImpl(const std::string& id, int rank, int ranks, Device& device) : device_(device) {
        ncclUniqueId uid;
        if (id.size() != sizeof uid.internal)
            throw DeviceError("nccl: the communicator id from node 0 has " + std::to_string(id.size()) +
                              " bytes, not " + std::to_string(sizeof uid.internal) +
                              " (another NCCL version on that node?)");
        std::memcpy(uid.internal, id.data(), sizeof uid.internal);
        CUDA_CHECK(device.ordinal(), cudaSetDevice(device.ordinal()));
        NCCL_CHECK(device.ordinal(), ncclCommInitRank(&comm_, ranks, uid, rank));
    }
    ~NcclNodeCommImpl() override {
        if (!comm_) return;
        ncclCommFinalize(comm_);
        ncclCommDestroy(comm_);
    }
    void all_reduce_sum(Stream s, float* data, size_t count) override {
        if (!comm_) throw DeviceError("nccl: the communicator between the nodes was aborted after a failure");
        if (count == 0) return;
        NCCL_CHECK(device_.ordinal(),
                   ncclAllReduce(data, data, count, ncclFloat, ncclSum, comm_, static_cast<cudaStream_t>(s.handle)));
    }
    void abort() noexcept override {
        if (comm_) ncclCommAbort(comm_);
        comm_ = nullptr;
    }

private:
    Device& device_;
    ncclComm_t comm_ = nullptr;
};

}  // namespace

std::string nccl_unique_id() {
    ncclUniqueId uid;
    if (const ncclResult_t r = ncclGetUniqueId(&uid); r != ncclSuccess)
        throw DeviceError(std::string("nccl: ncclGetUniqueId failed: ") + ncclGetErrorString(r));
    return std::string(uid.internal, sizeof uid.internal);
}

std::unique_ptr<NcclNodeComm> make_nccl_node_comm(const std::string& id, int rank, int ranks, Device& device) {
    return std::make_unique<NcclNodeCommImpl>(id, rank, ranks, device);
}

bool nccl_compiled() { return true; }

std::unique_ptr<NcclGroup> make_cuda_nccl_group(const std::vector<Device*>& devices) {
    return std::make_unique<NcclGroupImpl>(devices);
}

}  // namespace mirrored
