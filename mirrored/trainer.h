// The trainer: one configured run from data to summary, with live progress, evaluation,
// checkpoints, exact resume and signal handling. Exit codes are those of base/error.h.
#pragma once

#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "mirrored/config.h"
#include "mirrored/failover.h"
#include "mirrored/nodes.h"
#include "mirrored/session.h"

namespace mirrored {

// Trains; returns the process exit code (0, or 130 after SIGINT/SIGTERM/SIGUSR1 and a
// checkpoint). Errors are thrown as mirrored::Error with their exit code.
//
// Multi-node (nodes != nullptr): every node runs this with the same configuration (checked);
// node 0 alone writes the run folder - config.yaml, metrics.jsonl, summary.json, checkpoints -
// and prints; every node reads the checkpoint it resumes from (a shared file system). Every
// decision that ends or pauses training (a signal, an evaluation, a checkpoint) is agreed by
// all nodes at the same step. progress: where the header and the status lines go.
//
// failover (strategy.on_replica_failure: continue, one node): `restart` replaces this process
// with one that continues the run on the surviving devices (the CLI: an exec with
// MIRRORED_CONTINUATION set) and returns only when it could not; `continued` says this process is
// such a continuation (its config already names the survivors).
struct Failover {
    std::function<void(const Continuation&)> restart;
    std::optional<Continuation> continued;
};
int run_training(const Config& config, Nodes* nodes = nullptr, std::FILE* progress = stdout,
                 const Failover& failover = {});

// Installs the SIGINT/SIGTERM handlers: the first signal asks the run to stop after the current
// step and a checkpoint; a second one exits at once.
void install_signal_handlers();

}  // namespace mirrored
