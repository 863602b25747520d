#include "mirrored/allreduce_rig.h"

#include <algorithm>

#include "mirrored/util.h"
#include "kernels/ops/flat.h"

namespace mirrored {

AllReduceRig::AllReduceRig(const std::string& devices, const std::string& op, DType wire, size_t max_floats)
    : list(parse_devices(devices)) {
    const int n = int(list.ordinals.size());
    if (!list.traits().gpu) cpu_set_blas_threads(1);
    staged = list.backend->enable_peer_access(list.ordinals);
    std::vector<Device*> dp;
    std::vector<float*> bp;
    for (int r = 0; r < n; ++r) {
        devs.push_back(list.backend->make(list.ordinals[size_t(r)]));
        bufs.emplace_back(*devs.back(), max_floats);
        dp.push_back(devs.back().get());
        bp.push_back(bufs.back().data());
    }
    threads = std::make_unique<ReplicaThreads>(n);
    ops = make_cross_device_ops(op, dp, bp, max_floats, threads->barrier(), wire);
}

void AllReduceRig::zero() {
    for (size_t r = 0; r < devs.size(); ++r)
        fill_floats(*devs[r], devs[r]->compute_stream(), bufs[r].size(), 0.0f, bufs[r].data());
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

double AllReduceRig::median_seconds(size_t floats, int max_iters, int rounds, double round_budget_s) {
    max_iters = std::max(max_iters, 1);
    run(floats, 1);  // warm up: first touches, thread start-up
    // as many iterations as fit the budget (a slow link, or a sanitizer's build, does fewer), from 3
    const int probe = std::min(3, max_iters);
    const double per_iter = run(floats, probe) / probe;
    const int iters =
        per_iter > 0 ? int(std::clamp(round_budget_s / per_iter, double(probe), double(max_iters))) : max_iters;
    std::vector<double> t;
    for (int k = 0; k < std::max(rounds, 1); ++k) t.push_back(run(floats, iters) / iters);
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

}  // namespace mirrored
