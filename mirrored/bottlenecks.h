// What keeps the replicas from computing over a log interval, as the trainer's alerts say it:
// the input pipeline, an all-reduce not hidden behind backward, or GPUs waiting for the host.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace mirrored {

struct IntervalLoad {
    double data_share = 0, comm_share = 0;  // of the replicas' busy time (data wait + compute + comm)
    double device_step_s = 0;               // one sampled step's device time (GPUs, real or simulated; 0 on CPUs)
    double wall_step_s = 0;                 // the interval's wall time per step
    double loader_batch_s = 0;              // one loader thread's time to fill a batch (0: not measured)
    // what the advice names: the settings to change and their values now
    int loader_threads = 0, prefetch = 0;
    double bucket_mb = 0;
};

struct Bottleneck {
    std::string kind;     // input-bound | communication-bound | gpu-idle
    std::string message;  // the measurement and what to change
};

// The thresholds: more than 10% of the time waiting for data, more than 30% in exposed
// communication, GPUs idle more than 30% of a step.
std::vector<Bottleneck> find_bottlenecks(const IntervalLoad& load);

// What the trainer alerts on: a bottleneck found in `intervals` log intervals in a row. One slow
// interval - a VM's noisy neighbour, a checkpoint's disk flush, a share that hovers at its
// threshold - is not something a setting fixes.
class SustainedBottlenecks {
public:
    explicit SustainedBottlenecks(int intervals = 2) : intervals_(intervals) {}
    // This interval's findings that were also found in the intervals - 1 before it; the message
    // is this interval's.
    std::vector<Bottleneck> update(const IntervalLoad& load);

private:
    int intervals_;
    std::map<std::string, int> streak_;  // kind -> intervals in a row it was found, up to now
};

}  // namespace mirrored
