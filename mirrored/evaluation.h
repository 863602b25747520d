// The `eval` command's work: a checkpoint (or model.init_from's weights as they are) scored on
// the test split, optionally with the inputs and logits written for a check outside mirrored.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "mirrored/config.h"

namespace mirrored {

struct EvalResult {
    double loss = 0, accuracy = 0;
    size_t samples = 0;
    int64_t step = 0;
};
// Optionally also writes the first `limit` test samples (normalised, NHWC) and the model's logits
// for them as .npy files: what scripts/check_export_pytorch.py feeds an equivalent PyTorch model.
struct EvalDump {
    std::string inputs, logits;  // .npy paths ("" = not written)
    size_t limit = 0;            // 0: every test sample
    bool force = false;          // may replace a checkpoint or a run folder's file (base/output.h)
};
EvalResult evaluate_checkpoint(const Config& config, const std::string& checkpoint, const EvalDump& dump = {});

}  // namespace mirrored
