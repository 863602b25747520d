// One checking macro per library. A failure throws DeviceError naming the statement, file, line
// and device, so a crash on replica 5 of 8 says which GPU and which call.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <string>

namespace mirrored {

[[noreturn]] void cuda_fail(const char* stmt, const char* what, const char* file, int line, int device);
// The same for a CUDA runtime error: one that is the GPU's own fault (a sticky error such as an
// illegal address, an ECC error, a GPU the driver lost) names the device in the DeviceError, so
// that strategy.on_replica_failure: continue can set it aside; a refused call does not.
[[noreturn]] void cuda_fail(const char* stmt, cudaError_t err, const char* file, int line, int device);

inline const char* cublas_status_string(cublasStatus_t s) {
    switch (s) {
        case CUBLAS_STATUS_NOT_INITIALIZED:
            return "CUBLAS_STATUS_NOT_INITIALIZED";
        case CUBLAS_STATUS_ALLOC_FAILED:
            return "CUBLAS_STATUS_ALLOC_FAILED";
        case CUBLAS_STATUS_INVALID_VALUE:
            return "CUBLAS_STATUS_INVALID_VALUE";
        case CUBLAS_STATUS_ARCH_MISMATCH:
            return "CUBLAS_STATUS_ARCH_MISMATCH";
        case CUBLAS_STATUS_MAPPING_ERROR:
            return "CUBLAS_STATUS_MAPPING_ERROR";
        case CUBLAS_STATUS_EXECUTION_FAILED:
            return "CUBLAS_STATUS_EXECUTION_FAILED";
        case CUBLAS_STATUS_INTERNAL_ERROR:
            return "CUBLAS_STATUS_INTERNAL_ERROR";
        case CUBLAS_STATUS_NOT_SUPPORTED:
            return "CUBLAS_STATUS_NOT_SUPPORTED";
        default:
            return "cuBLAS error";
    }
}

}  // namespace mirrored

#define CUDA_CHECK(device, stmt)                                                                   \
    do {                                                                                           \
        const cudaError_t err_ = (stmt);                                                           \
        if (err_ != cudaSuccess) ::mirrored::cuda_fail(#stmt, err_, __FILE__, __LINE__, (device)); \
    } while (0)

// A result kept in a variable (looked at before it is checked), reported as the call it came from.
#define CUDA_CHECK_AS(device, call, err)                                                        \
    do {                                                                                        \
        const cudaError_t e_ = (err);                                                           \
        if (e_ != cudaSuccess) ::mirrored::cuda_fail((call), e_, __FILE__, __LINE__, (device)); \
    } while (0)

// After every <<<>>> launch: catches bad launch configurations at once.
#define CUDA_LAUNCH_CHECK(device) CUDA_CHECK(device, cudaGetLastError())

// A query (cudaEventQuery, cudaStreamQuery): true when the work is done, false when not yet (that
// answer cleared from the last error); any other answer - a GPU's fault surfacing - throws, naming
// the query.
#define CUDA_QUERY(device, stmt) ::mirrored::cuda_query((stmt), #stmt, __FILE__, __LINE__, (device))

namespace mirrored {
inline bool cuda_query(cudaError_t e, const char* stmt, const char* file, int line, int device) {
    if (e == cudaErrorNotReady) {
        cudaGetLastError();
        return false;
    }
    if (e != cudaSuccess) cuda_fail(stmt, e, file, line, device);
    return true;
}
}  // namespace mirrored

#define CUBLAS_CHECK(device, stmt)                                                                             \
    do {                                                                                                       \
        const cublasStatus_t st_ = (stmt);                                                                     \
        if (st_ != CUBLAS_STATUS_SUCCESS)                                                                      \
            ::mirrored::cuda_fail(#stmt, ::mirrored::cublas_status_string(st_), __FILE__, __LINE__, (device)); \
    } while (0)
