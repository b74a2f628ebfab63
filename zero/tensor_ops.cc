#include "zero/tensor_ops.h"

#include <algorithm>
#include <cstring>

#include "base/check.h"

namespace zero {
namespace {

constexpr size_t kTile = 2048;  // fp32 scratch per tile, on the stack (8 KiB)

void check_float(DType t) {
  ZERO_CHECK(t == DType::kFloat32 || t == DType::kFloat16 || t == DType::kBFloat16,
             "dtype {} is not a float type the engine moves", dtype_name(t));
}

// Widens n <= kTile elements to fp32.
const float* widen(const void* src, DType dtype, size_t n, float* tmp) {
  switch (dtype) {
    case DType::kFloat32: return static_cast<const float*>(src);
    case DType::kFloat16: convert_fp16_to_fp32(static_cast<const uint16_t*>(src), tmp, n); return tmp;
    case DType::kBFloat16: convert_bf16_to_fp32(static_cast<const uint16_t*>(src), tmp, n); return tmp;
    default: ZERO_CHECK(false, "unsupported dtype {}", dtype_name(dtype));
  }
  return nullptr;
}

void narrow(const float* src, void* dst, DType dtype, size_t n) {
  switch (dtype) {
    case DType::kFloat32:
      if (dst != src) std::memcpy(dst, src, n * sizeof(float));
      return;
    case DType::kFloat16: convert_fp32_to_fp16(src, static_cast<uint16_t*>(dst), n); return;
    case DType::kBFloat16: convert_fp32_to_bf16(src, static_cast<uint16_t*>(dst), n); return;
    default: ZERO_CHECK(false, "unsupported dtype {}", dtype_name(dtype));
  }
}

}  // namespace

void convert_elements(const void* src, DType src_dtype, void* dst, DType dst_dtype, size_t n) {
  check_float(src_dtype);
  check_float(dst_dtype);
  if (src_dtype == dst_dtype) {
    if (src != dst) std::memmove(dst, src, n * dtype_size(src_dtype));
    return;
  }
  float tmp[kTile];
  for (size_t i = 0; i < n; i += kTile) {
    const size_t m = std::min(kTile, n - i);
    const float* w = widen(element_ptr(src, src_dtype, i), src_dtype, m, tmp);
    narrow(w, element_ptr(dst, dst_dtype, i), dst_dtype, m);
  }
}

void accumulate_elements(void* dst, DType dst_dtype, const void* src, DType src_dtype, size_t n) {
  check_float(src_dtype);
  check_float(dst_dtype);
  float a[kTile], b[kTile];
  for (size_t i = 0; i < n; i += kTile) {
    const size_t m = std::min(kTile, n - i);
    float* d = dst_dtype == DType::kFloat32 ? static_cast<float*>(element_ptr(dst, dst_dtype, i))
                                           : a;
    if (dst_dtype != DType::kFloat32) widen(element_ptr(dst, dst_dtype, i), dst_dtype, m, a);
    const float* s = widen(element_ptr(src, src_dtype, i), src_dtype, m, b);
    for (size_t j = 0; j < m; ++j) d[j] += s[j];
    if (dst_dtype != DType::kFloat32) narrow(a, element_ptr(dst, dst_dtype, i), dst_dtype, m);
  }
}

void ordered_sum(const void* ins, DType in_dtype, size_t stride, int k, void* out, DType out_dtype,
                 size_t n) {
  check_float(in_dtype);
  check_float(out_dtype);
  ZERO_CHECK_GE(k, 1);
  float acc[kTile], tmp[kTile];
  for (size_t i = 0; i < n; i += kTile) {
    const size_t m = std::min(kTile, n - i);
    const float* first = widen(element_ptr(ins, in_dtype, i), in_dtype, m, tmp);
    std::memcpy(acc, first, m * sizeof(float));
    for (int q = 1; q < k; ++q) {
      const float* x = widen(element_ptr(ins, in_dtype, static_cast<size_t>(q) * stride + i),
                             in_dtype, m, tmp);
      for (size_t j = 0; j < m; ++j) acc[j] += x[j];
    }
    narrow(acc, element_ptr(out, out_dtype, i), out_dtype, m);
  }
}

void zero_elements(void* dst, DType dtype, size_t n) { std::memset(dst, 0, n * dtype_size(dtype)); }

}  // namespace zero
