// The start-up header of a training run: where it runs (devices, nodes, software), the data, the
// model, precision and memory, the strategy's choices and why, checkpoints and failover.
#pragma once

#include <cstdio>
#include <string>

#include "mirrored/nodes.h"
#include "mirrored/session.h"

namespace mirrored {

// nodes: every node's devices are gathered (a collective: every node calls this), node 0 prints.
// continued_without: the device a continuation runs without ("" for a first process).
void print_run_header(std::FILE* out, const Session& session, Nodes* nodes, const std::string& output_dir,
                      const std::string& continued_without);

}  // namespace mirrored
