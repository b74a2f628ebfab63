#include "zero/checkpoint/state_encoding.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "base/check.h"
#include "optim/dynamic_quantization.h"

namespace zero {
namespace {

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof(float)) == 0; }

// The code whose entry times `scale` is v's bits, where one is: the nearest entry to v / scale
// (the quantizer's own rule) where the scale is not 0; with a zero scale every entry gives a zero,
// whose sign is the entry's, so one of v's sign.
bool code_of(const optim::DynamicMap& map, float v, float scale, uint8_t* code) {
  if (scale != 0.0f) {
    *code = optim::quantize_code(map, v / scale);
  } else {
    if (v != 0.0f) return false;
    // The entries ascend: the first is the most negative, and 0 is among them.
    const bool negative = std::signbit(v);
    const float* zero = std::find(map.values, map.values + 256, 0.0f);
    *code = negative ? 0 : static_cast<uint8_t>(zero - map.values);
  }
  return same_bits(map.values[*code] * scale, v);
}

}  // namespace

bool encode_state(const StateEncoding& e, const float* values, const float* scales, size_t n, std::vector<char>& out) {
  ZERO_CHECK(e.kind != StateEncoding::Kind::kNone && e.block > 0, "encode_state: no encoding");
  out.resize(e.bytes(n));
  auto* stored = reinterpret_cast<float*>(out.data());
  const size_t blocks = e.stored(n);
  if (e.kind == StateEncoding::Kind::kBlockConstant) {
    if (e.phase >= e.block) return false;
    for (size_t b = 0; b < blocks; ++b) {
      const size_t first = b == 0 ? 0 : b * e.block - e.phase, last = std::min(n, (b + 1) * e.block - e.phase);
      stored[b] = values[first];
      for (size_t i = first + 1; i < last; ++i) {
        if (!same_bits(values[i], values[first])) return false;
      }
    }
    return true;
  }
  if (e.kind == StateEncoding::Kind::kPeriodic) {
    std::memcpy(stored, values, blocks * sizeof(float));
    for (size_t i = blocks; i < n; ++i) {
      if (!same_bits(values[i], stored[i % e.block])) return false;
    }
    return true;
  }
  ZERO_CHECK(scales != nullptr, "encode_state: dynamic8 without the scales");
  const optim::DynamicMap& map = optim::dynamic_map(e.is_signed);
  auto* codes = reinterpret_cast<uint8_t*>(out.data() + blocks * sizeof(float));
  for (size_t b = 0; b < blocks; ++b) {
    const size_t first = b * e.block, last = std::min(n, first + e.block);
    const float scale = scales[first];
    stored[b] = scale;
    for (size_t i = first; i < last; ++i) {
      if (!code_of(map, values[i], scale, codes + i)) return false;
    }
  }
  return true;
}

void decode_state(const StateEncoding& e, const char* bytes, size_t n, size_t lo, size_t hi, float* out) {
  ZERO_CHECK(lo <= hi && hi <= n && e.block > 0 && e.phase < e.block, "decode_state: [{}, {}) of {} elements", lo, hi, n);
  std::vector<float> stored(e.stored(n));
  std::memcpy(stored.data(), bytes, stored.size() * sizeof(float));  // the bytes need not be aligned
  if (e.kind == StateEncoding::Kind::kBlockConstant) {
    for (size_t i = lo; i < hi; ++i) out[i - lo] = stored[(i + e.phase) / e.block];
    return;
  }
  if (e.kind == StateEncoding::Kind::kPeriodic) {
    for (size_t i = lo; i < hi; ++i) out[i - lo] = stored[i % e.block];
    return;
  }
  ZERO_CHECK(e.kind == StateEncoding::Kind::kDynamic8, "decode_state: no encoding");
  const optim::DynamicMap& map = optim::dynamic_map(e.is_signed);
  const auto* codes = reinterpret_cast<const uint8_t*>(bytes + stored.size() * sizeof(float));
  for (size_t i = lo; i < hi; ++i) out[i - lo] = map.values[codes[i]] * stored[i / e.block];
}

}  // namespace zero
