// Between the emulated GPU's kernel launcher (fibers.cpp) and its runtime (runtime.cpp).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
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
int stream_gpu(cudaStream_t s);          // the GPU a stream belongs to (the current one for the default stream)
int gpus();                              // how many emulated GPUs there are
void set_current_device(int device);     // cudaSetDevice for the calling thread, unchecked

// Asynchronous streams (queue.cpp). Eager (the default): work runs when it is issued. Otherwise
// (MIRRORED_CUDA_EMU_ASYNC=newest|random[:SEED]) it is queued after what it depends on and an
// executor thread runs it later, choosing among the ready items the newest or one at random.
enum class QueueOrder { eager, newest, random };
QueueOrder queue_order();
// For the emulator's tests: another order (after every queued item is done); lazy: run items only
// while a host thread waits for some, so that everything issued before the wait is reordered.
void queue_set_order(QueueOrder order, bool lazy);
// Queues `work` for GPU `device` after the items `deps`; its id.
uint64_t queue_issue(int device, std::function<void()> work, std::vector<uint64_t> deps);
// into becomes the items of into and from not done yet, each once (a stream's or event's frontier).
void queue_join(std::vector<uint64_t>& into, const std::vector<uint64_t>& from);
bool queue_done(const std::vector<uint64_t>& ids);
void queue_wait(const std::vector<uint64_t>& ids);
void queue_wait_all();
bool on_queue_executor();  // the calling thread is the executor (running an item)

// A GPU's fault (runtime.cpp): the first error of a kernel found when it ran, or injected by
// MIRRORED_CUDA_EMU_FAULT=G:K (the K-th kernel run on GPU G meets an illegal address). Sticky, as
// on a GPU: every later wait, query, launch or copy on that GPU returns it, and its kernels no
// longer run. cudaSuccess while the GPU is healthy.
void set_fault(int device, cudaError_t e);
cudaError_t fault_of(int device);
void clear_faults();  // for the emulator's tests: every GPU healthy again
// Called by each kernel as it runs on the current GPU: true when it must not run (the GPU has
// failed, or the injected fault is this kernel).
bool kernel_faults();

}  // namespace emu
