#pragma once
// Internal: the interface between the host code (multi_tensor_step.cc, built by the C++ compiler) and
// the kernels (multi_tensor_kernels.cu, built by nvcc). Plain C++, no CUDA header.
#include <cstddef>

#include "optim/cuda/multi_tensor_step.h"
#include "optim/optimizer_kind.h"

namespace zero::optim::cuda::detail {

inline constexpr int kThreads = 256;                  // threads per block
inline constexpr size_t kChunk = 16 * kThreads;       // elements per block iteration

// One launch: non-empty ranges and the prefix sums of their chunk counts.
struct LaunchParams {
  int num_ranges = 0;
  unsigned long long chunk_begin[kMaxRangesPerLaunch + 1] = {};
  DeviceRange ranges[kMaxRangesPerLaunch];
};

// Launches the kernel for (kind, grad type index 0..2 = fp32/fp16/bf16, state index 0..1 = fp32/bf16,
// out index 0..3 = none/fp32/fp16/bf16) with `grid` blocks on `stream`. Returns the cudaError_t of
// the launch (0 on success).
int launch_step(OptimizerKind kind, int grad, int state, int out, const LaunchParams& params,
                unsigned grid, void* stream);

}  // namespace zero::optim::cuda::detail
