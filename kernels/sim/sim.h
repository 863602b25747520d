// Simulated GPUs ("sim:0,1", "sim:0,0,0,0"): a Device with CUDA's semantics on CPU threads, so
// that the asynchronous host logic of the CUDA path (streams, events, cross-device waits, host
// callbacks, pinned copies, communication overlapping backward, failures) runs in every CI build.
//
// What is simulated, and how faithfully:
// - every stream is a worker thread running its queue in order; tasks may be delayed at random;
// - events are versioned as CUDA captures them: a wait enqueued now waits for the record that
//   was the event's latest when the wait was enqueued; waiting on a never-recorded event is a
//   no-op; events may be waited on by streams of other devices;
// - copies from or to pinned memory (alloc_host_bytes) are asynchronous; from pageable memory,
//   host-to-device takes a snapshot before returning and device-to-host returns once done
//   (cudaMemcpyAsync's documented behaviour);
// - fresh device and pinned allocations are filled with NaN (reading unwritten memory shows);
//   freeing device memory waits for the device, as cudaFree does;
// - host callbacks run on the stream's thread, in order;
// - replicas on one simulated GPU share it (kernels load each other's memory); distinct GPUs
//   load each other's memory only after enable_peer_access, else reduce_from_peer is staged;
// - the nccl op has a rendezvous: every rank's all-reduce runs once all ranks reached it;
// - a fault injected on a GPU is sticky like an illegal address: the launch does not run, the
//   GPU's streams stop, and every later host call on it throws; streams of other GPUs waiting for
//   it block until abandoned, as they would on real hardware;
// - the ops themselves are the CPU reference (kernels/cpu).
// Every call the host makes is counted (Device::host_work).
#pragma once

#include <cstdint>

namespace mirrored {

// Knobs, process-wide. Environment variables set them at first use:
//   MIRRORED_SIM_DELAY_US=N   each stream sleeps a random 0..N us before about half its tasks
//   MIRRORED_SIM_FAULT=G:K    the K-th launch (1-based) on simulated GPU G faults (sticky)
//   MIRRORED_SIM_HANG=G:K     the K-th launch on simulated GPU G never finishes (a hung kernel)
//   MIRRORED_SIM_NO_PEER=1    distinct simulated GPUs refuse peer access (the staged path)
//   MIRRORED_SIM_CORRUPT=G:K  the K-th copy simulated GPU G makes from another GPU flips one bit
//                             (a bad link, for the stress test)
void sim_set_delays(int max_us);
void sim_set_peer_access(bool available);
void sim_inject_fault(int ordinal, uint64_t launch);     // sticky, seen asynchronously
void sim_inject_api_error(int ordinal, uint64_t call);   // the call-th host call throws once, not sticky
void sim_inject_corruption(int ordinal, uint64_t copy);  // the copy-th peer copy from now flips a bit
// Clears faults, sticky errors, enabled peer access and counters of every simulated GPU; restores
// the environment's settings. For tests, between cases.
void sim_reset();
uint64_t sim_launches(int ordinal);  // launches executed on simulated GPU `ordinal` so far

}  // namespace mirrored
