// A session: what a run, an evaluation or a benchmark builds from a config and its data - the
// model checked against the data, the strategy with its replicas, and the loaders - with every
// check that can refuse the combination before anything is allocated (host memory, batch
// statistics, labels against the model's outputs, targets against the loss).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "data/datasets.h"
#include "data/loader.h"
#include "mirrored/config.h"
#include "mirrored/model.h"
#include "mirrored/nodes.h"
#include "mirrored/strategy.h"

namespace mirrored {

// Everything a run needs that follows from the config and the data: the model checked against
// the data, the strategy with its replicas, and the loaders.
struct Session {
    Config cfg;  // with model.input_shape filled in from the data
    std::shared_ptr<const Datasets> data;
    std::unique_ptr<Model> model;
    std::unique_ptr<MirroredStrategy> strategy;
    std::unique_ptr<Loader> train_loader, test_loader;
    // Never throws, also while an error unwinds: waits for the devices (the loaders then wait for
    // their release callbacks) unless a device failed. After a failure the devices are abandoned
    // and the loaders are stopped and deliberately leaked, because a failed device's queued
    // release callbacks may never run, or run late.
    ~Session();
};
// data: already loaded datasets to reuse (else loaded from cfg.data). nodes: the other nodes of
// a multi-node run (this node then loads and trains only its part of every global batch).
std::unique_ptr<Session> make_session(const Config& config, std::shared_ptr<const Datasets> data = nullptr,
                                      bool with_train_loader = true, Nodes* nodes = nullptr);

// model.init_from's weights onto every replica, under the optimizer state they start with.
void load_pretrained_weights(Session& session);

}  // namespace mirrored
