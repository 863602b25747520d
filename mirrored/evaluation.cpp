#include "mirrored/evaluation.h"

#include <algorithm>
#include <vector>

#include "base/output.h"
#include "mirrored/checkpoint.h"
#include "mirrored/session.h"
#include "mirrored/watchdog.h"

namespace mirrored {

namespace {

// A float32 array in NumPy's .npy format (version 1.0), where the user named it (base/output.h).
void write_npy(const OutputTarget& target, const std::vector<size_t>& shape, const float* data) {
    std::string dims;
    size_t count = 1;
    for (size_t d : shape) {
        dims += std::to_string(d) + ", ";
        count *= d;
    }
    std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + dims + "), }";
    while ((10 + header.size() + 1) % 64) header += ' ';
    header += '\n';
    std::string out = std::string("\x93NUMPY\x01\x00", 8);
    out += char(header.size() & 0xff);
    out += char(header.size() >> 8);
    out += header;
    out.append(reinterpret_cast<const char*>(data), count * sizeof(float));
    write_output(target, out);
}

}  // namespace

EvalResult evaluate_checkpoint(const Config& config, const std::string& checkpoint, const EvalDump& dump) {
    // a GPU that stops answering ends the evaluation as it ends a training run (exit 5), not in a
    // process that waits forever
    const auto watchdog =
        step_timeout_watchdog(config.strategy.step_timeout_s, "start-up (loading data, building the replicas)",
                              "the evaluation did not finish: run it again");
    auto s = make_session(config, nullptr, false);
    CheckpointData d;
    if (checkpoint.empty()) {  // the pretrained weights of model.init_from, as they are
        if (watchdog) watchdog->phase("loading the weights of model.init_from", 0);
        s->strategy->init_and_broadcast();
        load_pretrained_weights(*s);
    } else {
        d = read_checkpoint(checkpoint, *s->model, model_config_hash(s->cfg), model_config_summary(s->cfg));
        if (watchdog) watchdog->phase("loading the checkpoint onto the replicas", 0);
        s->strategy->upload_state(d.params, d.optimizer);
    }
    if (watchdog) watchdog->phase("the evaluation", 0);
    const Metrics m = s->strategy->evaluate(*s->test_loader);
    if (watchdog) watchdog->phase("writing --dump-inputs / --dump-logits", 0);
    if (!dump.inputs.empty() || !dump.logits.empty()) {
        const Dataset& test = s->data->test;
        const size_t n = dump.limit ? std::min(dump.limit, test.count()) : test.count();
        std::vector<size_t> shape{n};
        for (int dim : test.shape) shape.push_back(size_t(dim));
        std::vector<float> scratch;
        const float* inputs = first_features(test, n, scratch);
        if (!dump.inputs.empty())
            write_npy({"--dump-inputs", dump.inputs, dump.force, {{"the checkpoint", checkpoint}}}, shape, inputs);
        if (!dump.logits.empty()) {
            const auto logits = s->strategy->predict(inputs, n);
            write_npy({"--dump-logits", dump.logits, dump.force, {{"the checkpoint", checkpoint}}},
                      {n, size_t(s->model->output_features())}, logits.data());
        }
    }
    return {m.loss(), m.accuracy(), size_t(m.count), d.step};
}

}  // namespace mirrored
