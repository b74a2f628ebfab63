#pragma once
// Argument checks every Device runs at the call of a stream-ordered operation, so that a bad
// argument throws there, on the caller's thread, and never fails later inside a stream's work (where
// it would only surface at the next synchronize, far from its cause).
#include <cstddef>

#include "base/dtype.h"
#include "memory/block_quantization.h"

namespace zero::memory::op_checks {

// InvalidArgument naming the device and the operation unless dtype is fp32, fp16 or bf16.
void float_dtype(DType dtype, const char* device, const char* op);
// InvalidArgument if `p` is null while `bytes` > 0.
void pointer(const void* p, size_t bytes, const char* device, const char* op, const char* what);
// The element-count arguments of ordered_sum: k >= 1 and, for k > 1, stride >= n (the k inputs do not
// overlap); the byte sizes must not overflow.
void ordered_sum(int k, size_t stride, size_t n, DType in_dtype, const char* device);
// The arguments of convert_rows: with rows > 1 each stride at least n (rows do not overlap); the
// extents must not overflow. Returns the bytes the source and the destination span.
struct RowExtents {
  size_t src_bytes = 0, dst_bytes = 0;
};
RowExtents rows(size_t rows, size_t n, size_t src_stride, DType src_dtype, size_t dst_stride, DType dst_dtype,
                const char* device);
// The arguments of quantize_blocks (rows = 1, stride unused) and dequantize_rows: a valid
// quantization, a float dtype, with rows > 1 a segment stride of at least one segment and a
// destination stride of at least n; the extents must not overflow. Returns the bytes the segments
// and the elements span.
struct QuantizedExtents {
  size_t segment_bytes = 0, element_bytes = 0;
};
QuantizedExtents quantized(size_t rows, size_t n, const BlockQuantization& q, size_t segment_stride, DType dtype,
                           size_t element_stride, const char* device, const char* op);
// n * dtype_size(dtype) must not overflow; returns it.
size_t bytes_of(size_t n, DType dtype, const char* device, const char* op);

}  // namespace zero::memory::op_checks
