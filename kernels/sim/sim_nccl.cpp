// The simulated NCCL: every rank's collective runs on its comm stream once all ranks reached it;
// the last rank to arrive builds the result for all, in rank order - the same bits everywhere.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "base/error.h"
#include "kernels/chunks.h"
#include "kernels/nccl.h"
#include "kernels/op_math.h"
#include "kernels/sim/sim_internal.h"

namespace mirrored {

namespace {

class SimNcclGroup final : public NcclGroup {
public:
    explicit SimNcclGroup(const std::vector<Device*>& devices) {
        for (Device* d : devices) devices_.push_back(d);
    }
    void all_reduce_sum(const std::vector<void*>& buffers, DType t, size_t count) override {
        check_wire_dtype(*devices_[0], t);
        rendezvous("ncclAllReduce", Collective::all_reduce, buffers, t, Chunks(count, 1, t));
    }
    // The halves sum and copy as all_reduce_sum does - in rank order, the last rank to arrive for
    // everyone - and each rank takes its own chunk of the sum (reduce-scatter) or every chunk
    // from its owner (all-gather): the same bits as the whole all-reduce.
    void reduce_scatter_sum(const std::vector<void*>& buffers, const Chunks& chunks) override {
        rendezvous("ncclReduce", Collective::reduce_scatter, buffers, DType::f32, chunks);
    }
    void all_gather(const std::vector<void*>& buffers, const Chunks& chunks) override {
        rendezvous("ncclBroadcast", Collective::all_gather, buffers, DType::f32, chunks);
    }
    void abort() noexcept override {
        aborted_ = true;
        {
            std::lock_guard<std::mutex> lock(sim::world_mutex());
            for (auto& w : live_)
                if (auto rz = w.lock()) rz->aborted = true;
        }
        sim::world_wakeup().notify_all();
    }

private:
    enum class Collective { all_reduce, reduce_scatter, all_gather };
    struct Rendezvous {
        int ranks = 0, arrived = 0;
        bool ready = false, aborted = false;
        std::vector<char> sum;  // f32 elements or bf16: the sum, or the gathered chunks
    };
    // Each rank's comm stream meets the others'; the last to arrive builds the result for all.
    void rendezvous(const char* api, Collective kind, const std::vector<void*>& buffers, DType t,
                    const Chunks& chunks) {
        if (aborted_) throw DeviceError("nccl: the communicators were aborted");
        const size_t count = chunks.count;
        if (count == 0) return;
        const size_t element = dtype_size(t), bytes = count * element;
        auto rz = std::make_shared<Rendezvous>();
        rz->ranks = int(devices_.size());
        {
            std::lock_guard<std::mutex> lock(sim::world_mutex());
            live_.erase(std::remove_if(live_.begin(), live_.end(), [](auto& w) { return w.expired(); }), live_.end());
            live_.push_back(rz);
        }
        // rank k's chunk in bytes: [begin, end)
        auto chunk_bytes = [chunks, element](size_t k) {
            return std::pair<size_t, size_t>{chunks.begin(int(k)) * element,
                                             (chunks.begin(int(k)) + chunks.length(int(k))) * element};
        };
        for (size_t r = 0; r < devices_.size(); ++r) {
            sim::launch_collective(*devices_[r], api, [=](const std::function<bool()>& dropping) {
                std::unique_lock<std::mutex> lock(sim::world_mutex());
                if (++rz->arrived == rz->ranks) {  // the last rank builds the result: bit-identical everywhere
                    if (kind == Collective::all_gather) {
                        rz->sum.resize(bytes);
                        for (size_t k = 0; k < buffers.size(); ++k) {
                            const auto [b, e] = chunk_bytes(k);
                            std::memcpy(rz->sum.data() + b, static_cast<const char*>(buffers[k]) + b, e - b);
                        }
                    } else {  // the sum in rank order
                        const char* first = static_cast<const char*>(buffers[0]);
                        rz->sum.assign(first, first + bytes);
                        for (size_t q = 1; q < buffers.size(); ++q) host_peer_add(rz->sum.data(), buffers[q], t, count);
                    }
                    rz->ready = true;
                    sim::world_wakeup().notify_all();
                } else {
                    sim::world_wakeup().wait(lock, [&] { return rz->ready || rz->aborted || dropping(); });
                }
                if (!rz->ready) return;
                lock.unlock();
                if (kind == Collective::reduce_scatter) {
                    const auto [b, e] = chunk_bytes(r);
                    std::memcpy(static_cast<char*>(buffers[r]) + b, rz->sum.data() + b, e - b);
                } else {
                    std::memcpy(buffers[r], rz->sum.data(), bytes);
                }
            });
        }
    }
    std::vector<Device*> devices_;
    std::vector<std::weak_ptr<Rendezvous>> live_;  // guarded by sim::world_mutex()
    std::atomic<bool> aborted_{false};
};

}  // namespace

std::unique_ptr<NcclGroup> make_sim_nccl_group(const std::vector<Device*>& devices) {
    return std::make_unique<SimNcclGroup>(devices);
}

}  // namespace mirrored
