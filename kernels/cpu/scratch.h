// The CPU kernels' per-thread scratch: thread_local vectors grown to their largest use and never
// shrunk, so that a step allocates nothing once its shapes have been seen. Every growth is counted
// for the calling thread (cpu_thread_scratch_bytes, kernels/device.h): a CPU replica's thread runs
// its kernels, so its measured memory includes what they hold.
#pragma once

#include <cstddef>
#include <vector>

namespace mirrored {

void note_thread_scratch(size_t bytes);  // this thread's scratch grew by this much

// s holding at least n elements (their values kept, new ones value-initialised).
template <typename T>
T* grow_scratch(std::vector<T>& s, size_t n) {
    if (s.size() < n) {
        const size_t before = s.capacity();
        s.reserve(n);  // exactly n: resize alone may double, past what the workspace plan bounds
        s.resize(n);
        if (s.capacity() > before) note_thread_scratch((s.capacity() - before) * sizeof(T));
    }
    return s.data();
}

}  // namespace mirrored
