// What `mirrored plan` measures on this machine (plan_measure.cpp): the training set - its shape,
// size and how fast one loader thread reads it - and one local step of the model on synthetic data
// of its shape: its time, the device's GEMM ceiling and the kernels a step launches.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "mirrored/config.h"
#include "mirrored/tools/tools.h"

namespace mirrored {

struct TrainSet {
    std::vector<int> shape;
    size_t samples = 0;
    std::string name;               // the data measured
    double samples_per_thread = 0;  // 0: not measured (the data cannot be read here)
    std::string why_not;
};
// The training set of cfg; `count`: its size is needed (else a model.input_shape makes unreadable
// data only a note).
TrainSet train_set(const Config& cfg, bool count);

struct LocalStep {
    double seconds = 0;     // one step at `rows`
    double gemm_flops = 0;  // this device's GEMM ceiling, FLOP/s
    uint64_t launches = 0;  // per step, counted on a simulated GPU
    std::string device;
};
// One step of the model at `at` on one local device (cuda:0 where there is one, else cpu:1), and
// its launches on a simulated GPU.
LocalStep measure_local(const Config& base, const std::vector<int>& shape, int classes, const LocalShape& at);

}  // namespace mirrored
