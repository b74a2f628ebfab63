// AVX2 + F16C path (8 lanes). Compiled with a target pragma, not -march: the table is used only when
// the CPU reports the features at run time (base/cpu.h).
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "base/dtype.h"
#include "base/simd.h"
#include "optim/kernels.h"
#include "optim/step_coeffs.h"

// Everything below is compiled for AVX2. Only templates and functions of internal linkage are defined
// here (plus the table accessor), so no AVX2 code can be chosen by the linker for a generic caller.
// GCC takes the target pragma; clang, which ignores it, the same target as an attribute of every
// function declared up to the pop.
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif

#include "optim/scalar_ops.inc"
#include "optim/step_kernels.inc"
#include "optim/grad_kernels.inc"

namespace zero::optim::detail {
namespace {

struct Avx2Ops {
  using V = __m256;
  static constexpr size_t kWidth = 8;
  static V zero() { return _mm256_setzero_ps(); }
  static V set1(float x) { return _mm256_set1_ps(x); }
  static V add(V a, V b) { return _mm256_add_ps(a, b); }
  static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V div(V a, V b) { return _mm256_div_ps(a, b); }
  static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static V sqrt(V a) { return _mm256_sqrt_ps(a); }
  static V sign(V a) {
    const V one = _mm256_set1_ps(1.0f);
    const V pos = _mm256_and_ps(_mm256_cmp_ps(_mm256_setzero_ps(), a, _CMP_LT_OQ), one);
    const V neg = _mm256_and_ps(_mm256_cmp_ps(a, _mm256_setzero_ps(), _CMP_LT_OQ), one);
    return _mm256_sub_ps(pos, neg);
  }
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static V load(const Half* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static V load(const BFloat16* p) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  }
  static void store(float* p, V v) { _mm256_storeu_ps(p, v); }
  static void store(Half* p, V v) { _mm_storeu_si128(reinterpret_cast<__m128i*>(p), to_fp16(v)); }
  static void store(BFloat16* p, V v) { _mm_storeu_si128(reinterpret_cast<__m128i*>(p), to_bf16(v)); }
  // Streaming (non-temporal) stores for the copy-out: `p` must be aligned to the vector size.
  static void stream(float* p, V v) { _mm256_stream_ps(p, v); }
  static void stream(Half* p, V v) { _mm_stream_si128(reinterpret_cast<__m128i*>(p), to_fp16(v)); }
  static void stream(BFloat16* p, V v) { _mm_stream_si128(reinterpret_cast<__m128i*>(p), to_bf16(v)); }
  static void fence() { _mm_sfence(); }

  static __m128i to_fp16(V v) { return _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT); }
  // Round to nearest even on the integer bits (as fp32_to_bf16_bits), NaN lanes quieted.
  static __m128i to_bf16(V v) {
    const __m256i x = _mm256_castps_si256(v);
    const __m256i hi = _mm256_srli_epi32(x, 16);
    const __m256i lsb = _mm256_and_si256(hi, _mm256_set1_epi32(1));
    const __m256i rounded =
        _mm256_srli_epi32(_mm256_add_epi32(x, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
    const __m256i quiet_nan = _mm256_or_si256(hi, _mm256_set1_epi32(0x40));
    const __m256i is_nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    const __m256i r = _mm256_blendv_epi8(rounded, quiet_nan, is_nan);
    const __m256i packed = _mm256_packus_epi32(r, r);  // per 128-bit half: a0..a3 a0..a3 | b0..b3 ..
    const __m256i ordered = _mm256_permute4x64_epi64(packed, 0x08);
    return _mm256_castsi256_si128(ordered);
  }
};

template <class G>
double sum_of_squares_avx2(const void* grad, size_t n, float scale) {
  const G* g = static_cast<const G*>(grad);
  const __m256 s = _mm256_set1_ps(scale);
  // acc[k] holds lanes 4k..4k+3 of each 16-element block.
  __m256d acc0 = _mm256_setzero_pd(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
  size_t i = 0;
  for (; i + kSumLanes <= n; i += kSumLanes) {
    const __m256 x0 = _mm256_mul_ps(Avx2Ops::load(g + i), s);
    const __m256 x1 = _mm256_mul_ps(Avx2Ops::load(g + i + 8), s);
    const __m256d d0 = _mm256_cvtps_pd(_mm256_castps256_ps128(x0));
    const __m256d d1 = _mm256_cvtps_pd(_mm256_extractf128_ps(x0, 1));
    const __m256d d2 = _mm256_cvtps_pd(_mm256_castps256_ps128(x1));
    const __m256d d3 = _mm256_cvtps_pd(_mm256_extractf128_ps(x1, 1));
    acc0 = _mm256_add_pd(acc0, _mm256_mul_pd(d0, d0));
    acc1 = _mm256_add_pd(acc1, _mm256_mul_pd(d1, d1));
    acc2 = _mm256_add_pd(acc2, _mm256_mul_pd(d2, d2));
    acc3 = _mm256_add_pd(acc3, _mm256_mul_pd(d3, d3));
  }
  double lanes[kSumLanes];
  _mm256_storeu_pd(lanes, acc0);
  _mm256_storeu_pd(lanes + 4, acc1);
  _mm256_storeu_pd(lanes + 8, acc2);
  _mm256_storeu_pd(lanes + 12, acc3);
  sum_of_squares_tail(g, i, n, scale, lanes);
  return reduce_lanes(lanes);
}

// Checks a chunk at a time so that a gradient with an early Inf returns early.
inline constexpr size_t kInfChunk = 4096;

bool has_inf_or_nan_avx2_f32(const void* grad, size_t n) {
  const float* g = static_cast<const float*>(grad);
  const __m256i exp = _mm256_set1_epi32(0x7f800000);
  size_t i = 0;
  while (i + 8 <= n) {
    const size_t chunk_end = i + kInfChunk < n ? i + kInfChunk : n;
    __m256i found = _mm256_setzero_si256();
    for (; i + 8 <= chunk_end; i += 8) {
      const __m256i x = _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(g + i)), exp);
      found = _mm256_or_si256(found, _mm256_cmpeq_epi32(x, exp));
    }
    if (!_mm256_testz_si256(found, found)) return true;
  }
  return has_inf_or_nan_tail(g, i, n);
}

template <class G, uint16_t kExpMask>
bool has_inf_or_nan_avx2_16(const void* grad, size_t n) {
  const G* g = static_cast<const G*>(grad);
  const __m256i exp = _mm256_set1_epi16(static_cast<short>(kExpMask));
  size_t i = 0;
  while (i + 16 <= n) {
    const size_t chunk_end = i + kInfChunk < n ? i + kInfChunk : n;
    __m256i found = _mm256_setzero_si256();
    for (; i + 16 <= chunk_end; i += 16) {
      const __m256i x = _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(g + i)), exp);
      found = _mm256_or_si256(found, _mm256_cmpeq_epi16(x, exp));
    }
    if (!_mm256_testz_si256(found, found)) return true;
  }
  return has_inf_or_nan_tail(g, i, n);
}

void scale_avx2(float* x, size_t n, float s) {
  const __m256 vs = _mm256_set1_ps(s);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), vs));
  scale_tail(x, i, n, s);
}

KernelTable make_avx2_table() {
  KernelTable t;
  fill_step_kernels<Avx2Ops>(t);
  t.sum_of_squares[0] = &sum_of_squares_avx2<float>;
  t.sum_of_squares[1] = &sum_of_squares_avx2<Half>;
  t.sum_of_squares[2] = &sum_of_squares_avx2<BFloat16>;
  t.has_inf_or_nan[0] = &has_inf_or_nan_avx2_f32;
  t.has_inf_or_nan[1] = &has_inf_or_nan_avx2_16<Half, 0x7c00>;
  t.has_inf_or_nan[2] = &has_inf_or_nan_avx2_16<BFloat16, 0x7f80>;
  t.scale = &scale_avx2;
  return t;
}

}  // namespace

const KernelTable& kernels_avx2() {
  static const KernelTable table = make_avx2_table();
  return table;
}

}  // namespace zero::optim::detail

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
