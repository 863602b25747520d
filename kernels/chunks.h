// How a range of `count` elements is split among n replicas for a reduce-scatter: chunk k is
// replica k's, in multiples of 16 bytes of the element type (vector loads); trailing chunks may be
// short or empty when count is small. The cross-device ops, the NCCL backends and the optimizer's
// sharded state all split by it.
#pragma once

#include <algorithm>
#include <cstddef>

#include "kernels/device.h"

namespace mirrored {

struct Chunks {
    size_t count, size;
    Chunks(size_t c, int n, DType t) : count(c) {
        const size_t align = 16 / dtype_size(t);
        size = ((c + size_t(n) - 1) / size_t(n) + align - 1) / align * align;
    }
    size_t begin(int k) const { return std::min(count, size * size_t(k)); }
    size_t length(int k) const { return std::min(count, size * size_t(k + 1)) - begin(k); }
};

}  // namespace mirrored
