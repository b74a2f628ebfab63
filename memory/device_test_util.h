#pragma once
// Test helpers for the Device tests (host_device_test, cuda_device_test): input patterns with the
// special values that break conversions (NaN with payloads, infinities, subnormals, signed zeros,
// round-to-even ties), scalar references built on base/dtype.h's scalar conversions, and value
// comparison. Header-only, testonly.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "base/dtype.h"

namespace zero::memory::testing {

inline constexpr DType kFloatTypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};
inline constexpr size_t kSizes[] = {0, 1, 7, 1000, 100003};

inline float load(DType t, const void* p, size_t i) {
  switch (t) {
    case DType::kFloat16: return fp16_bits_to_fp32(static_cast<const uint16_t*>(p)[i]);
    case DType::kBFloat16: return bf16_bits_to_fp32(static_cast<const uint16_t*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}

inline void store(DType t, void* p, size_t i, float v) {
  switch (t) {
    case DType::kFloat16: static_cast<uint16_t*>(p)[i] = fp32_to_fp16_bits(v); return;
    case DType::kBFloat16: static_cast<uint16_t*>(p)[i] = fp32_to_bf16_bits(v); return;
    default: static_cast<float*>(p)[i] = v; return;
  }
}

// n elements of `t` as bytes. fp32: values over many binades with specials mixed in; 16-bit types:
// random bit patterns (every class of value appears, NaN payloads included). `finite` replaces
// Inf/NaN by ordinary values (for arithmetic compared across backends whose NaN payloads differ).
inline std::vector<unsigned char> pattern(DType t, size_t n, uint32_t seed, bool finite = false) {
  std::mt19937 rng(seed);
  std::vector<unsigned char> bytes(n * dtype_size(t));
  std::uniform_real_distribution<float> mant(-2.0f, 2.0f);
  std::uniform_int_distribution<int> exp(-30, 30);
  static const float kSpecials[] = {
      0.0f, -0.0f, INFINITY, -INFINITY, NAN, bits_float(0x7fa00001u) /* signalling NaN */,
      bits_float(0xffc12345u), bits_float(0x00000001u) /* smallest subnormal */,
      bits_float(0x80400000u), 65504.0f, 65520.0f /* fp16 overflow tie */, 5.9604645e-08f,
      2.9802322e-08f /* half the smallest fp16 subnormal: a tie to 0 */, 1.0f + 0x1p-11f,
      bits_float(0x3f808000u) /* a bf16 tie */, bits_float(0x3f818000u), 3.0e38f};
  for (size_t i = 0; i < n; ++i) {
    if (t == DType::kFloat32) {
      float v = std::ldexp(mant(rng), exp(rng));
      if (i % 23 == 5) v = kSpecials[(i / 23) % std::size(kSpecials)];
      if (finite && !std::isfinite(v)) v = 1.5f;
      std::memcpy(&bytes[i * 4], &v, 4);
    } else {
      uint16_t h = static_cast<uint16_t>(rng());
      if (finite) {
        const uint16_t exp_mask = t == DType::kFloat16 ? 0x7c00u : 0x7f80u;
        if ((h & exp_mask) == exp_mask) h = static_cast<uint16_t>(h & ~0x4000u);  // halve exponent
      }
      std::memcpy(&bytes[i * 2], &h, 2);
    }
  }
  return bytes;
}

inline bool is_nan(DType t, const void* p, size_t i) {
  switch (t) {
    case DType::kFloat16: {
      const uint16_t h = static_cast<const uint16_t*>(p)[i];
      return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0;
    }
    case DType::kBFloat16: {
      const uint16_t h = static_cast<const uint16_t*>(p)[i];
      return (h & 0x7f80u) == 0x7f80u && (h & 0x7fu) != 0;
    }
    default: return std::isnan(static_cast<const float*>(p)[i]);
  }
}

// Index of the first element whose bits differ (with nan_equal: unless both are NaN), or n.
inline size_t first_difference(DType t, const void* a, const void* b, size_t n, bool nan_equal) {
  const size_t size = dtype_size(t);
  for (size_t i = 0; i < n; ++i) {
    if (std::memcmp(static_cast<const char*>(a) + i * size, static_cast<const char*>(b) + i * size,
                    size) == 0) {
      continue;
    }
    if (nan_equal && is_nan(t, a, i) && is_nan(t, b, i)) continue;
    return i;
  }
  return n;
}

inline size_t first_difference(const double* a, const double* b, size_t n, bool nan_equal) {
  for (size_t i = 0; i < n; ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(double)) == 0) continue;
    if (nan_equal && std::isnan(a[i]) && std::isnan(b[i])) continue;
    return i;
  }
  return n;
}

// The documented sum of squares of one block: element i in double lane i % 16, lanes reduced by the
// tree 8, 4, 2, 1.
inline double reference_sum_of_squares(DType t, const void* x, size_t n) {
  double lanes[16] = {};
  for (size_t i = 0; i < n; ++i) {
    const double v = load(t, x, i);
    lanes[i % 16] += v * v;
  }
  for (size_t w = 8; w >= 1; w /= 2) {
    for (size_t j = 0; j < w; ++j) lanes[j] += lanes[j + w];
  }
  return lanes[0];
}

}  // namespace zero::memory::testing
