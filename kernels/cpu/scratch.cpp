#include "kernels/cpu/scratch.h"

#include <cstdint>

#include "kernels/device.h"

namespace mirrored {

namespace {
thread_local uint64_t scratch_bytes = 0;
}

void note_thread_scratch(size_t bytes) { scratch_bytes += bytes; }
uint64_t cpu_thread_scratch_bytes() { return scratch_bytes; }

}  // namespace mirrored
