// The emulated GPU's cub::BlockReduce (tests/cuda_emu/README.md): CUB's own header is device
// code for nvcc, so the emulated build finds this one first. It keeps the part of CUB's contract
// the backend relies on, and fails a launch that breaks it:
// - a 1-D block of exactly BLOCK_DIM_X threads;
// - every thread of the block calls Sum or Reduce (it is a barrier);
// - the TempStorage is not reused before a __syncthreads: the storage remembers the barrier its
//   last use ended at, and a use that finds no barrier since fails, whatever order the threads
//   run in;
// and the result is valid in thread 0 only: the others get NaN bytes. Each thread stores its value
// in the storage and thread 0 combines them after a barrier, in thread order, not in CUB's tree:
// the CUDA kernels' results are compared with the CPU reference within a tolerance, never bit for
// bit with a GPU's.
#pragma once

#include <cstdint>
#include <cstring>

namespace cub {

template <typename T, int BLOCK_DIM_X>
class BlockReduce {
public:
    struct TempStorage {
        T values[BLOCK_DIM_X];
        uint64_t used;              // kUsed once a reduction has used it in this block (else shared memory's garbage)
        uint64_t ended_at_barrier;  // the barrier generation its last reduction ended at
    };

    explicit BlockReduce(TempStorage& storage) : storage_(storage) {}

    template <typename ReductionOp>
    T Reduce(T input, ReductionOp op) {
        const dim3 block = ::emu::block_dim();
        if (block.x != unsigned(BLOCK_DIM_X) || block.y != 1 || block.z != 1)
            ::emu::kernel_fail("cub::BlockReduce in a block of another shape than its BLOCK_DIM_X threads");
        if (storage_.used == kUsed && storage_.ended_at_barrier == ::emu::barrier_generation())
            ::emu::kernel_fail("cub::BlockReduce's TempStorage reused without a __syncthreads after its last use");
        const unsigned t = ::emu::thread_idx().x;
        if (t < unsigned(BLOCK_DIM_X)) storage_.values[t] = input;
        ::emu::syncthreads();
        storage_.used = kUsed;
        storage_.ended_at_barrier = ::emu::barrier_generation();
        T out;
        if (t != 0) {
            std::memset(static_cast<void*>(&out), 0xff, sizeof out);
            return out;
        }
        out = storage_.values[0];
        for (int i = 1; i < BLOCK_DIM_X; ++i) out = op(out, storage_.values[i]);
        return out;
    }

    T Sum(T input) {
        return Reduce(input, [](const T& a, const T& b) { return a + b; });
    }

private:
    static constexpr uint64_t kUsed = 0x6375625f75736564ull;  // "cub_used"
    TempStorage& storage_;
};

}  // namespace cub
