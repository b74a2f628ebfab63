#include "memory/host_kernels.h"

#include <algorithm>
#include <cstring>

#include "base/check.h"

namespace zero::memory::host_kernels {
namespace {

// Elements widened per tile: the fp32 scratch (8 KiB per array) lives on the stack of whichever
// thread runs the work (a host stream's worker or the caller).
constexpr size_t kTile = 2048;

const char* at(const void* base, DType dtype, size_t i) {
  return static_cast<const char*>(base) + i * dtype_size(dtype);
}
char* at(void* base, DType dtype, size_t i) { return static_cast<char*>(base) + i * dtype_size(dtype); }

// n <= kTile elements as fp32: `src` itself for fp32, else widened into `tmp`.
const float* widen(const void* src, DType dtype, size_t n, float* tmp) {
  switch (dtype) {
    case DType::kFloat16:
      convert_fp16_to_fp32(static_cast<const uint16_t*>(src), tmp, n);
      return tmp;
    case DType::kBFloat16:
      convert_bf16_to_fp32(static_cast<const uint16_t*>(src), tmp, n);
      return tmp;
    default:
      return static_cast<const float*>(src);
  }
}

void narrow(const float* src, void* dst, DType dtype, size_t n) {
  switch (dtype) {
    case DType::kFloat16: convert_fp32_to_fp16(src, static_cast<uint16_t*>(dst), n); return;
    case DType::kBFloat16: convert_fp32_to_bf16(src, static_cast<uint16_t*>(dst), n); return;
    default:
      if (dst != src) std::memcpy(dst, src, n * sizeof(float));
      return;
  }
}

// Adds the squares of p[0, n) into the lanes, element k into lane k % kSumLanes: callers pass runs
// that start on a whole row of lanes. Every lane is an independent chain, so the compiler may keep
// the lanes in vector registers without reassociating any sum.
void add_squares(double* lanes, const float* p, size_t n) {
  size_t i = 0;
  for (; i + kSumLanes <= n; i += kSumLanes) {
    for (size_t l = 0; l < kSumLanes; ++l) {
      const double v = p[i + l];
      lanes[l] += v * v;  // a float's square is exact in double, so a fused form gives the same bits
    }
  }
  for (; i < n; ++i) {
    const double v = p[i];
    lanes[i % kSumLanes] += v * v;
  }
}

double reduce_lanes(double* lanes) {
  for (size_t w = kSumLanes / 2; w >= 1; w /= 2) {
    for (size_t j = 0; j < w; ++j) lanes[j] += lanes[j + w];
  }
  return lanes[0];
}

static_assert(kTile % kSumLanes == 0, "tiles must hold whole rows of lanes");

}  // namespace

void convert(const void* src, DType src_dtype, void* dst, DType dst_dtype, size_t n) {
  if (src_dtype == dst_dtype) {
    if (src != dst && n > 0) std::memmove(dst, src, n * dtype_size(src_dtype));
    return;
  }
  float tmp[kTile];
  for (size_t i = 0; i < n; i += kTile) {
    const size_t m = std::min(kTile, n - i);
    narrow(widen(at(src, src_dtype, i), src_dtype, m, tmp), at(dst, dst_dtype, i), dst_dtype, m);
  }
}

void convert_rows(const void* src, DType src_dtype, size_t src_stride, void* dst, DType dst_dtype, size_t dst_stride,
                  size_t rows, size_t n) {
  for (size_t r = 0; r < rows; ++r) {
    convert(at(src, src_dtype, r * src_stride), src_dtype, at(dst, dst_dtype, r * dst_stride), dst_dtype, n);
  }
}

void accumulate(void* dst, DType dst_dtype, const void* src, DType src_dtype, size_t n) {
  float a[kTile], b[kTile];
  for (size_t i = 0; i < n; i += kTile) {
    const size_t m = std::min(kTile, n - i);
    float* d = dst_dtype == DType::kFloat32 ? reinterpret_cast<float*>(at(dst, dst_dtype, i)) : a;
    if (dst_dtype != DType::kFloat32) widen(at(dst, dst_dtype, i), dst_dtype, m, a);
    const float* s = widen(at(src, src_dtype, i), src_dtype, m, b);
    for (size_t j = 0; j < m; ++j) d[j] = d[j] + s[j];
    if (dst_dtype != DType::kFloat32) narrow(a, at(dst, dst_dtype, i), dst_dtype, m);
  }
}

void scale(void* x, DType dtype, size_t n, float factor) {
  if (dtype == DType::kFloat32) {
    float* p = static_cast<float*>(x);
    for (size_t i = 0; i < n; ++i) p[i] = p[i] * factor;
    return;
  }
  float a[kTile];
  for (size_t i = 0; i < n; i += kTile) {
    const size_t m = std::min(kTile, n - i);
    widen(at(x, dtype, i), dtype, m, a);
    for (size_t j = 0; j < m; ++j) a[j] = a[j] * factor;
    narrow(a, at(x, dtype, i), dtype, m);
  }
}

void ordered_sum(const void* ins, DType in_dtype, size_t stride, int k, void* out, DType out_dtype,
                 size_t n) {
  ZERO_CHECK_GE(k, 1, "ordered_sum needs at least one input");
  float acc[kTile], tmp[kTile];
  for (size_t i = 0; i < n; i += kTile) {
    const size_t m = std::min(kTile, n - i);
    const float* first = widen(at(ins, in_dtype, i), in_dtype, m, tmp);
    std::memcpy(acc, first, m * sizeof(float));
    for (int q = 1; q < k; ++q) {
      const float* x = widen(at(ins, in_dtype, static_cast<size_t>(q) * stride + i), in_dtype, m, tmp);
      for (size_t j = 0; j < m; ++j) acc[j] = acc[j] + x[j];
    }
    narrow(acc, at(out, out_dtype, i), out_dtype, m);
  }
}

double sum_of_squares(const void* x, DType dtype, size_t n) {
  double lanes[kSumLanes] = {};
  if (dtype == DType::kFloat32) {
    add_squares(lanes, static_cast<const float*>(x), n);
    return reduce_lanes(lanes);
  }
  // 16-bit: widened a tile at a time with base/dtype's vectorized conversions; a tile is a whole
  // number of lane rows, so every element keeps its lane.
  float tmp[kTile];
  for (size_t i = 0; i < n; i += kTile) {
    const size_t m = std::min(kTile, n - i);
    add_squares(lanes, widen(at(x, dtype, i), dtype, m, tmp), m);
  }
  return reduce_lanes(lanes);
}

void block_sum_of_squares(const void* x, DType dtype, size_t block, size_t blocks, double* out) {
  for (size_t j = 0; j < blocks; ++j) out[j] = sum_of_squares(at(x, dtype, j * block), dtype, block);
}

}  // namespace zero::memory::host_kernels
