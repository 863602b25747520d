#include "mirrored/bottlenecks.h"

#include <cmath>

#include "mirrored/util.h"

namespace mirrored {

namespace {

std::string percent(double share) { return std::to_string(int(100 * share)) + "%"; }

}  // namespace

std::vector<Bottleneck> find_bottlenecks(const IntervalLoad& l) {
    std::vector<Bottleneck> found;
    const bool input_bound = l.data_share > 0.10;
    if (input_bound) {
        // The threads that keep up: a batch's loader time over the step's time without the wait.
        std::string need;
        const double busy_step_s = l.wall_step_s * (1.0 - l.data_share);
        const int threads = busy_step_s > 0 ? int(std::ceil(l.loader_batch_s / busy_step_s - 1e-9)) : 0;
        if (l.loader_batch_s > 0 && threads > l.loader_threads)  // a number only where it says raise
            need = ": a batch takes a loader thread " + number_str(1e3 * l.loader_batch_s) + " ms, a step without " +
                   "the wait " + number_str(1e3 * busy_step_s) + " ms, so about " + std::to_string(threads) +
                   " threads keep up";
        found.push_back({"input-bound", percent(l.data_share) +
                                            " of step time waits for data: raise data.loader_threads (now " +
                                            std::to_string(l.loader_threads) + need + ") or data.prefetch (now " +
                                            std::to_string(l.prefetch) + ")"});
    }
    if (l.comm_share > 0.30)
        found.push_back(
            {"communication-bound", percent(l.comm_share) +
                                        " of step time is communication not hidden behind "
                                        "compute: use a larger per-replica batch or tune strategy.bucket_mb (now " +
                                        decimal_text(l.bucket_mb) + ")"});
    // The GPUs idle when a step takes longer on the clock than on the device: the host cannot
    // issue work fast enough (launch-bound), or waits for data.
    if (l.device_step_s > 0 && l.wall_step_s > 0) {
        const double idle = 1.0 - l.device_step_s / l.wall_step_s;
        if (idle > 0.30)
            found.push_back({"gpu-idle", percent(idle) + " of each step the GPUs wait for the host (" +
                                             number_str(1e6 * l.device_step_s) + " us of device work per " +
                                             number_str(1e6 * l.wall_step_s) +
                                             " us step): a larger per-replica batch amortises launches" +
                                             (input_bound ? "; data loading is also slow" : "")});
    }
    return found;
}

std::vector<Bottleneck> SustainedBottlenecks::update(const IntervalLoad& load) {
    std::map<std::string, int> streak;
    std::vector<Bottleneck> sustained;
    for (Bottleneck& b : find_bottlenecks(load)) {
        const auto it = streak_.find(b.kind);
        const int n = (it == streak_.end() ? 0 : it->second) + 1;
        streak[b.kind] = n;
        if (n >= intervals_) sustained.push_back(std::move(b));
    }
    streak_ = std::move(streak);  // a kind not found this interval starts over
    return sustained;
}

}  // namespace mirrored
