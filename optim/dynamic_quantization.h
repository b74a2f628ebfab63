#pragma once
// Block-wise 8-bit dynamic quantization (Dettmers et al., "8-bit Optimizers via Block-wise
// Quantization", arXiv 2110.02861): a block of values is stored as one fp32 absmax and one byte per
// value, the index of the nearest entry of a 256-entry map in [-1, 1] (signed) or [0, 1] (unsigned)
// to value / absmax.
//
// The map is the paper's dynamic tree type as bitsandbytes builds it (create_dynamic_map with 7
// exponent bits): for i = 0..6 the means of neighbouring points of linspace(0.1, 1, n_i + 1) times
// 10^(i-6), n_i = 2^i values (signed, each with its negative) or 2^(i+1) (unsigned), plus 0 and 1.
// Here the map is computed in double and rounded to float once (bitsandbytes runs the linspace in
// float), so that a reference in any language reproduces it bit for bit; entries may differ from
// bitsandbytes' in the last bit. The signed map's most negative entry is -0.99296875, not -1.
//
// The rule, which scripts/adamw8bit_reference.py restates for the tests:
//   absmax = max |x| over the block (fp32);  q = x / absmax (fp32; q = 0 where absmax is 0)
//   code   = the number of midpoints below q, midpoint k = (map[k] + map[k+1]) * 0.5f (fp32)
//            (nearest entry; a tie goes to the lower one)
//   value  = map[code] * absmax (fp32)
#include <cstddef>
#include <cstdint>

#include "base/cpu.h"

namespace zero::optim {

struct DynamicMap {
  float values[256];     // ascending
  float midpoints[256];  // [k] between values[k] and values[k + 1]; [255] = +inf (a sentinel)
  // The binary search's pivots by depth d (0-7): pivots[d][j] = midpoints[j 2^(8-d) + 2^(7-d) - 1],
  // the midpoint a lane at code j 2^(8-d) compares with next (the vector path looks them up).
  alignas(64) float pivots[8][128];
};

// The signed map (first moments) or the unsigned one (second moments); built once.
const DynamicMap& dynamic_map(bool is_signed);

// The code of q (already divided by the block's absmax).
inline uint8_t quantize_code(const DynamicMap& map, float q) {
  unsigned pos = 0;
  for (unsigned step = 128; step > 0; step >>= 1) pos += map.midpoints[pos + step - 1] < q ? step : 0;
  return static_cast<uint8_t>(pos);
}

// Quantizes x[0, n) as one block: returns its absmax and writes the n codes.
float quantize_block(const DynamicMap& map, const float* x, size_t n, uint8_t* codes);
// Codes of x[0, n) against a given absmax (a checkpoint's), each on its own.
void quantize_with(const DynamicMap& map, const float* x, size_t n, float absmax, uint8_t* codes);
// values[i] = map[codes[i]] * absmax.
void dequantize_block(const DynamicMap& map, const uint8_t* codes, size_t n, float absmax, float* values);

// The same three on a SIMD path's vectors (the same bits on every path); on kScalar the above.
struct QuantizeKernels {
  float (*quantize_block)(const DynamicMap&, const float*, size_t, uint8_t*);
  void (*dequantize_block)(const DynamicMap&, const uint8_t*, size_t, float, float*);
};
const QuantizeKernels& quantize_kernels(SimdPath path);

}  // namespace zero::optim
