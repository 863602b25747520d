// The emulated GPU's cub::BlockReduce (tests/cuda_emu/README.md): CUB's own header is device
// code for nvcc, so the emulated build finds this one first. It keeps the part of CUB's contract
// the backend relies on, and fails a launch that breaks it:
// - a 1-D block of exactly BLOCK_DIM_X threads;
// - every thread of the block calls Sum or Reduce (it is a barrier);
// - the result is valid in thread 0 only: the others get NaN bytes;
// - the TempStorage is not reused before a __syncthreads: each thread stores its value in it and
//   thread 0 combines them after a barrier, so a thread writing its next value before thread 0
//   has read (the fibers' alternating order gives that) changes the result.
// The combining order is the threads', not CUB's tree: the CUDA kernels' results are compared
// with the CPU reference within a tolerance, never bit for bit with a GPU's.
#pragma once

#include <cstring>

namespace cub {

template <typename T, int BLOCK_DIM_X>
class BlockReduce {
public:
    struct TempStorage {
        T values[BLOCK_DIM_X];
    };

    explicit BlockReduce(TempStorage& storage) : storage_(storage) {}

    template <typename ReductionOp>
    T Reduce(T input, ReductionOp op) {
        const dim3 block = ::emu::block_dim();
        if (block.x != unsigned(BLOCK_DIM_X) || block.y != 1 || block.z != 1)
            ::emu::kernel_fail("cub::BlockReduce in a block of another shape than its BLOCK_DIM_X threads");
        const unsigned t = ::emu::thread_idx().x;
        if (t < unsigned(BLOCK_DIM_X)) storage_.values[t] = input;
        ::emu::syncthreads();
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
    TempStorage& storage_;
};

}  // namespace cub
