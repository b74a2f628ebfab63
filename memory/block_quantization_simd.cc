// The inner loops of the host quantizer (block_quantization.cc) on fp32 tiles, per SIMD path, each
// bit for bit the scalar loop: a max is exact in any order, the product is one fp32 operation, the
// conversion to int32 rounds to nearest even (the default rounding mode) as the scalar's 1.5 x 2^23
// trick does, and a code in [-128, 127] narrows exactly. The vector loops skip the scalar's clamp:
// |v| <= absmax makes |v x (qmax / absmax)| at most qmax (1 + 2^-24)^2, below qmax + 0.5 (127 or
// 7), so the rounded code is within [-qmax, qmax] already. Stochastic rounding's loops restate the
// scalar's hash on 32-bit lanes (integer arithmetic, exact) and its product, sum and floor as one
// fp32 operation each.
#include "memory/block_quantization_simd.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>

#include "base/dtype.h"
#include "base/lowbias32.h"
#include "base/simd.h"
#include "memory/stochastic_draw.h"

namespace zero::memory::host_kernels {
namespace {

bool finite(float v) { return std::fabs(v) <= FLT_MAX; }

// ---- scalar ----

float absmax_scalar(const float* x, size_t n) {
  float m = 0.0f;
  for (size_t i = 0; i < n; ++i) {
    const float a = std::fabs(x[i]);
    m = std::max(m, a <= FLT_MAX ? a : 0.0f);
  }
  return m;
}

// code = rint(v * inv) in [-qmax, qmax] (clamped first: the bounds are integers, so the order does
// not matter), rounded by adding and subtracting 1.5 x 2^23 (round to nearest even for |y| < 2^22,
// as rint in the default rounding mode); the marker -qmax - 1 for a non-finite v.
float code_scalar(float v, float inv, float qmax) {
  const float y = std::min(std::max(v * inv, -qmax), qmax);
  return finite(v) ? (y + 0x1.8p23f) - 0x1.8p23f : -qmax - 1.0f;
}

uint64_t codes_scalar(const float* x, size_t n, float inv, float qmax, uint8_t* out) {
  uint64_t bad = 0;
  for (size_t i = 0; i < n; ++i) {
    out[i] = static_cast<uint8_t>(static_cast<int8_t>(code_scalar(x[i], inv, qmax)));
    bad += finite(x[i]) ? 0 : 1;
  }
  return bad;
}

void decode_scalar(const uint8_t* codes, size_t n, float scale, int marker, float* out) {
  for (size_t i = 0; i < n; ++i) {
    const int c = static_cast<int8_t>(codes[i]);
    out[i] = c == marker ? std::numeric_limits<float>::quiet_NaN() : static_cast<float>(c) * scale;
  }
}

// Stochastic rounding's u comes from memory/stochastic_draw.h; the vector loops below restate the
// draw on 32-bit lanes, their index x golden advanced by a multiple of golden per vector, mod 2^32
// as the scalar's product.
// floor(v x inv + u) clamped to [-qmax, qmax]; the marker for a non-finite v. The product and the
// sum are separate statements: a compiler that contracts within an expression (clang by default)
// would fuse them into one FMA where the target has it, rounding once where the vector loops round
// twice.
float code_stochastic_scalar(float v, float inv, float qmax, float u) {
  if (!finite(v)) return -qmax - 1.0f;
  const float y = v * inv;
  const float z = y + u;
  return std::min(std::max(std::floor(z), -qmax), qmax);
}

uint64_t codes_stochastic_scalar(const float* x, size_t n, float inv, float qmax, uint64_t key, size_t first,
                                 uint8_t* out) {
  const uint32_t k = stochastic_key32(key);
  uint64_t bad = 0;
  for (size_t i = 0; i < n; ++i) {
    const float c = code_stochastic_scalar(x[i], inv, qmax, stochastic_offset(k, first + i));
    out[i] = static_cast<uint8_t>(static_cast<int8_t>(c));
    bad += finite(x[i]) ? 0 : 1;
  }
  return bad;
}

void pack4_scalar(const uint8_t* c, size_t pairs, uint8_t* out) {
  for (size_t j = 0; j < pairs; ++j) out[j] = static_cast<uint8_t>((c[2 * j] & 0xFu) | ((c[2 * j + 1] & 0xFu) << 4));
}

void unpack4_scalar(const uint8_t* in, size_t pairs, uint8_t* c) {
  for (size_t j = 0; j < pairs; ++j) {
    c[2 * j] = widen_nibble(in[j]);
    c[2 * j + 1] = widen_nibble(in[j] >> 4u);
  }
}

// ---- AVX2 ----

#define ZERO_AVX2_TARGET __attribute__((target("avx2,fma,f16c")))

ZERO_AVX2_TARGET float absmax_avx2(const float* x, size_t n) {
  const __m256 sign = _mm256_set1_ps(-0.0f), big = _mm256_set1_ps(FLT_MAX);
  __m256 m = _mm256_setzero_ps();
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 a = _mm256_andnot_ps(sign, _mm256_loadu_ps(x + i));
    m = _mm256_max_ps(m, _mm256_and_ps(a, _mm256_cmp_ps(a, big, _CMP_LE_OQ)));  // not finite: 0
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, m);
  float out = absmax_scalar(x + i, n - i);
  for (float v : lanes) out = std::max(out, v);
  return out;
}

ZERO_AVX2_TARGET uint64_t codes_avx2(const float* x, size_t n, float inv, float qmax, uint8_t* out) {
  const __m256 sign = _mm256_set1_ps(-0.0f), big = _mm256_set1_ps(FLT_MAX);
  const __m256 vinv = _mm256_set1_ps(inv);
  const __m256i marker = _mm256_set1_epi32(static_cast<int>(-qmax - 1.0f));
  uint64_t bad = 0;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    const __m256 ok = _mm256_cmp_ps(_mm256_andnot_ps(sign, v), big, _CMP_LE_OQ);
    const __m256i c = _mm256_cvtps_epi32(_mm256_mul_ps(v, vinv));  // rounds to nearest even; in range
    const __m256i coded = _mm256_blendv_epi8(marker, c, _mm256_castps_si256(ok));
    const __m128i w16 = _mm_packs_epi32(_mm256_castsi256_si128(coded), _mm256_extracti128_si256(coded, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(out + i), _mm_packs_epi16(w16, w16));
    bad += static_cast<uint64_t>(8 - __builtin_popcount(static_cast<unsigned>(_mm256_movemask_ps(ok))));
  }
  return bad + codes_scalar(x + i, n - i, inv, qmax, out + i);
}

ZERO_AVX2_TARGET void decode_avx2(const uint8_t* codes, size_t n, float scale, int marker_code, float* out) {
  const __m256 s = _mm256_set1_ps(scale), nan = _mm256_set1_ps(std::numeric_limits<float>::quiet_NaN());
  const __m256i marker = _mm256_set1_epi32(marker_code);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i c = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + i)));
    const __m256 v = _mm256_mul_ps(_mm256_cvtepi32_ps(c), s);
    _mm256_storeu_ps(out + i, _mm256_blendv_ps(v, nan, _mm256_castsi256_ps(_mm256_cmpeq_epi32(c, marker))));
  }
  decode_scalar(codes + i, n - i, scale, marker_code, out + i);
}

// lowbias32 of eight lanes.
ZERO_AVX2_TARGET __m256i lowbias32_avx2(__m256i x) {
  x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
  x = _mm256_mullo_epi32(x, _mm256_set1_epi32(static_cast<int>(kLowbias32Mul1)));
  x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 15));
  x = _mm256_mullo_epi32(x, _mm256_set1_epi32(static_cast<int>(kLowbias32Mul2)));
  return _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
}

ZERO_AVX2_TARGET uint64_t codes_stochastic_avx2(const float* x, size_t n, float inv, float qmax, uint64_t key,
                                                size_t first, uint8_t* out) {
  const __m256 sign = _mm256_set1_ps(-0.0f), big = _mm256_set1_ps(FLT_MAX);
  const __m256 vinv = _mm256_set1_ps(inv), hi = _mm256_set1_ps(qmax), lo = _mm256_set1_ps(-qmax);
  const __m256 unit = _mm256_set1_ps(0x1p-24f);
  const __m256i marker = _mm256_set1_epi32(static_cast<int>(-qmax - 1.0f));
  const __m256i k = _mm256_set1_epi32(static_cast<int>(stochastic_key32(key)));
  const __m256i step = _mm256_set1_epi32(static_cast<int>(8 * kGolden32));
  const auto f32 = static_cast<uint32_t>(first);
  __m256i ig = _mm256_mullo_epi32(_mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(f32)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)),
                                  _mm256_set1_epi32(static_cast<int>(kGolden32)));
  uint64_t bad = 0;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i h = lowbias32_avx2(_mm256_xor_si256(k, ig));
    const __m256 u = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(h, 8)), unit);
    const __m256 v = _mm256_loadu_ps(x + i);
    const __m256 ok = _mm256_cmp_ps(_mm256_andnot_ps(sign, v), big, _CMP_LE_OQ);
    const __m256 y = _mm256_mul_ps(v, vinv);
    const __m256 z = _mm256_add_ps(y, u);
    const __m256i c = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(_mm256_floor_ps(z), lo), hi));
    const __m256i coded = _mm256_blendv_epi8(marker, c, _mm256_castps_si256(ok));
    const __m128i w16 = _mm_packs_epi32(_mm256_castsi256_si128(coded), _mm256_extracti128_si256(coded, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(out + i), _mm_packs_epi16(w16, w16));
    bad += static_cast<uint64_t>(8 - __builtin_popcount(static_cast<unsigned>(_mm256_movemask_ps(ok))));
    ig = _mm256_add_epi32(ig, step);
  }
  return bad + codes_stochastic_scalar(x + i, n - i, inv, qmax, key, first + i, out + i);
}

// A byte per pair from 16-bit lanes c0 | c1 << 8: (c0 & 0xF) | (c1 & 0xF) << 4 in each lane's low byte.
ZERO_AVX2_TARGET __m256i pack4_lanes_avx2(__m256i w) {
  return _mm256_or_si256(_mm256_and_si256(w, _mm256_set1_epi16(0x000F)),
                         _mm256_and_si256(_mm256_srli_epi16(w, 4), _mm256_set1_epi16(0x00F0)));
}

ZERO_AVX2_TARGET void pack4_avx2(const uint8_t* c, size_t pairs, uint8_t* out) {
  size_t j = 0;
  for (; j + 32 <= pairs; j += 32) {
    const __m256i a = pack4_lanes_avx2(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + 2 * j)));
    const __m256i b = pack4_lanes_avx2(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + 2 * j + 32)));
    // packus interleaves the 128-bit halves (a0 b0 a1 b1); the permute puts them in order.
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + j),
                        _mm256_permute4x64_epi64(_mm256_packus_epi16(a, b), 0xD8));
  }
  pack4_scalar(c + 2 * j, pairs - j, out + j);
}

ZERO_AVX2_TARGET void unpack4_avx2(const uint8_t* in, size_t pairs, uint8_t* c) {
  const __m128i low = _mm_set1_epi8(0x0F), eight = _mm_set1_epi8(8);
  size_t j = 0;
  for (; j + 16 <= pairs; j += 16) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + j));
    const __m128i lo = _mm_and_si128(b, low), hi = _mm_and_si128(_mm_srli_epi16(b, 4), low);
    auto widen = [&](__m128i v) { return _mm_sub_epi8(_mm_xor_si128(v, eight), eight); };
    _mm_storeu_si128(reinterpret_cast<__m128i*>(c + 2 * j), widen(_mm_unpacklo_epi8(lo, hi)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(c + 2 * j + 16), widen(_mm_unpackhi_epi8(lo, hi)));
  }
  unpack4_scalar(in + j, pairs - j, c + 2 * j);
}

// ---- AVX-512 ----

#define ZERO_AVX512_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))

// The largest lane of a and b, folded by shuffles (the maskz forms: GCC 12's plain _mm512_max_ps and
// _mm512_reduce_max_ps draw a false -Wuninitialized in templates, as base/simd.h says of others).
ZERO_AVX512_TARGET float max_lane(__m512 a, __m512 b) {
  __m512 m = _mm512_maskz_max_ps(0xFFFF, a, b);
  m = _mm512_maskz_max_ps(0xFFFF, m, _mm512_shuffle_f32x4(m, m, 0x4E));
  m = _mm512_maskz_max_ps(0xFFFF, m, _mm512_shuffle_f32x4(m, m, 0xB1));
  m = _mm512_maskz_max_ps(0xFFFF, m, _mm512_shuffle_ps(m, m, 0x4E));
  m = _mm512_maskz_max_ps(0xFFFF, m, _mm512_shuffle_ps(m, m, 0xB1));
  return _mm512_cvtss_f32(m);
}

ZERO_AVX512_TARGET float absmax_avx512(const float* x, size_t n) {
  const __m512 big = _mm512_set1_ps(FLT_MAX);
  // Four running maxima: one would wait for the previous max every vector.
  __m512 m[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    for (int j = 0; j < 4; ++j) {
      const __m512 a = _mm512_abs_ps(_mm512_loadu_ps(x + i + 16 * j));
      m[j] = _mm512_mask_max_ps(m[j], _mm512_cmp_ps_mask(a, big, _CMP_LE_OQ), m[j], a);
    }
  }
  for (; i + 16 <= n; i += 16) {
    const __m512 a = _mm512_abs_ps(_mm512_loadu_ps(x + i));
    m[0] = _mm512_mask_max_ps(m[0], _mm512_cmp_ps_mask(a, big, _CMP_LE_OQ), m[0], a);
  }
  return std::max(std::max(max_lane(m[0], m[1]), max_lane(m[2], m[3])), absmax_scalar(x + i, n - i));
}

ZERO_AVX512_TARGET uint64_t codes_avx512(const float* x, size_t n, float inv, float qmax, uint8_t* out) {
  const __m512 big = _mm512_set1_ps(FLT_MAX);
  const __m512 vinv = _mm512_set1_ps(inv);
  const __m512i marker = _mm512_set1_epi32(static_cast<int>(-qmax - 1.0f));
  uint64_t bad = 0;
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_loadu_ps(x + i);
    const __mmask16 ok = _mm512_cmp_ps_mask(_mm512_abs_ps(v), big, _CMP_LE_OQ);
    const __m512i c = _mm512_cvtps_epi32(_mm512_mul_ps(v, vinv));  // rounds to nearest even; in range
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), _mm512_cvtepi32_epi8(_mm512_mask_blend_epi32(ok, marker, c)));
    bad += static_cast<uint64_t>(16 - __builtin_popcount(static_cast<unsigned>(ok)));
  }
  return bad + codes_scalar(x + i, n - i, inv, qmax, out + i);
}

ZERO_AVX512_TARGET void decode_avx512(const uint8_t* codes, size_t n, float scale, int marker_code, float* out) {
  const __m512 s = _mm512_set1_ps(scale), nan = _mm512_set1_ps(std::numeric_limits<float>::quiet_NaN());
  const __m512i marker = _mm512_set1_epi32(marker_code);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i c = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + i)));
    const __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(c), s);
    _mm512_storeu_ps(out + i, _mm512_mask_blend_ps(_mm512_cmpeq_epi32_mask(c, marker), v, nan));
  }
  decode_scalar(codes + i, n - i, scale, marker_code, out + i);
}

// lowbias32 of sixteen lanes (the maskz shifts with every lane set: GCC 12's plain ones draw a
// false -Wuninitialized, as max_lane says).
ZERO_AVX512_TARGET __m512i lowbias32_avx512(__m512i x) {
  x = _mm512_xor_si512(x, _mm512_maskz_srli_epi32(0xFFFF, x, 16));
  x = _mm512_mullo_epi32(x, _mm512_set1_epi32(static_cast<int>(kLowbias32Mul1)));
  x = _mm512_xor_si512(x, _mm512_maskz_srli_epi32(0xFFFF, x, 15));
  x = _mm512_mullo_epi32(x, _mm512_set1_epi32(static_cast<int>(kLowbias32Mul2)));
  return _mm512_xor_si512(x, _mm512_maskz_srli_epi32(0xFFFF, x, 16));
}

ZERO_AVX512_TARGET uint64_t codes_stochastic_avx512(const float* x, size_t n, float inv, float qmax, uint64_t key,
                                                    size_t first, uint8_t* out) {
  const __m512 big = _mm512_set1_ps(FLT_MAX), vinv = _mm512_set1_ps(inv);
  const __m512 hi = _mm512_set1_ps(qmax), lo = _mm512_set1_ps(-qmax), unit = _mm512_set1_ps(0x1p-24f);
  const __m512i marker = _mm512_set1_epi32(static_cast<int>(-qmax - 1.0f));
  const __m512i k = _mm512_set1_epi32(static_cast<int>(stochastic_key32(key)));
  const __m512i step = _mm512_set1_epi32(static_cast<int>(16 * kGolden32));
  const __m512i lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  __m512i ig = _mm512_mullo_epi32(_mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(static_cast<uint32_t>(first))), lanes),
                                  _mm512_set1_epi32(static_cast<int>(kGolden32)));
  uint64_t bad = 0;
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i h = lowbias32_avx512(_mm512_xor_si512(k, ig));
    const __m512 u = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_maskz_srli_epi32(0xFFFF, h, 8)), unit);
    const __m512 v = _mm512_loadu_ps(x + i);
    const __mmask16 ok = _mm512_cmp_ps_mask(_mm512_abs_ps(v), big, _CMP_LE_OQ);
    const __m512 y = _mm512_mul_ps(v, vinv);
    const __m512 z = _mm512_add_ps(y, u);
    const __m512 f = _mm512_roundscale_ps(z, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    const __m512i c = _mm512_cvtps_epi32(_mm512_maskz_min_ps(0xFFFF, _mm512_maskz_max_ps(0xFFFF, f, lo), hi));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), _mm512_cvtepi32_epi8(_mm512_mask_blend_epi32(ok, marker, c)));
    bad += static_cast<uint64_t>(16 - __builtin_popcount(static_cast<unsigned>(ok)));
    ig = _mm512_add_epi32(ig, step);
  }
  return bad + codes_stochastic_scalar(x + i, n - i, inv, qmax, key, first + i, out + i);
}

ZERO_AVX512_TARGET void pack4_avx512(const uint8_t* c, size_t pairs, uint8_t* out) {
  const __m512i low = _mm512_set1_epi16(0x000F), high = _mm512_set1_epi16(0x00F0);
  size_t j = 0;
  for (; j + 32 <= pairs; j += 32) {
    const __m512i w = _mm512_loadu_si512(c + 2 * j);
    const __m512i packed =
        _mm512_or_si512(_mm512_and_si512(w, low), _mm512_and_si512(_mm512_maskz_srli_epi16(0xFFFFFFFF, w, 4), high));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + j), _mm512_maskz_cvtepi16_epi8(0xFFFFFFFF, packed));
  }
  pack4_scalar(c + 2 * j, pairs - j, out + j);
}

ZERO_AVX512_TARGET void unpack4_avx512(const uint8_t* in, size_t pairs, uint8_t* c) {
  const __m512i low = _mm512_set1_epi16(0x000F), eight = _mm512_set1_epi8(8);
  size_t j = 0;
  for (; j + 32 <= pairs; j += 32) {
    // Each byte into a 16-bit lane, its low nibble into the lane's low byte and its high one above.
    const __m512i w = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + j)));
    const __m512i split = _mm512_or_si512(_mm512_and_si512(w, low),
                                          _mm512_maskz_slli_epi16(0xFFFFFFFF, _mm512_maskz_srli_epi16(0xFFFFFFFF, w, 4), 8));
    _mm512_storeu_si512(c + 2 * j, _mm512_sub_epi8(_mm512_xor_si512(split, eight), eight));
  }
  unpack4_scalar(in + j, pairs - j, c + 2 * j);
}

// Whole blocks of x[0, n) (the last may be short) into their scales and int8 codes.
template <float (*Absmax)(const float*, size_t), uint64_t (*Codes)(const float*, size_t, float, float, uint8_t*)>
uint64_t quantize8_composed(const float* x, size_t n, size_t block, float* scales, uint8_t* codes) {
  uint64_t bad = 0;
  for (size_t first = 0, k = 0; first < n; first += block, ++k) {
    const size_t len = std::min(block, n - first);
    const BlockScale bs = block_scale(Absmax(x + first, len), 127.0f);
    scales[k] = bs.scale;
    bad += Codes(x + first, len, bs.inv, 127.0f, codes + first);
  }
  return bad;
}

// bf16 straight from and to its bits, without a widened tile: x's bits << 16 is its fp32 value,
// and fp32 rounds to bf16 as base/dtype.cc does (nearest even on the bits; a NaN stays quiet).
ZERO_AVX512_TARGET __m512 bf16x16(const uint16_t* p) {
  return _mm512_castsi512_ps(
      _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
}

// The largest of n bf16 magnitudes (n a multiple of 16), on their bits: with the sign cleared, a
// bf16's bits order as its magnitude does, so 32 lanes are compared per vector by an integer max,
// with no widening. Above 0x7F7F (the largest finite bits) lie Inf and NaN.
ZERO_AVX512_TARGET uint32_t bf16_magnitude_bits_max(const uint16_t* x, size_t n) {
  const __m512i magnitude = _mm512_set1_epi16(0x7FFF);
  __m512i top = _mm512_setzero_si512();
  size_t i = 0;
  for (; i + 32 <= n; i += 32) top = _mm512_max_epu16(top, _mm512_and_si512(_mm512_loadu_si512(x + i), magnitude));
  if (i < n) {
    const __m256i half = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i));
    top = _mm512_max_epu16(top, _mm512_and_si512(_mm512_zextsi256_si512(half), magnitude));
  }
  const __m256i m256 = _mm256_max_epu16(_mm512_castsi512_si256(top), _mm512_extracti64x4_epi64(top, 1));
  const __m128i m128 = _mm_max_epu16(_mm256_castsi256_si128(m256), _mm256_extracti128_si256(m256, 1));
  // The max of 8 lanes is the complement of the min of their complements (minpos: SSE4.1).
  const __m128i low = _mm_minpos_epu16(_mm_xor_si128(m128, _mm_set1_epi16(-1)));
  return 0xFFFFu & ~static_cast<uint32_t>(_mm_cvtsi128_si32(low));
}

// Whole blocks of an fp32 or a bf16 source (bf16: its bits, without a widened tile), fused: the
// first pass over a block takes its largest finite |x| and notes whether any value is not finite;
// the second (from L1) writes the codes, with the marker only in a block that needs it.
template <bool kBf16>
ZERO_AVX512_TARGET __m512 load16(const void* x, size_t i) {
  if constexpr (kBf16) {
    return bf16x16(static_cast<const uint16_t*>(x) + i);
  } else {
    return _mm512_loadu_ps(static_cast<const float*>(x) + i);
  }
}

template <bool kBf16>
ZERO_AVX512_TARGET uint64_t quantize8_fused_avx512(const void* x, size_t n, size_t block, float* scales,
                                                   uint8_t* codes) {
  const __m512 big = _mm512_set1_ps(FLT_MAX);
  const __m512i marker = _mm512_set1_epi32(-128);
  uint64_t bad = 0;
  float tail[16];
  for (size_t first = 0, k = 0; first < n; first += block, ++k) {
    const size_t len = std::min(block, n - first);
    const size_t whole = len / 16 * 16;
    __m512 m0 = _mm512_setzero_ps(), m1 = _mm512_setzero_ps();
    __mmask16 finite0 = 0xFFFF, finite1 = 0xFFFF;
    size_t i = 0;
    if constexpr (kBf16) {
      // bf16: the first pass on the bits. Where every value is finite (nearly always), that is the
      // block's largest |x|, the float pass below would give the same; else that pass finds the
      // largest finite one and marks the others.
      const uint32_t most = bf16_magnitude_bits_max(static_cast<const uint16_t*>(x) + first, whole);
      if (most <= 0x7F7Fu) {
        m0 = _mm512_castsi512_ps(_mm512_set1_epi32(static_cast<int>(most << 16)));
        i = whole;
      }
    }
    for (; i + 32 <= whole; i += 32) {
      const __m512 a = _mm512_abs_ps(load16<kBf16>(x, first + i)), b = _mm512_abs_ps(load16<kBf16>(x, first + i + 16));
      const __mmask16 oka = _mm512_cmp_ps_mask(a, big, _CMP_LE_OQ), okb = _mm512_cmp_ps_mask(b, big, _CMP_LE_OQ);
      m0 = _mm512_mask_max_ps(m0, oka, m0, a);
      m1 = _mm512_mask_max_ps(m1, okb, m1, b);
      finite0 &= oka;
      finite1 &= okb;
    }
    for (; i < whole; i += 16) {
      const __m512 a = _mm512_abs_ps(load16<kBf16>(x, first + i));
      const __mmask16 ok = _mm512_cmp_ps_mask(a, big, _CMP_LE_OQ);
      m0 = _mm512_mask_max_ps(m0, ok, m0, a);
      finite0 &= ok;
    }
    // A short block's last elements (none in a whole block: the calls are skipped, as at 65536 blocks
    // of 256 their overhead alone would be a third of a bf16 pass).
    const float* rest = tail;
    float rest_max = 0;
    if (len > whole) {
      if constexpr (kBf16) {
        convert_bf16_to_fp32(static_cast<const uint16_t*>(x) + first + whole, tail, len - whole, SimdPath::kScalar);
      } else {
        rest = static_cast<const float*>(x) + first + whole;
      }
      rest_max = absmax_scalar(rest, len - whole);
    }
    const BlockScale bs = block_scale(std::max(max_lane(m0, m1), rest_max), 127.0f);
    scales[k] = bs.scale;
    const float inv = bs.inv;
    const __m512 vinv = _mm512_set1_ps(inv);
    uint8_t* out = codes + first;
    if ((finite0 & finite1) == 0xFFFF) {
      for (i = 0; i < whole; i += 16) {
        const __m512i c = _mm512_cvtps_epi32(_mm512_mul_ps(load16<kBf16>(x, first + i), vinv));  // in range
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), _mm512_cvtepi32_epi8(c));
      }
    } else {
      for (i = 0; i < whole; i += 16) {
        const __m512 v = load16<kBf16>(x, first + i);
        const __mmask16 ok = _mm512_cmp_ps_mask(_mm512_abs_ps(v), big, _CMP_LE_OQ);
        const __m512i c = _mm512_cvtps_epi32(_mm512_mul_ps(v, vinv));  // rounds to nearest even; in range
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), _mm512_cvtepi32_epi8(_mm512_mask_blend_epi32(ok, marker, c)));
        bad += static_cast<uint64_t>(16 - __builtin_popcount(static_cast<unsigned>(ok)));
      }
    }
    if (len > whole) bad += codes_scalar(rest, len - whole, inv, 127.0f, out + whole);
  }
  return bad;
}

uint64_t quantize8_avx512(const float* x, size_t n, size_t block, float* scales, uint8_t* codes) {
  return quantize8_fused_avx512<false>(x, n, block, scales, codes);
}

uint64_t quantize8_bf16_avx512(const uint16_t* x, size_t n, size_t block, float* scales, uint8_t* codes) {
  return quantize8_fused_avx512<true>(x, n, block, scales, codes);
}

ZERO_AVX512_TARGET void decode8_bf16_avx512(const uint8_t* codes, size_t n, size_t block, const float* scales,
                                            uint16_t* out) {
  const __m512i marker = _mm512_set1_epi32(-128), one = _mm512_set1_epi32(1), bias = _mm512_set1_epi32(0x7fff);
  // The quiet NaN decode writes, as bf16 (base/dtype.h keeps a NaN quiet: its top half).
  const __m512i nan_bits = _mm512_set1_epi32(0x7fc0);
  float tail[16];
  for (size_t first = 0, k = 0; first < n; first += block, ++k) {
    const size_t len = std::min(block, n - first);
    const size_t whole = len / 16 * 16;
    const __m512 s = _mm512_set1_ps(scales[k]);
    for (size_t i = 0; i < whole; i += 16) {
      const __m512i c = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + first + i)));
      // code x scale is finite: rounded to bf16 on its bits; the marker's lanes take NaN's bf16 bits.
      const __m512i x = _mm512_castps_si512(_mm512_mul_ps(_mm512_cvtepi32_ps(c), s));
      const __m512i rounded =
          _mm512_srli_epi32(_mm512_add_epi32(x, _mm512_add_epi32(_mm512_and_si512(_mm512_srli_epi32(x, 16), one), bias)), 16);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + first + i),
                          _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(_mm512_cmpeq_epi32_mask(c, marker), rounded, nan_bits)));
    }
    if (len > whole) {  // a short block's last elements
      decode_scalar(codes + first + whole, len - whole, scales[k], -128, tail);
      convert_fp32_to_bf16(tail, out + first + whole, len - whole, SimdPath::kScalar);
    }
  }
}

}  // namespace

const QuantizeLoops& quantize_loops(SimdPath path) {
  static const QuantizeLoops scalar{absmax_scalar,   codes_scalar, decode_scalar,
                                    quantize8_composed<absmax_scalar, codes_scalar>,
                                    nullptr,         nullptr,      codes_stochastic_scalar,
                                    pack4_scalar,    unpack4_scalar};
  static const QuantizeLoops avx2{absmax_avx2, codes_avx2, decode_avx2, quantize8_composed<absmax_avx2, codes_avx2>,
                                  nullptr,     nullptr,    codes_stochastic_avx2,
                                  pack4_avx2,  unpack4_avx2};
  static const QuantizeLoops avx512{absmax_avx512,         codes_avx512,        decode_avx512,          quantize8_avx512,
                                    quantize8_bf16_avx512, decode8_bf16_avx512, codes_stochastic_avx512,
                                    pack4_avx512,          unpack4_avx512};
  switch (path) {
    case SimdPath::kAvx512: return avx512;
    case SimdPath::kAvx2: return avx2;
    case SimdPath::kScalar: return scalar;
  }
  return scalar;
}

}  // namespace zero::memory::host_kernels
