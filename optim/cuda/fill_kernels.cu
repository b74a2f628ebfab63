// Batched range fill (see fill_kernels.h).
#include "optim/cuda/chunk_ranges.h"
#include <cuda_runtime.h>

#include <cstdint>

#include "optim/cuda/fill_kernels.h"

namespace zero::optim::cuda::detail {
namespace {

template <class T>
__global__ void __launch_bounds__(kFillThreads) fill_kernel(const __grid_constant__ FillParams p) {
  const unsigned long long total = p.chunk_begin[p.num_ranges];
  for (unsigned long long chunk = blockIdx.x; chunk < total; chunk += gridDim.x) {
    const int lo = detail::range_of_chunk(p.chunk_begin, p.num_ranges, chunk);
    const FillRange& r = p.ranges[lo];
    const size_t begin = static_cast<size_t>(chunk - p.chunk_begin[lo]) * kFillChunk;
    const size_t end = begin + kFillChunk < r.n ? begin + kFillChunk : r.n;
    T* out = static_cast<T*>(p.data) + r.begin;
    const T value = static_cast<T>(r.bits);
    for (size_t i = begin + threadIdx.x; i < end; i += kFillThreads) out[i] = value;
  }
}

}  // namespace

int launch_fill(const FillParams& params, unsigned grid, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  if (params.elem_bytes == 4) {
    fill_kernel<uint32_t><<<grid, kFillThreads, 0, s>>>(params);
  } else if (params.elem_bytes == 2) {
    fill_kernel<uint16_t><<<grid, kFillThreads, 0, s>>>(params);
  } else {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  return static_cast<int>(cudaGetLastError());
}

}  // namespace zero::optim::cuda::detail
