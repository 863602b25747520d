// Hooks between kernels/device.cpp (the backend-neutral entry points) and the backends. Not for
// use outside kernels/.
#pragma once

#include <vector>

#include "kernels/device.h"

namespace mirrored {

std::vector<StagedPair> cuda_enable_peer_access(const std::vector<int>& ordinals);
std::vector<StagedPair> sim_enable_peer_access(const std::vector<int>& ordinals);

}  // namespace mirrored
