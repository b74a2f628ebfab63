// The block quantizer on AVX2 (8 lanes), bit for bit the scalar rule of dynamic_quantization.h: the
// same division, the same strict comparisons with the same midpoints, in the same order. The binary
// search keeps each lane's code in a vector and looks its next pivot up (DynamicMap::pivots): by a
// permute of one register while depth d has at most 8 pivots (d <= 3), by a gather below. Compiled
// with a target attribute, used only where the CPU reports AVX2 (base/cpu.h).
#include <cstddef>
#include <cstdint>

#include "base/simd.h"
#include "optim/dynamic_quantization.h"

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2")
#endif

namespace zero::optim::detail {
namespace {

// Lanes [0, left) on (all eight from 8 on), as maskload takes them.
inline __m256i tail_mask(size_t left) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(left >= 8 ? 8 : static_cast<int>(left)), lane);
}

inline __m256i codes_of(const DynamicMap& map, __m256 q) {
  __m256i pos = _mm256_setzero_si256();
  for (int d = 0; d < 8; ++d) {
    const __m256i j = _mm256_srlv_epi32(pos, _mm256_set1_epi32(8 - d));
    const __m256 pivot = d <= 3 ? _mm256_permutevar8x32_ps(_mm256_load_ps(map.pivots[d]), j)
                                : _mm256_i32gather_ps(map.pivots[d], j, 4);
    const __m256i up = _mm256_castps_si256(_mm256_cmp_ps(pivot, q, _CMP_LT_OQ));
    pos = _mm256_add_epi32(pos, _mm256_and_si256(up, _mm256_set1_epi32(128 >> d)));
  }
  return pos;
}

float quantize_block_avx2(const DynamicMap& map, const float* x, size_t n, uint8_t* codes) {
  __m256 top = _mm256_setzero_ps();
  const __m256 no_sign = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  for (size_t i = 0; i < n; i += 8) {
    top = _mm256_max_ps(top, _mm256_and_ps(_mm256_maskload_ps(x + i, tail_mask(n - i)), no_sign));
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, top);
  float absmax = 0.0f;
  for (float l : lanes) absmax = l > absmax ? l : absmax;
  const __m256 scale = _mm256_set1_ps(absmax > 0.0f ? absmax : 1.0f);
  alignas(32) int32_t out[8];
  for (size_t i = 0; i < n; i += 8) {
    _mm256_store_si256(reinterpret_cast<__m256i*>(out),
                       codes_of(map, _mm256_div_ps(_mm256_maskload_ps(x + i, tail_mask(n - i)), scale)));
    const size_t lanes_here = n - i < 8 ? n - i : 8;
    for (size_t k = 0; k < lanes_here; ++k) codes[i + k] = static_cast<uint8_t>(out[k]);
  }
  return absmax;
}

void dequantize_block_avx2(const DynamicMap& map, const uint8_t* codes, size_t n, float absmax, float* values) {
  const __m256 a = _mm256_set1_ps(absmax);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i c = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + i)));
    _mm256_storeu_ps(values + i, _mm256_mul_ps(_mm256_i32gather_ps(map.values, c, 4), a));
  }
  for (; i < n; ++i) values[i] = map.values[codes[i]] * absmax;
}

}  // namespace

const QuantizeKernels* quantize_kernels_avx2() {
  static const QuantizeKernels k{&quantize_block_avx2, &dequantize_block_avx2};
  return &k;
}

}  // namespace zero::optim::detail

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
