// The step loop the benchmarks time (bench-step, scale, plan's local step): one session, warm-up
// steps, then timed steps with the real loader, the real all-reduce and the update.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/device.h"
#include "mirrored/strategy.h"
#include "mirrored/session.h"

namespace mirrored {

class Watchdog;

struct TimedSteps {
    std::vector<double> step_s;  // seconds per step of each group, timed to a device synchronisation
    double elapsed_s = 0;        // all the timed steps
    TimeSplit split;             // where the time went, from each group's last step (the one sampled)
    HostWork host_work;          // what the host issued in the timed steps, all replicas together
    int64_t steps_run = 0;       // warm-up and timed: the number of the next step
};

// A session ready to be timed: replicas initialised and identical, the train loader started.
// watchdog (may be null) watches the start-up.
std::unique_ptr<Session> start_timed_session(const Config& cfg, std::shared_ptr<const Datasets> data,
                                             Watchdog* watchdog);

// `warmup` steps, then `steps` in groups of `group` (the last group may be shorter), each group
// timed to a device synchronisation; every step ticks the watchdog. sample: each group's last
// step is sampled for the time split (on a GPU that is an uncaptured step with timing events).
// The loader keeps running (a layer profile may follow).
TimedSteps time_steps(Session& s, int warmup, int steps, int group, Watchdog* watchdog, bool sample = true);

}  // namespace mirrored
