// MIRRORED_HD marks the functions both backends share: __host__ __device__ under nvcc, plain
// inline elsewhere, so one definition of each formula serves the CPU reference and the kernels.
#pragma once

#if defined(__CUDACC__)
#define MIRRORED_HD __host__ __device__ __forceinline__
#else
#define MIRRORED_HD inline
#endif
