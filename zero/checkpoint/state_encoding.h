#pragma once
// How a checkpoint stores a piece of an optimizer state whose values a few bytes describe exactly.
// Every state is read and written as fp32 per element (ShardOptimizer::read_state); a state that is
// a block's scale repeated on its elements, or a quantized moment dequantized, would take 4 bytes per
// element in the file where the optimizer keeps 1 or less. So the optimizer names an encoding
// (ShardOptimizer::state_encoding), the save encodes each piece and keeps the encoding only where
// the piece decodes back to the same bits (else the piece is stored fp32, as before), and the
// index records it beside the piece ("encoding"); a reader decodes, so loads, conversions between
// optimizers and layouts, and the offline tools see the same fp32 values.
//
//   block_constant, block B, phase p:  one fp32 per block: v[i] = stored[(i + p) / B]
//                              (a row's statistic on each of its elements: B the row's length,
//                              p the piece's start within its row; a uniform piece: B = n)
//   periodic, period P:        the first min(n, P) values: v[i] = stored[i % P] (a column's
//                              statistic on each element of its column)
//   dynamic8, block B, map M:  [ scale 0 | scale 1 | ... ][ codes ] one fp32 per block, then a
//                              byte per element: v[i] = M[code i] * scale[i / B] (fp32)
//
// dynamic8's blocks count from the piece's first element (a rank's pieces of an 8-bit tensor start
// on its blocks); the last may be shorter. M is optim/dynamic_quantization.h's signed or unsigned
// map.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace zero {

struct StateEncoding {
  enum class Kind { kNone, kBlockConstant, kPeriodic, kDynamic8 };
  Kind kind = Kind::kNone;
  size_t block = 0;         // elements per stored value or scale, or the period (> 0 unless kNone)
  bool is_signed = false;   // kDynamic8: the signed map (first moments) or the unsigned one
  std::string scale_state;  // kDynamic8, when saving: the state whose values are the blocks' scales
  size_t phase = 0;         // kBlockConstant: elements of its first block before the piece (< block)

  bool operator==(const StateEncoding& o) const {
    return kind == o.kind && block == o.block && is_signed == o.is_signed && phase == o.phase;
  }
  // The stored values (or scales) of n elements; no sum wraps for any n (phase < block below 2^30,
  // which a reader checks before it asks).
  size_t stored(size_t n) const {
    switch (kind) {
      case Kind::kBlockConstant: return n == 0 ? 0 : n / block + (n % block + phase + block - 1) / block;
      case Kind::kPeriodic: return n < block ? n : block;
      case Kind::kDynamic8: return n / block + (n % block != 0 ? 1 : 0);
      case Kind::kNone: break;
    }
    return n;
  }
  // The bytes of n elements so stored.
  uint64_t bytes(size_t n) const { return stored(n) * sizeof(float) + (kind == Kind::kDynamic8 ? n : 0); }
};

// A uniform piece of n elements (every value the same bits: the zeros a state reads where another
// kind of optimizer keeps the elements) as one value.
inline StateEncoding uniform_encoding(size_t n) {
  return {.kind = StateEncoding::Kind::kBlockConstant, .block = n == 0 ? 1 : n};
}

// The index's name of an encoding ("block_constant", "dynamic8"), and back (false for another name).
inline const char* state_encoding_name(StateEncoding::Kind kind) {
  switch (kind) {
    case StateEncoding::Kind::kBlockConstant: return "block_constant";
    case StateEncoding::Kind::kPeriodic: return "periodic";
    case StateEncoding::Kind::kDynamic8: return "dynamic8";
    case StateEncoding::Kind::kNone: break;
  }
  return "none";
}
inline bool parse_state_encoding_kind(const std::string& name, StateEncoding::Kind* kind) {
  for (StateEncoding::Kind k :
       {StateEncoding::Kind::kBlockConstant, StateEncoding::Kind::kPeriodic, StateEncoding::Kind::kDynamic8}) {
    if (name == state_encoding_name(k)) {
      *kind = k;
      return true;
    }
  }
  return false;
}

// values[0, n) as `e` stores them, into `out` (e.bytes(n)); `scales` (kDynamic8 only) is the scale
// state's values of the same elements, each block's taken at its first element. Returns false, with
// `out` unspecified, where the stored bytes would not decode back to every value's bits (so an
// encoding the optimizer names wrongly costs bytes, never values).
bool encode_state(const StateEncoding& e, const float* values, const float* scales, size_t n, std::vector<char>& out);

// Elements [lo, hi) of a piece of n elements stored as `e` in `bytes` (e.bytes(n) of them), into
// out[0, hi - lo).
void decode_state(const StateEncoding& e, const char* bytes, size_t n, size_t lo, size_t hi, float* out);

}  // namespace zero
