#pragma once
// The engine's elementwise kernels on host memory: what the host device runs for convert,
// accumulate, scale, ordered_sum and block_sum_of_squares (memory/device.h), and the reference the
// CUDA kernels (memory/cuda_kernels.cu) reproduce bit for bit.
//
// 16-bit values are widened to fp32 (exactly), the arithmetic is one fp32 operation per element in
// the documented order, and results are rounded to nearest even once on the way back, with the
// conversions of base/dtype.h.
#include <cstddef>

#include "base/dtype.h"

namespace zero::memory::host_kernels {

// Arguments are not checked here: every Device validates them at the call (memory/op_checks.h).

// dst[i] = src[i], converting (a memmove when the dtypes match).
void convert(const void* src, DType src_dtype, void* dst, DType dst_dtype, size_t n);
// Row r of n elements: src + r * src_stride to dst + r * dst_stride (strides in elements), converting.
void convert_rows(const void* src, DType src_dtype, size_t src_stride, void* dst, DType dst_dtype, size_t dst_stride,
                  size_t rows, size_t n);
// dst[i] = dst[i] + src[i] in fp32, rounded once into dst_dtype.
void accumulate(void* dst, DType dst_dtype, const void* src, DType src_dtype, size_t n);
// x[i] = x[i] * factor in fp32.
void scale(void* x, DType dtype, size_t n, float factor);
// out[i] = ((ins[i] + ins[stride + i]) + ins[2 * stride + i]) + ... (k terms, left to right, fp32).
void ordered_sum(const void* ins, DType in_dtype, size_t stride, int k, void* out, DType out_dtype,
                 size_t n);

// The sum of squares of optim::sum_of_squares(x, dtype, n, 1.0f), bit for bit: element i (counted
// from x) goes to double lane i % kSumLanes, each lane sums its squares in element order, and the
// lanes are reduced by the fixed tree w = 8, 4, 2, 1: lane[j] += lane[j + w].
inline constexpr size_t kSumLanes = 16;
double sum_of_squares(const void* x, DType dtype, size_t n);
// out[j] = sum_of_squares(x + j * block elements, dtype, block) for j < blocks.
void block_sum_of_squares(const void* x, DType dtype, size_t block, size_t blocks, double* out);

}  // namespace zero::memory::host_kernels
