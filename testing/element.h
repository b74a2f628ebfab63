#pragma once
// One element of a float dtype (fp32, fp16, bf16) at an untyped address, for tests that fill and
// read buffers of any model dtype (16-bit values rounded to nearest even).
#include <cstdint>
#include <cstring>

#include "base/dtype.h"

namespace zero::testing {

inline void store_element(void* p, DType dtype, float v) {
  if (dtype == DType::kFloat32) {
    std::memcpy(p, &v, sizeof(v));
    return;
  }
  const uint16_t bits = dtype == DType::kBFloat16 ? fp32_to_bf16_bits(v) : fp32_to_fp16_bits(v);
  std::memcpy(p, &bits, sizeof(bits));
}

inline float load_element(const void* p, DType dtype) {
  if (dtype == DType::kFloat32) {
    float v;
    std::memcpy(&v, p, sizeof(v));
    return v;
  }
  uint16_t bits;
  std::memcpy(&bits, p, sizeof(bits));
  return dtype == DType::kBFloat16 ? bf16_bits_to_fp32(bits) : fp16_bits_to_fp32(bits);
}

}  // namespace zero::testing
