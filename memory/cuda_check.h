#pragma once
// ZERO_CUDA_CHECK(expr): evaluates a CUDA runtime call and throws zero::Error naming the file, line,
// the call as written and the CUDA error, unless it returned cudaSuccess. CUDA builds only.
//
// Plain string concatenation (no fmt) so that nvcc-compiled .cu files can include it too.
#include <cuda_runtime.h>

#include <string>

#include "base/error.h"

namespace zero::memory::detail {

[[noreturn]] inline void throw_cuda_error(const char* file, int line, const char* expr,
                                          cudaError_t error) {
  // Clear the (non-sticky) error so a later cudaGetLastError() after a launch does not report it.
  (void)cudaGetLastError();
  throw Error(std::string("CUDA error at ") + file + ":" + std::to_string(line) + ": " + expr +
              ": " + cudaGetErrorString(error) + " (" + cudaGetErrorName(error) + ")");
}

}  // namespace zero::memory::detail

#define ZERO_CUDA_CHECK(expr)                                                              \
  do {                                                                                     \
    const cudaError_t zero_cuda_error_ = (expr);                                           \
    if (zero_cuda_error_ != cudaSuccess) [[unlikely]] {                                    \
      ::zero::memory::detail::throw_cuda_error(__FILE__, __LINE__, #expr, zero_cuda_error_); \
    }                                                                                      \
  } while (0)
