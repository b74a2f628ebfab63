#pragma once
// The host kernels of memory/block_quantization.h's format (what the host device runs, and the
// reference the CUDA kernels reproduce bit for bit). Internal to memory/.
#include <cstddef>
#include <cstdint>

#include "base/cpu.h"
#include "base/dtype.h"
#include "memory/block_quantization.h"

namespace zero::memory::host_kernels {

// The segment of src[0, n) (fp32, fp16 or bf16) at `segment` (q.segment_bytes(n) bytes). Returns
// how many elements were not finite. On the CPU's best SIMD path (base/cpu.h), or the one given:
// every path writes the same bytes.
uint64_t quantize_blocks(const void* src, DType src_dtype, size_t n, const BlockQuantization& q, void* segment);
uint64_t quantize_blocks(const void* src, DType src_dtype, size_t n, const BlockQuantization& q, void* segment,
                         SimdPath path);
// Row r of `rows` segments of n elements each (segment r at segments + r * segment_stride bytes)
// into dst + r * dst_stride elements (fp32, fp16 or bf16).
void dequantize_rows(const void* segments, size_t segment_stride, size_t rows, size_t n, const BlockQuantization& q,
                     void* dst, DType dst_dtype, size_t dst_stride);
void dequantize_rows(const void* segments, size_t segment_stride, size_t rows, size_t n, const BlockQuantization& q,
                     void* dst, DType dst_dtype, size_t dst_stride, SimdPath path);

}  // namespace zero::memory::host_kernels
