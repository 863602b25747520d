#include "mirrored/tools/allreduce_rig.h"

#include <algorithm>

#include "kernels/backends.h"
#include "mirrored/util.h"

namespace mirrored {

AllReduceRig::AllReduceRig(const std::string& devices, const std::string& op, DType wire, size_t max_floats)
    : list(parse_devices(devices)) {
    const int n = int(list.ordinals.size());
    if (list.type != DeviceType::cuda) cpu_set_blas_threads(1);
    staged = enable_peer_access(list.type, list.ordinals);
    std::vector<Device*> dp;
    std::vector<float*> bp;
    for (int r = 0; r < n; ++r) {
        devs.push_back(make_device(list.type, list.type == DeviceType::cpu ? r : list.ordinals[size_t(r)]));
        bufs.emplace_back(*devs.back(), max_floats);
        dp.push_back(devs.back().get());
        bp.push_back(bufs.back().data());
    }
    threads = std::make_unique<ReplicaThreads>(n);
    ops = make_cross_device_ops(op, dp, bp, max_floats, threads->barrier(), wire);
}

void AllReduceRig::zero() {
    for (size_t r = 0; r < devs.size(); ++r) devs[r]->fill(devs[r]->compute_stream(), bufs[r].size(), 0.0f, bufs[r].data());
    for (auto& d : devs) d->synchronize();
}

double AllReduceRig::run(size_t floats, int iters) {
    const double t0 = now_s();
    threads->run([&](int r) {
        for (int i = 0; i < iters; ++i) ops->all_reduce(r, 0, floats);
        devs[size_t(r)]->synchronize();
    });
    return now_s() - t0;
}

double AllReduceRig::median_seconds(size_t floats, int iters, int rounds) {
    run(floats, 1);  // warm up
    std::vector<double> t;
    for (int k = 0; k < std::max(rounds, 1); ++k) t.push_back(run(floats, iters) / iters);
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

}  // namespace mirrored
