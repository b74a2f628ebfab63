#pragma once
// fp32 <-> fp16 / bf16 of one value, on bit patterns (uint16_t), defined once for host code and CUDA
// kernels so that the device's results are the host's bits (memory/cuda_kernels.cu,
// optim/cuda/multi_tensor_kernels.cu, and base/dtype's vectorized array converters, whose tests
// compare every path with these).
//
// From fp32: round to nearest, ties to even; NaN stays NaN (quieted, sign and top payload bits
// kept); infinities and signed zeros are exact; subnormals are converted exactly rather than
// flushed. Integer arithmetic throughout rather than __float2half_rn, so that NaN payloads come out
// as on the host.
#include <cstdint>
#include <cstring>

#ifdef __CUDACC__
#define ZERO_HOST_DEVICE __host__ __device__
#else
#define ZERO_HOST_DEVICE
#endif

namespace zero {

ZERO_HOST_DEVICE inline uint32_t float_bits(float f) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}
ZERO_HOST_DEVICE inline float bits_float(uint32_t u) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

ZERO_HOST_DEVICE inline uint16_t fp32_to_bf16_bits(float f) {
  const uint32_t x = float_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x0040u);  // quiet NaN
  const uint32_t rounding = 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>((x + rounding) >> 16);
}

ZERO_HOST_DEVICE inline float bf16_bits_to_fp32(uint16_t h) { return bits_float(static_cast<uint32_t>(h) << 16); }

ZERO_HOST_DEVICE inline uint16_t fp32_to_fp16_bits(float f) {
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

ZERO_HOST_DEVICE inline float fp16_bits_to_fp32(uint16_t h) {
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

}  // namespace zero
