// make_nccl_group: the checks every NCCL group needs, then the implementation for the device type;
// shared_nccl_group: one per device list while it is held.
#include "kernels/nccl.h"

#include <map>
#include <mutex>
#include <set>
#include <string>

#include "base/error.h"

namespace mirrored {

std::unique_ptr<NcclGroup> make_nccl_group(const std::vector<Device*>& devices) {
    if (devices.empty()) throw Error(kExitFailure, "nccl: no devices");
    const DeviceType type = devices[0]->type();
    std::set<int> seen;
    for (Device* d : devices) {
        if (d->type() != type || type == DeviceType::cpu)
            throw ConfigError("strategy.cross_device_ops", "nccl needs GPU replicas, got " + d->name() +
                                                               " (use ring or reduce_to_one for CPU replicas)");
        if (!seen.insert(d->ordinal()).second)
            throw ConfigError("strategy.cross_device_ops",
                              "nccl cannot place two replicas on " + d->name() +
                                  " (NCCL allows one rank per GPU); use ring for a device list that repeats a GPU");
    }
    if (type == DeviceType::sim) return make_sim_nccl_group(devices);
    return make_cuda_nccl_group(devices);
}

std::shared_ptr<NcclGroup> shared_nccl_group(const std::vector<Device*>& devices) {
    static std::mutex mu;
    static std::map<std::vector<Device*>, std::weak_ptr<NcclGroup>> groups;
    std::lock_guard<std::mutex> lock(mu);
    std::erase_if(groups, [](const auto& g) { return g.second.expired(); });
    if (auto live = groups[devices].lock()) return live;
    std::shared_ptr<NcclGroup> made = make_nccl_group(devices);
    groups[devices] = made;
    return made;
}

}  // namespace mirrored
