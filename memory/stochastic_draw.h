#pragma once
// Stochastic rounding's draw (memory/block_quantization.h), defined once for the host's loops and
// the CUDA kernels (constexpr: nvcc compiles it for the device with --expt-relaxed-constexpr). The
// host's vector loops restate it lane by lane (memory/block_quantization_simd.cc).
#include <cstddef>
#include <cstdint>

#include "base/lowbias32.h"
#include "base/splitmix64.h"

namespace zero::memory {

// The key folded to 32 bits once per call: the top half of splitmix64's finalizer of it.
constexpr uint32_t stochastic_key32(uint64_t key) { return static_cast<uint32_t>(splitmix64_mix(key) >> 32); }

// The 24 bits of u (u = draw x 2^-24, in [0, 1)) for the element at `index` of its segment.
constexpr uint32_t stochastic_draw24(uint32_t key32, size_t index) {
  return lowbias32(key32 ^ (static_cast<uint32_t>(index) * kGolden32)) >> 8;
}

// u itself: the draw times 2^-24, exact in fp32.
constexpr float stochastic_offset(uint32_t key32, size_t index) {
  return static_cast<float>(stochastic_draw24(key32, index)) * 0x1p-24f;
}

}  // namespace zero::memory
