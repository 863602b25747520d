// Between the emulated GPU's kernel launcher (fibers.cpp) and its runtime (runtime.cpp).
#pragma once

#include <cuda_runtime.h>

#include <functional>
#include <string>
#include <vector>

namespace emu {

// The launch failed: cudaGetLastError returns `e` once; the reason goes to stderr (a GPU gives
// none, but a test of the emulator should say which rule a kernel broke).
void record_launch_error(cudaError_t e, const std::string& why);
// A launch must go to a stream of the current device (or the legacy default stream).
bool check_launch_stream(cudaStream_t s);

// For the emulated NCCL (nccl.cpp), between it and the runtime:
// A collective over its ranks' streams: run now when none is capturing; when all are captured by
// one graph, one node after every rank's work so far, which each rank's next work waits for.
// Empty, or why it cannot be issued.
std::string submit_collective(const std::vector<cudaStream_t>& streams, std::function<void()> work);
// Empty when [p, p + bytes) lies in memory of GPU `device`; otherwise what it is instead.
std::string device_memory_of(const void* p, size_t bytes, int device, const char* what);
// An element of f32, bf16 or f16 memory as float, and back (rounded to nearest even).
float load(const void* p, cudaDataType t, size_t i);
void store(void* p, cudaDataType t, size_t i, float v);
float rounded(float v, cudaDataType t);  // v as t would hold it
int stream_gpu(cudaStream_t s);  // the GPU a stream belongs to (the current one for the default stream)
int gpus();                      // how many emulated GPUs there are

}  // namespace emu
