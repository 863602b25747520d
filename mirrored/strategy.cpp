#include "mirrored/strategy.h"

namespace mirrored {

// The parts in the order their device calls ran in one constructor before (the simulated device's
// fault tests count them): the replicas, then the step's ops, joins and graphs.
MirroredStrategy::MirroredStrategy(const StrategyConfig& cfg, const Model& model, const OptimizerConfig& opt,
                                   int global_batch, int accumulation_steps, Nodes* nodes, const LossConfig& loss,
                                   const std::vector<int>& batches)
    : set_(std::make_unique<ReplicaSet>(cfg, model, opt, global_batch, accumulation_steps, nodes,
                                        label_bytes(loss, model.output_classes(), model.output_positions()), batches)),
      step_(std::make_unique<TrainingStep>(*set_, loss)),
      state_(std::make_unique<ReplicaState>(*set_)) {}

// The devices are idle (or abandoned) before the step's graphs and ops go, and those before the
// replicas' buffers and threads.
MirroredStrategy::~MirroredStrategy() {
    set_->shutdown();
    state_.reset();
    step_.reset();
    set_.reset();
}

void MirroredStrategy::train_step(const Batch& batch, int64_t step, float lr, uint64_t seed, bool sample_timing) {
    step_->train_step(batch, step, lr, seed, sample_timing);
    const int every = set_->config().verify_every_steps;
    if (every > 0 && (step + 1) % every == 0) state_->verify_replicas();
}

}  // namespace mirrored
