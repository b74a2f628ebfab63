#include "memory/op_checks.h"

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

}  // namespace zero::memory::op_checks
