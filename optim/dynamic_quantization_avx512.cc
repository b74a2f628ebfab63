// The block quantizer on AVX-512 (16 lanes), bit for bit the scalar rule of dynamic_quantization.h:
// the same division, the same strict comparisons with the same midpoints, in the same order. The
// binary search keeps each lane's code in a vector and looks its next pivot up by permutes: depth d
// has 2^d pivots (DynamicMap::pivots), which fit one register up to d = 4, two (permutex2var) at
// d = 5, and two and four pairs, blended by the index's high bits, at d = 6 and 7. Compiled with a
// target attribute, used only where the CPU reports AVX-512 (base/cpu.h).
#include <cstddef>
#include <cstdint>

#include "base/simd.h"
#include "optim/dynamic_quantization.h"

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl")
#endif

namespace zero::optim::detail {
namespace {

inline __mmask16 tail_mask(size_t left) { return left >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << left) - 1); }

// 2^(d) pivots of depth d for the lanes' indices j (< 2^d), d >= 5: pairs of registers by permutex2var
// (the index's low five bits), then blended on bits 5 and 6.
inline __m512 pivot_of(const float* t, __m512i j, int d) {
  if (d <= 4) return _mm512_permutexvar_ps(j, _mm512_load_ps(t));
  const int pairs = 1 << (d - 5);
  __m512 p[4];
  for (int k = 0; k < pairs; ++k) p[k] = _mm512_permutex2var_ps(_mm512_load_ps(t + 32 * k), j, _mm512_load_ps(t + 32 * k + 16));
  if (pairs == 1) return p[0];
  const __mmask16 bit5 = _mm512_test_epi32_mask(j, _mm512_set1_epi32(32));
  p[0] = _mm512_mask_blend_ps(bit5, p[0], p[1]);
  if (pairs == 2) return p[0];
  p[2] = _mm512_mask_blend_ps(bit5, p[2], p[3]);
  const __mmask16 bit6 = _mm512_test_epi32_mask(j, _mm512_set1_epi32(64));
  return _mm512_mask_blend_ps(bit6, p[0], p[2]);
}

inline __m512i codes_of(const DynamicMap& map, __m512 q) {
  __m512i pos = _mm512_setzero_si512();
  __mmask16 up = _mm512_cmp_ps_mask(_mm512_set1_ps(map.pivots[0][0]), q, _CMP_LT_OQ);
  pos = _mm512_mask_add_epi32(pos, up, pos, _mm512_set1_epi32(128));
  for (int d = 1; d < 8; ++d) {
    const __m512i j = _mm512_srli_epi32(pos, static_cast<unsigned>(8 - d));
    up = _mm512_cmp_ps_mask(pivot_of(map.pivots[d], j, d), q, _CMP_LT_OQ);
    pos = _mm512_mask_add_epi32(pos, up, pos, _mm512_set1_epi32(128 >> d));
  }
  return pos;
}

float quantize_block_avx512(const DynamicMap& map, const float* x, size_t n, uint8_t* codes) {
  __m512 top = _mm512_setzero_ps();
  const __m512i no_sign = _mm512_set1_epi32(0x7FFFFFFF);
  for (size_t i = 0; i < n; i += 16) {
    const __m512i bits = _mm512_castps_si512(_mm512_maskz_loadu_ps(tail_mask(n - i), x + i));
    top = _mm512_max_ps(top, _mm512_castsi512_ps(_mm512_and_si512(bits, no_sign)));
  }
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, top);
  float absmax = 0.0f;
  for (float l : lanes) absmax = l > absmax ? l : absmax;
  const __m512 scale = _mm512_set1_ps(absmax > 0.0f ? absmax : 1.0f);
  for (size_t i = 0; i < n; i += 16) {
    const __mmask16 m = tail_mask(n - i);
    const __m512i c = codes_of(map, _mm512_div_ps(_mm512_maskz_loadu_ps(m, x + i), scale));
    _mm512_mask_cvtepi32_storeu_epi8(codes + i, m, c);
  }
  return absmax;
}

void dequantize_block_avx512(const DynamicMap& map, const uint8_t* codes, size_t n, float absmax, float* values) {
  const __m512 a = _mm512_set1_ps(absmax);
  for (size_t i = 0; i < n; i += 16) {
    const __mmask16 m = tail_mask(n - i);
    const __m512i c = _mm512_maskz_cvtepu8_epi32(m, _mm_maskz_loadu_epi8(m, codes + i));
    const __m512 v = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), m, c, map.values, 4);
    _mm512_mask_storeu_ps(values + i, m, _mm512_mul_ps(v, a));
  }
}

}  // namespace

const QuantizeKernels* quantize_kernels_avx512() {
  static const QuantizeKernels k{&quantize_block_avx512, &dequantize_block_avx512};
  return &k;
}

}  // namespace zero::optim::detail

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
