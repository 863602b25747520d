#include "mirrored/tools/timed_steps.h"

#include <algorithm>

#include "data/loader.h"
#include "mirrored/config.h"
#include "mirrored/util.h"
#include "mirrored/watchdog.h"

namespace mirrored {

std::unique_ptr<Session> start_timed_session(const Config& cfg, std::shared_ptr<const Datasets> data,
                                             Watchdog* watchdog) {
    if (watchdog) watchdog->phase("start-up (building the replicas)", 0);
    auto s = make_session(cfg, std::move(data), true);
    s->strategy->init_and_broadcast();
    s->train_loader->start({});
    return s;
}

TimedSteps time_steps(Session& s, int warmup, int steps, int group, Watchdog* watchdog, bool sample) {
    MirroredStrategy& st = *s.strategy;
    Loader& loader = *s.train_loader;
    const float lr = float(s.cfg.optimizer.lr);
    const uint64_t seed = s.cfg.run.seed;
    TimedSteps t;
    auto step = [&](bool sampled) {
        st.train_step(st.next_batch(loader), t.steps_run++, lr, seed, sampled);
        if (watchdog) watchdog->tick(0);
    };
    if (watchdog) watchdog->phase("the steps", 0);
    for (int i = 0; i < warmup; ++i) step(false);
    st.synchronize();
    st.collect_timing(t.split, 0);  // drops the warm-up's host timings
    t.split = {};
    const double wait0 = loader.wait_seconds();
    const HostWork work0 = st.host_work().all;
    const double start = now_s();
    group = std::max(group, 1);
    for (int done = 0; done < steps; done += group) {
        const int k = std::min(group, steps - done);
        const double t0 = now_s();
        for (int i = 0; i < k; ++i) step(sample && i == k - 1);
        st.synchronize();
        t.step_s.push_back((now_s() - t0) / k);
    }
    t.elapsed_s = now_s() - start;
    t.host_work = st.host_work().all - work0;
    if (sample) st.collect_timing(t.split, steps);
    t.split.data_wait_s = loader.wait_seconds() - wait0;
    return t;
}

}  // namespace mirrored
