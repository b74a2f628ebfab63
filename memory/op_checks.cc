#include "memory/op_checks.h"

#include <fmt/format.h>

#include <cstdint>
#include <string>

#include "base/check.h"

namespace zero::memory::op_checks {

void float_dtype(DType dtype, const char* device, const char* op) {
  if (dtype != DType::kFloat32 && dtype != DType::kFloat16 && dtype != DType::kBFloat16) {
    ZERO_THROW(InvalidArgument, "{} {}: dtype must be fp32, fp16 or bf16 (got {})", device, op,
               dtype_name(dtype));
  }
}

void pointer(const void* p, size_t bytes, const char* device, const char* op, const char* what) {
  if (p == nullptr && bytes > 0) {
    ZERO_THROW(InvalidArgument, "{} {}: {} is null with {} bytes to access", device, op, what, bytes);
  }
}

size_t bytes_of(size_t n, DType dtype, const char* device, const char* op) {
  size_t bytes = 0;
  if (__builtin_mul_overflow(n, dtype_size(dtype), &bytes)) {
    ZERO_THROW(InvalidArgument, "{} {}: {} elements of {} overflow the byte size", device, op, n,
               dtype_name(dtype));
  }
  return bytes;
}

void ordered_sum(int k, size_t stride, size_t n, DType in_dtype, const char* device) {
  if (k < 1) ZERO_THROW(InvalidArgument, "{} ordered_sum: k must be >= 1 (got {})", device, k);
  if (k > 1 && stride < n) {
    ZERO_THROW(InvalidArgument, "{} ordered_sum: stride {} is shorter than n {}: the inputs overlap",
               device, stride, n);
  }
  size_t last = 0;
  if (__builtin_mul_overflow(static_cast<size_t>(k - 1), stride, &last) ||
      __builtin_add_overflow(last, n, &last)) {
    ZERO_THROW(InvalidArgument, "{} ordered_sum: {} inputs of stride {} overflow", device, k, stride);
  }
  bytes_of(last, in_dtype, device, "ordered_sum");
}

RowExtents rows(size_t rows, size_t n, size_t src_stride, DType src_dtype, size_t dst_stride, DType dst_dtype,
                const char* device) {
  if (rows > 1 && (src_stride < n || dst_stride < n)) {
    ZERO_THROW(InvalidArgument, "{} convert_rows: strides {} and {} must be at least n {}: the rows overlap", device,
               src_stride, dst_stride, n);
  }
  auto extent = [&](size_t stride, DType dtype) {
    size_t last = 0;
    if (rows > 0 && (__builtin_mul_overflow(rows - 1, stride, &last) || __builtin_add_overflow(last, n, &last))) {
      ZERO_THROW(InvalidArgument, "{} convert_rows: {} rows of stride {} overflow", device, rows, stride);
    }
    return rows == 0 ? 0 : bytes_of(last, dtype, device, "convert_rows");
  };
  return {extent(src_stride, src_dtype), extent(dst_stride, dst_dtype)};
}

QuantizedExtents quantized(size_t rows, size_t n, const BlockQuantization& q, size_t segment_stride, DType dtype,
                           size_t element_stride, const char* device, const char* op) {
  const std::string what = fmt::format("{} {}", device, op);
  check_block_quantization(q, what.c_str());
  float_dtype(dtype, device, op);
  // The segment of n elements must be computable (its scales and codes), before strides compare to it.
  if (n > (SIZE_MAX - 8) / sizeof(float)) ZERO_THROW(InvalidArgument, "{}: {} elements overflow a segment", what, n);
  const size_t segment = q.segment_bytes(n);
  if (rows > 1 && (segment_stride < segment || element_stride < n)) {
    ZERO_THROW(InvalidArgument,
               "{}: strides {} (bytes; a segment of {} elements is {}) and {} (elements) are too short: the rows "
               "overlap",
               what, segment_stride, n, segment, element_stride);
  }
  // (rows - 1) strides and one last row.
  auto extent = [&](size_t stride, size_t last_row) {
    size_t last = 0;
    if (rows > 0 && (__builtin_mul_overflow(rows - 1, stride, &last) || __builtin_add_overflow(last, last_row, &last))) {
      ZERO_THROW(InvalidArgument, "{}: {} rows of stride {} overflow", what, rows, stride);
    }
    return rows == 0 ? 0 : last;
  };
  return {extent(segment_stride, segment), bytes_of(extent(element_stride, n), dtype, device, op)};
}

}  // namespace zero::memory::op_checks
