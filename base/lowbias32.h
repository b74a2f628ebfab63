#pragma once
// lowbias32 (C. Wellons, "Hash function prospector", 2018): a bijection on 32 bits whose output bits
// each flip with nearly half of the input's single-bit changes. Two 32-bit multiplies, so a vector
// of 8 or 16 lanes (or a GPU thread, whose 64-bit multiply is several instructions) hashes as fast
// as it loads: the draw of stochastic rounding (memory/block_quantization.h).
#include <cstdint>

namespace zero {

inline constexpr uint32_t kLowbias32Mul1 = 0x7FEB352Du;
inline constexpr uint32_t kLowbias32Mul2 = 0x846CA68Bu;
// floor(2^32 / golden ratio), odd: consecutive indices times it are spread over the 32 bits.
inline constexpr uint32_t kGolden32 = 0x9E3779B9u;

constexpr uint32_t lowbias32(uint32_t x) {
  x ^= x >> 16;
  x *= kLowbias32Mul1;
  x ^= x >> 15;
  x *= kLowbias32Mul2;
  return x ^ (x >> 16);
}

}  // namespace zero
