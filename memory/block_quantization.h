#pragma once
// Symmetric per-block quantization for compressed collectives (ZeRO++'s quantized weight gathers
// and gradient reductions): n elements in blocks of `block` (the last may be shorter), each block
// one fp32 scale and its elements as signed integer codes of `bits` bits. A segment is what one
// rank sends, moved by a collective as plain bytes:
//
//   [ scale 0 | scale 1 | ... | scale B-1 ][ codes ............................ ][ pad to 4 ]
//     B = ceil(n / block) fp32               int8: n bytes
//                                            int4: ceil(n / 2) bytes, element 2i in the low
//                                            nibble of byte i, element 2i + 1 in the high one
//
// The arithmetic, in fp32 with round-to-nearest-even, the same on every device (the CUDA kernels
// reproduce the host's bit for bit; a 16-bit input is widened exactly first):
//
//   qmax   = 127 (int8) or 7 (int4)
//   absmax = the largest |x| of the block's finite elements
//   scale  = absmax / qmax
//   code   = rint(x * (qmax / absmax)), clamped to [-qmax, qmax]
//   (a block whose absmax is below 2^-120, zeros or values that small, has scale 0 and codes 0:
//   qmax / absmax would overflow)
//   value  = code * scale, rounded once into the destination dtype
//
// so a finite element comes back within scale / 2 (plus the destination's rounding) of itself.
//
// Stochastic rounding (BlockQuantization::stochastic_key nonzero; a gradient's reduction, where
// round-to-nearest zeroes every value below half a step of its block's largest, a bias that adds
// up over steps): code = floor(x * (qmax / absmax) + u), clamped to [-qmax, qmax], with u in
// [0, 1) drawn from the key and the element's index i in the segment,
//
//   k = splitmix64's finalizer of the key, its top 32 bits (base/splitmix64.h)
//   h = lowbias32(k ^ (i * 0x9E3779B9 mod 2^32)),  u = (h >> 8) * 2^-24   (base/lowbias32.h)
//
// (32-bit arithmetic, which vectors and GPUs multiply natively; the draws repeat past 2^32
// elements of one segment), so each code's mean is x's (to u's 24 bits) and a call with the same
// key writes the same bytes. A finite element then comes back within one scale of itself. The
// host's SIMD paths draw 8 or 16 elements at once and write the scalar loop's bytes, and so do the
// CUDA kernels (memory/stochastic_draw.h defines the draw for both).
//
// A non-finite element (NaN, +-Inf) takes the code -qmax - 1, which no finite value takes, and
// comes back as NaN: it stays in its own element instead of spreading through the block's scale
// (the other elements keep theirs), and the quantizer counts it so that its caller can name it.
// The host kernels are memory/block_quantization_kernels.h; a Device runs them
// (Device::quantize_blocks, dequantize_rows).
#include <cstddef>
#include <cstdint>

#include "base/dtype.h"

namespace zero::memory {

struct BlockQuantization {
  size_t block = 256;  // elements per scale, > 0
  int bits = 8;        // 8 or 4
  uint64_t stochastic_key = 0;  // 0: round to nearest even; else stochastic rounding keyed by it (above)

  int qmax() const { return bits == 8 ? 127 : 7; }
  size_t blocks(size_t n) const { return (n + block - 1) / block; }
  size_t code_bytes(size_t n) const { return bits == 8 ? n : (n + 1) / 2; }
  // The segment of n elements: the scales, the codes, padded to 4 bytes (so that segments laid
  // back to back keep their scales aligned).
  size_t segment_bytes(size_t n) const { return (blocks(n) * sizeof(float) + code_bytes(n) + 3) / 4 * 4; }
};

// InvalidArgument naming `what` unless block > 0 and bits is 8 or 4.
void check_block_quantization(const BlockQuantization& q, const char* what);

}  // namespace zero::memory
