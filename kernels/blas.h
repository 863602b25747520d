// Which BLAS kernel the CPU backend runs, and choosing it by measurement.
//
// OpenBLAS (DYNAMIC_ARCH, as distributions build it) picks its kernel from the CPU's model
// number when it loads. A CPU newer than the library falls back to an older kernel: OpenBLAS
// 0.3.21 runs Zen 5 on its AVX2 Haswell kernel (half the AVX-512 kernel's rate) and some Xeons on
// the generic Prescott kernel (a fifth of it). The kernel can only be chosen before the library
// initialises (OPENBLAS_CORETYPE), so:
//
//   1. choose_blas_kernel(argv) runs first in main. If the CPU supports a better kernel than the
//      one loaded, it measures each candidate in a child process of this binary (sgemm GFLOP/s,
//      and every result checked against a double-precision reference), keeps the fastest
//      correct one, caches the choice per machine, and re-executes the process with
//      OPENBLAS_CORETYPE set to it. Nothing happens when the loaded kernel is already the best
//      candidate or with MIRRORED_BLAS_AUTO=0; an OPENBLAS_CORETYPE in the environment (machine
//      images set one) is only where the choice starts.
//   2. After the re-exec the kernel is checked once more against the reference on start-up; a
//      wrong result re-executes once more without the override.
#pragma once

#include <string>
#include <vector>

namespace mirrored {

// Runs the probe instead of main when this process is a probe child; otherwise may re-execute
// the process (never returns then). Call before any thread starts.
void choose_blas_kernel(char** argv);

// "OpenBLAS 0.3.21, kernel SkylakeX (chosen by mirrored: 231 GFLOP/s, OpenBLAS's own Haswell
// 124); JIT GEMMs libxsmm 1.17, cpx)": library, version, kernel, how it was chosen, and
// the JIT kernels where they are in use (kernels/cpu/jit_gemm.h).
std::string blas_description();
// "OpenBLAS 0.3.21": the library and its version.
std::string blas_library();
// The CPU's model name from /proc/cpuinfo ("unknown CPU" where there is none).
std::string cpu_model_name();
// The kernels that decide a result's bits: the core name, e.g. "SkylakeX", and the JIT GEMMs'
// library where they are in use, and how each product's kernel is chosen ("SkylakeX + libxsmm
// 1.17, cpx, measured per product"; nothing added where the static rules choose).
std::string blas_kernel();
// The JIT part of a blas_kernel() ("libxsmm 1.17, cpx, measured per product") split into its
// kernels and the MIRRORED_JIT_GEMM value that chooses each product's kernel as it says ("measure").
struct JitGemmChoice {
    std::string kernels, env_value;
};
JitGemmChoice split_jit_gemm_choice(const std::string& jit);

// The machine, the library build and the kernels in use: a choice measured under another key is
// not reused (the per-product GEMM kernels, kernels/cpu/gemm_choice.h).
std::string blas_machine_key();

// bench-gemm --sweep: one row-major product C[m,n] = op(A) op(B) on fresh operands, each CPU
// kernel that can multiply it timed for about `seconds` (kernels/cpu/gemm_choice.h), the fastest
// of them, and the one the static rules would run.
struct GemmKernelRate {
    std::string kernel;  // one of cpu_gemm_kernel_names()
    double gflops = 0;
};
// Every CPU GEMM kernel's name, in the order they are timed: "openblas", "openblas-turned", ...
std::vector<std::string> cpu_gemm_kernel_names();
struct GemmSweepPoint {
    std::vector<GemmKernelRate> rates;
    std::string fastest, rules;
};
GemmSweepPoint sweep_cpu_gemm(bool ta, bool tb, int m, int n, int k, double seconds);

// The core's single-precision peak as a register-only FMA loop reaches it (the widest vectors it
// has: AVX-512, AVX2 or SSE), GFLOP/s on one thread: the ceiling a product's rate is read against.
double cpu_fma_peak_gflops(double seconds);

// The probe's measurement in this process: sgemm GFLOP/s at one thread, or a negative number
// when a result differs from the reference.
double blas_probe_gflops();

}  // namespace mirrored
