// Between the emulated GPU's kernel launcher (fibers.cpp) and its runtime (runtime.cpp).
#pragma once

#include <cuda_runtime.h>

#include <string>

namespace emu {

// The launch failed: cudaGetLastError returns `e` once; the reason goes to stderr (a GPU gives
// none, but a test of the emulator should say which rule a kernel broke).
void record_launch_error(cudaError_t e, const std::string& why);
// A launch must go to a stream of the current device (or the legacy default stream).
bool check_launch_stream(cudaStream_t s);

}  // namespace emu
