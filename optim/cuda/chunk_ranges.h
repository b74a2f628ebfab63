#pragma once
// nvcc only (device code): the range of a multi-range launch that holds a given chunk (multi_tensor_kernels.cu and
// fill_kernels.cu lay their ranges out the same way: chunk_begin holds the prefix sums of the
// ranges' chunk counts).
namespace zero::optim::cuda::detail {

// The last r with chunk_begin[r] <= chunk (ranges are non-empty).
__device__ inline int range_of_chunk(const unsigned long long* chunk_begin, int num_ranges,
                                     unsigned long long chunk) {
  int lo = 0, hi = num_ranges - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (chunk_begin[mid] <= chunk) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

}  // namespace zero::optim::cuda::detail
