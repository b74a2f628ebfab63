// fp16/bf16 conversion: all 65536 bit patterns, rounding ties, NaN/Inf/subnormals, on every SIMD path
// this CPU supports, against references computed independently of base/dtype.h.
#include "base/dtype.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "base/cpu.h"
#include "base/error.h"

namespace zero {
namespace {

// fp16 value from its fields (exact in double).
double fp16_reference_value(uint16_t h) {
  const double sign = (h >> 15) ? -1.0 : 1.0;
  const int exp = (h >> 10) & 0x1f;
  const int mant = h & 0x3ff;
  if (exp == 0) return sign * std::ldexp(mant, -24);
  if (exp == 31) return mant ? NAN : sign * INFINITY;
  return sign * std::ldexp(1024 + mant, exp - 25);
}

// fp32 -> fp16 (finite or infinite; NaNs are checked apart), round to nearest even, in double: the
// value's quantum at its fp16 exponent (2^-24 below the normal range), nearbyint() in the default
// rounding mode, and the bits as ((exponent - 1) << 10) + the rounded count of quanta, which carries
// into the next exponent (or to infinity) by itself. Written out rather than through a compiler's
// _Float16, which not every compiler of the sanitizer builds has on x86.
uint16_t fp16_reference_bits(float f) {
  const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  const double a = std::fabs(static_cast<double>(f));
  if (a == 0) return sign;
  if (std::isinf(a)) return sign | 0x7c00;
  int e = 0;
  std::frexp(a, &e);                         // a in [2^(e-1), 2^e)
  const int exp = std::max(e + 14, 1);       // its fp16 exponent field (1 for the subnormals too)
  const double quanta = std::nearbyint(std::ldexp(a, 25 - exp));  // exact scaling by a power of two
  const double bits = std::ldexp(exp - 1, 10) + quanta;
  return sign | static_cast<uint16_t>(std::min(bits, double{0x7c00}));
}

// fp32 -> bf16 by comparing distances to the two neighbouring bf16 values, in double.
uint16_t bf16_reference_bits(float f) {
  const uint32_t x = float_bits(f);
  const uint16_t lo = static_cast<uint16_t>(x >> 16);  // truncation: toward zero
  if (std::isinf(f) || (x & 0xffffu) == 0) return lo;
  const uint16_t hi = static_cast<uint16_t>(lo + 1);  // next magnitude up (may be Inf)
  const double v = std::fabs(static_cast<double>(f));
  const double a = std::fabs(static_cast<double>(bf16_bits_to_fp32(lo)));
  // For round-to-nearest, Inf behaves as if it sat at 2^128 (one ulp past the largest finite value).
  const double b = ((hi & 0x7fffu) == 0x7f80u) ? std::ldexp(1.0, 128)
                                                : std::fabs(static_cast<double>(bf16_bits_to_fp32(hi)));
  if (v - a < b - v) return lo;
  if (v - a > b - v) return hi;
  return (lo & 1u) ? hi : lo;
}

bool is_nan16(uint16_t h, bool bf16) {
  return bf16 ? ((h & 0x7f80u) == 0x7f80u && (h & 0x7fu) != 0)
              : ((h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0);
}

// Inputs that stress rounding for a 16-bit format whose values (as fp32 bit patterns) are `values`:
// each value, each midpoint between neighbours (a tie), one fp32 ulp either side, random floats and
// NaNs with payloads.
std::vector<float> rounding_inputs(const std::vector<float>& values) {
  std::vector<float> in;
  for (size_t i = 0; i + 1 < values.size(); ++i) {
    const float a = values[i], b = values[i + 1];
    in.push_back(a);
    if (!std::isfinite(a) || !std::isfinite(b)) continue;
    const float mid = static_cast<float>((static_cast<double>(a) + b) / 2);  // exact in fp32
    in.push_back(mid);
    in.push_back(std::nextafter(mid, -INFINITY));
    in.push_back(std::nextafter(mid, INFINITY));
  }
  std::mt19937 rng(7);
  for (int i = 0; i < 200000; ++i) in.push_back(bits_float(static_cast<uint32_t>(rng())));
  for (uint32_t nan : {0x7fc00000u, 0x7f800001u, 0xffc12345u, 0x7fbfffffu, 0xff800001u}) {
    in.push_back(bits_float(nan));
  }
  for (float special : {0.0f, -0.0f, INFINITY, -INFINITY, 65504.0f, 65519.996f, 65520.0f,
                        3.4028235e38f, 1e-45f, -1e-45f, 1.17549435e-38f, 5.9604645e-8f,
                        2.9802322e-8f, 2.9802326e-8f}) {
    in.push_back(special);
  }
  return in;
}

std::vector<float> positive_and_negative(std::vector<float> pos) {
  std::vector<float> all;
  for (auto it = pos.rbegin(); it != pos.rend(); ++it) all.push_back(-*it);
  all.insert(all.end(), pos.begin(), pos.end());
  return all;
}

}  // namespace

TEST_CASE("dtype sizes, names and parsing") {
  CHECK(dtype_size(DType::kFloat32) == 4);
  CHECK(dtype_size(DType::kBFloat16) == 2);
  CHECK(dtype_size(DType::kInt64) == 8);
  CHECK(dtype_size(DType::kUInt8) == 1);
  for (DType t : {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kFloat64, DType::kInt32,
                  DType::kInt64, DType::kUInt8}) {
    CHECK(parse_dtype(dtype_name(t)) == t);
  }
  CHECK_THROWS_AS(parse_dtype("float8"), InvalidArgument);
  CHECK_THROWS_WITH(parse_dtype("half"), doctest::Contains("'half'"));
}

TEST_CASE("fp16 -> fp32 is exact for all 65536 patterns on every path") {
  std::vector<uint16_t> all(65536);
  for (uint32_t i = 0; i < 65536; ++i) all[i] = static_cast<uint16_t>(i);
  for (SimdPath path : supported_simd_paths()) {
    CAPTURE(simd_path_name(path));
    std::vector<float> out(all.size());
    convert_fp16_to_fp32(all.data(), out.data(), all.size(), path);
    for (uint32_t i = 0; i < 65536; ++i) {
      const double ref = fp16_reference_value(static_cast<uint16_t>(i));
      if (std::isnan(ref)) {
        REQUIRE(std::isnan(out[i]));
        REQUIRE(std::signbit(out[i]) == bool(i & 0x8000));
        REQUIRE(float_bits(out[i]) == float_bits(fp16_bits_to_fp32(static_cast<uint16_t>(i))));
      } else {
        REQUIRE(float_bits(out[i]) == float_bits(static_cast<float>(ref)));
      }
    }
  }
}

TEST_CASE("bf16 -> fp32 is exact for all 65536 patterns on every path") {
  std::vector<uint16_t> all(65536);
  for (uint32_t i = 0; i < 65536; ++i) all[i] = static_cast<uint16_t>(i);
  for (SimdPath path : supported_simd_paths()) {
    CAPTURE(simd_path_name(path));
    std::vector<float> out(all.size());
    convert_bf16_to_fp32(all.data(), out.data(), all.size(), path);
    for (uint32_t i = 0; i < 65536; ++i) REQUIRE(float_bits(out[i]) == (i << 16));
  }
}

TEST_CASE("fp32 -> fp16 rounds to nearest even, ties and specials included, on every path") {
  std::vector<float> pos;
  for (uint32_t h = 0; h <= 0x7c00; ++h) pos.push_back(fp16_bits_to_fp32(static_cast<uint16_t>(h)));
  const std::vector<float> in = rounding_inputs(positive_and_negative(pos));
  for (SimdPath path : supported_simd_paths()) {
    CAPTURE(simd_path_name(path));
    std::vector<uint16_t> out(in.size());
    convert_fp32_to_fp16(in.data(), out.data(), in.size(), path);
    for (size_t i = 0; i < in.size(); ++i) {
      CAPTURE(float_bits(in[i]));
      REQUIRE(out[i] == fp32_to_fp16_bits(in[i]));  // array path == scalar path, NaNs included
      if (std::isnan(in[i])) {
        REQUIRE(is_nan16(out[i], false));
        REQUIRE(bool(out[i] & 0x8000) == std::signbit(in[i]));
        REQUIRE((out[i] & 0x0200u) != 0);  // quiet
      } else {
        REQUIRE(out[i] == fp16_reference_bits(in[i]));
      }
    }
  }
}

TEST_CASE("fp32 -> bf16 rounds to nearest even, ties and specials included, on every path") {
  std::vector<float> pos;
  for (uint32_t h = 0; h <= 0x7f80; ++h) pos.push_back(bf16_bits_to_fp32(static_cast<uint16_t>(h)));
  const std::vector<float> in = rounding_inputs(positive_and_negative(pos));
  for (SimdPath path : supported_simd_paths()) {
    CAPTURE(simd_path_name(path));
    std::vector<uint16_t> out(in.size());
    convert_fp32_to_bf16(in.data(), out.data(), in.size(), path);
    for (size_t i = 0; i < in.size(); ++i) {
      CAPTURE(float_bits(in[i]));
      REQUIRE(out[i] == fp32_to_bf16_bits(in[i]));
      if (std::isnan(in[i])) {
        REQUIRE(is_nan16(out[i], true));
        REQUIRE(bool(out[i] & 0x8000) == std::signbit(in[i]));
        REQUIRE((out[i] & 0x0040u) != 0);  // quiet
      } else {
        REQUIRE(out[i] == bf16_reference_bits(in[i]));
      }
    }
  }
}

TEST_CASE("conversions handle lengths that are not a multiple of the vector width") {
  for (SimdPath path : supported_simd_paths()) {
    for (size_t n : {0u, 1u, 7u, 15u, 17u, 33u, 100u}) {
      std::vector<float> in(n), back(n);
      for (size_t i = 0; i < n; ++i) in[i] = 0.1f * static_cast<float>(i) - 3.0f;
      std::vector<uint16_t> h(n + 1, 0xabcd);  // sentinel past the end must survive
      convert_fp32_to_bf16(in.data(), h.data(), n, path);
      CHECK(h[n] == 0xabcd);
      convert_bf16_to_fp32(h.data(), back.data(), n, path);
      for (size_t i = 0; i < n; ++i) CHECK(back[i] == bf16_bits_to_fp32(fp32_to_bf16_bits(in[i])));
      convert_fp32_to_fp16(in.data(), h.data(), n, path);
      CHECK(h[n] == 0xabcd);
    }
  }
}

TEST_CASE("an unsupported SIMD path name is a clear error") {
  CHECK_THROWS_WITH_AS(parse_simd_path("sse9"), doctest::Contains("sse9"), InvalidArgument);
}

}  // namespace zero
