#pragma once
// Element types and 16-bit float conversion.
//
// fp16 and bf16 values are stored as raw uint16_t bit patterns (types Half and BFloat16 below wrap them
// for overloads). Conversions from fp32 round to nearest, ties to even; NaN stays NaN (quieted, sign and
// top payload bits kept), infinities and signed zeros are exact, and subnormals are converted exactly
// rather than flushed. The array converters are vectorized (F16C / AVX-512) with the path chosen at run
// time and give the same bits as the scalar functions.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

#include "base/cpu.h"

namespace zero {

enum class DType : uint8_t { kFloat32, kFloat16, kBFloat16, kFloat64, kInt32, kInt64, kUInt8 };

size_t dtype_size(DType t);
const char* dtype_name(DType t);
// Accepts the names dtype_name prints ("fp32", "fp16", "bf16", "fp64", "int32", "int64", "uint8").
DType parse_dtype(std::string_view name);
inline bool is_float16_family(DType t) { return t == DType::kFloat16 || t == DType::kBFloat16; }

// Storage wrappers so 16-bit floats can be told apart in templates and overloads.
struct Half {
  uint16_t bits;
};
struct BFloat16 {
  uint16_t bits;
};

template <typename T>
constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::kFloat32; }
template <> constexpr DType dtype_of<Half>() { return DType::kFloat16; }
template <> constexpr DType dtype_of<BFloat16>() { return DType::kBFloat16; }
template <> constexpr DType dtype_of<double>() { return DType::kFloat64; }
template <> constexpr DType dtype_of<int32_t>() { return DType::kInt32; }
template <> constexpr DType dtype_of<int64_t>() { return DType::kInt64; }
template <> constexpr DType dtype_of<uint8_t>() { return DType::kUInt8; }

inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// ---- scalar conversions (inline: used inside other layers' scalar kernels) ----

inline uint16_t fp32_to_bf16_bits(float f) {
  const uint32_t x = float_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x0040u);  // quiet NaN
  const uint32_t rounding = 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>((x + rounding) >> 16);
}

inline float bf16_bits_to_fp32(uint16_t h) { return bits_float(static_cast<uint32_t>(h) << 16); }

inline uint16_t fp32_to_fp16_bits(float f) {
  uint32_t x = float_bits(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  x &= 0x7fffffffu;
  if (x >= 0x7f800000u) {  // Inf or NaN
    if (x == 0x7f800000u) return sign | 0x7c00u;
    return static_cast<uint16_t>(sign | 0x7e00u | ((x >> 13) & 0x3ffu));  // quiet NaN, keep payload
  }
  if (x >= 0x477ff000u) return sign | 0x7c00u;  // >= 65520 rounds to infinity
  if (x >= 0x38800000u) {                        // normal half range: >= 2^-14
    uint32_t h = (x - 0x38000000u) >> 13;
    const uint32_t rem = x & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
    return static_cast<uint16_t>(sign | h);
  }
  // Subnormal half (or zero): value = m * 2^-24.
  const int exp = static_cast<int>(x >> 23);
  const int shift = 126 - exp;
  if (shift > 24) return sign;  // below half the smallest subnormal (ties at exactly half go to 0)
  const uint32_t mant = (x & 0x7fffffu) | 0x800000u;
  uint32_t r = mant >> shift;
  const uint32_t rem = mant & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1);
  if (rem > half || (rem == half && (r & 1u))) ++r;
  return static_cast<uint16_t>(sign | r);
}

inline float fp16_bits_to_fp32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0x1fu) {  // Inf or NaN; NaN is quieted like the hardware conversion
    if (mant != 0) mant |= 0x200u;
    return bits_float(sign | 0x7f800000u | (mant << 13));
  }
  if (exp == 0) {
    if (mant == 0) return bits_float(sign);
    // Subnormal: normalize.
    exp = 113;  // 127 - 15 + 1
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      --exp;
    }
    mant &= 0x3ffu;
    return bits_float(sign | (exp << 23) | (mant << 13));
  }
  return bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
}

// ---- array conversions (vectorized; the path defaults to best_simd_path()) ----

void convert_fp32_to_fp16(const float* src, uint16_t* dst, size_t n);
void convert_fp16_to_fp32(const uint16_t* src, float* dst, size_t n);
void convert_fp32_to_bf16(const float* src, uint16_t* dst, size_t n);
void convert_bf16_to_fp32(const uint16_t* src, float* dst, size_t n);

// The same with an explicit path (tests cover every path). The path must be supported.
void convert_fp32_to_fp16(const float* src, uint16_t* dst, size_t n, SimdPath path);
void convert_fp16_to_fp32(const uint16_t* src, float* dst, size_t n, SimdPath path);
void convert_fp32_to_bf16(const float* src, uint16_t* dst, size_t n, SimdPath path);
void convert_bf16_to_fp32(const uint16_t* src, float* dst, size_t n, SimdPath path);

}  // namespace zero
