#pragma once
// Internal: the interface between cuda_optimizer.cc (C++ compiler) and fill_kernels.cu (nvcc): a
// batched fill of element ranges of one array with per-range bit patterns, used to set Adagrad's
// initial accumulator per parameter group. Plain C++, no CUDA header.
#include <cstddef>
#include <cstdint>

namespace zero::optim::cuda::detail {

inline constexpr int kFillThreads = 256;
inline constexpr size_t kFillChunk = 16 * kFillThreads;  // elements per block iteration
// Ranges per launch: keeps FillParams (about 2 KB) under the classic 4 KB parameter limit.
inline constexpr int kMaxFillRanges = 64;

struct FillRange {
  size_t begin = 0;   // first element of the array
  size_t n = 0;       // elements (> 0)
  uint32_t bits = 0;  // the value's bits: fp32, or bf16 in the low 16 bits
};

struct FillParams {
  void* data = nullptr;
  int elem_bytes = 4;  // 4 or 2
  int num_ranges = 0;
  unsigned long long chunk_begin[kMaxFillRanges + 1] = {};  // prefix sums of the ranges' chunks
  FillRange ranges[kMaxFillRanges];
};

// Launches the fill with `grid` blocks on `stream` (a cudaStream_t) of the current device; returns
// the cudaError_t of the launch (0 on success).
int launch_fill(const FillParams& params, unsigned grid, void* stream);

}  // namespace zero::optim::cuda::detail
