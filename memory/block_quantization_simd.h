#pragma once
// Internal to memory/block_quantization.cc: its inner loops over fp32 tiles, one set per SIMD path
// (base/cpu.h), bit for bit the same results.
#include <cstddef>
#include <cstdint>

#include "base/cpu.h"

namespace zero::memory::host_kernels {

struct QuantizeLoops {
  // The largest finite |x| of x[0, n) (0 when none).
  float (*absmax)(const float* x, size_t n);
  // Codes of x[0, n) at `inv` = qmax / absmax (127 for int8, 7 for int4), as int8 bytes; the
  // marker -qmax - 1 for a non-finite value. Returns how many were not finite.
  uint64_t (*codes)(const float* x, size_t n, float inv, float qmax, uint8_t* out);
  // out[i] = code * scale (codes as int8 bytes), NaN for the marker.
  void (*decode)(const uint8_t* codes, size_t n, float scale, int marker, float* out);
  // Blocks of `block` of x[0, n) (the last may be short): each one's scale and int8 codes; returns
  // how many values were not finite.
  uint64_t (*quantize8)(const float* x, size_t n, size_t block, float* scales, uint8_t* codes);
  // The same from bf16 bits and, decoding, into bf16 (rounded as base/dtype.h rounds), without a
  // widened tile: null on paths without them (the caller widens and narrows a tile instead).
  uint64_t (*quantize8_bf16)(const uint16_t* x, size_t n, size_t block, float* scales, uint8_t* codes);
  void (*decode8_bf16)(const uint8_t* codes, size_t n, size_t block, const float* scales, uint16_t* out);
  // Stochastic codes (memory/block_quantization.h) of x[0, n) at `inv` = qmax / absmax, x[i] being
  // element first + i of its segment, as int8 (int4's too, which the caller packs); the marker
  // -qmax - 1 for a non-finite value. Returns how many were not finite.
  uint64_t (*codes_stochastic)(const float* x, size_t n, float inv, float qmax, uint64_t key, size_t first,
                               uint8_t* out);
  // int4: pairs of codes (a byte each, in [-8, 7]) into one byte each, the first in the low nibble;
  // and back, each nibble sign-extended into its byte.
  void (*pack4)(const uint8_t* codes, size_t pairs, uint8_t* out);
  void (*unpack4)(const uint8_t* in, size_t pairs, uint8_t* codes);
};

const QuantizeLoops& quantize_loops(SimdPath path);

// A block's scale and its inverse from its largest finite |x| (memory/block_quantization.h): a
// block whose absmax is below 2^-120 is zeros (qmax / absmax would overflow fp32).
struct BlockScale {
  float scale = 0, inv = 0;
};
inline BlockScale block_scale(float absmax, float qmax) {
  constexpr float kSmallestAbsmax = 0x1p-120f;  // the CUDA kernels' too
  if (absmax < kSmallestAbsmax) return {};
  return {absmax / qmax, qmax / absmax};
}

// An int4 code's nibble (the low four bits of v) as its int8 byte: (v ^ 8) - 8, two's complement.
inline uint8_t widen_nibble(unsigned v) { return static_cast<uint8_t>(((v & 0xFu) ^ 8u) - 8u); }

}  // namespace zero::memory::host_kernels
