// AVX-512 path (16 lanes; F, BW, VL). Compiled with a target pragma, not -march: the table is used only
// when the CPU reports the features at run time (base/cpu.h).
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "base/dtype.h"
#include "base/simd.h"
#include "optim/kernels.h"
#include "optim/step_coeffs.h"

// Everything below is compiled for AVX-512. Only templates and functions of internal linkage are
// defined here (plus the table accessor), so no AVX-512 code can be chosen by the linker for a generic
// caller.
// GCC takes the target pragma; clang, which ignores it, the same target as an attribute of every
// function declared up to the pop.
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")
#endif

#include "optim/scalar_ops.inc"
#include "optim/step_kernels.inc"
#include "optim/grad_kernels.inc"

namespace zero::optim::detail {
namespace {

struct Avx512Ops {
  using V = __m512;
  static constexpr size_t kWidth = 16;
  static V zero() { return _mm512_setzero_ps(); }
  static V set1(float x) { return _mm512_set1_ps(x); }
  static V add(V a, V b) { return _mm512_add_ps(a, b); }
  static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V div(V a, V b) { return _mm512_div_ps(a, b); }
  static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static V sqrt(V a) { return _mm512_sqrt_ps(a); }
  static V sign(V a) {
    const V one = _mm512_set1_ps(1.0f);
    const V pos = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(_mm512_setzero_ps(), a, _CMP_LT_OQ), one);
    const V neg = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(a, _mm512_setzero_ps(), _CMP_LT_OQ), one);
    return _mm512_sub_ps(pos, neg);
  }
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static V load(const Half* p) {
    // The maskz forms avoid GCC 12's false -Wmaybe-uninitialized in the unmasked intrinsics.
    return _mm512_maskz_cvtph_ps(0xffff, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static V load(const BFloat16* p) {
    const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
  }
  static void store(float* p, V v) { _mm512_storeu_ps(p, v); }
  static void store(Half* p, V v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), to_fp16(v)); }
  static void store(BFloat16* p, V v) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), to_bf16(v));
  }
  // Streaming (non-temporal) stores for the copy-out: `p` must be aligned to the vector size.
  static void stream(float* p, V v) { _mm512_stream_ps(p, v); }
  static void stream(Half* p, V v) { _mm256_stream_si256(reinterpret_cast<__m256i*>(p), to_fp16(v)); }
  static void stream(BFloat16* p, V v) {
    _mm256_stream_si256(reinterpret_cast<__m256i*>(p), to_bf16(v));
  }
  static void fence() { _mm_sfence(); }

  static __m256i to_fp16(V v) {
    // The maskz form avoids GCC 12's false -Wmaybe-uninitialized in the unmasked intrinsic.
    return _mm512_maskz_cvtps_ph(0xffff, v, _MM_FROUND_TO_NEAREST_INT);
  }
  // Round to nearest even on the integer bits (as fp32_to_bf16_bits), NaN lanes quieted. Not
  // vcvtneps2bf16, which flushes subnormal inputs to zero.
  static __m256i to_bf16(V v) {
    const __m512i x = _mm512_castps_si512(v);
    const __m512i hi = _mm512_srli_epi32(x, 16);
    const __m512i lsb = _mm512_and_si512(hi, _mm512_set1_epi32(1));
    const __m512i rounded =
        _mm512_srli_epi32(_mm512_add_epi32(x, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
    const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    const __m512i r = _mm512_mask_blend_epi32(nan, rounded, _mm512_or_si512(hi, _mm512_set1_epi32(0x40)));
    return _mm512_cvtepi32_epi16(r);
  }
};

template <class G>
double sum_of_squares_avx512(const void* grad, size_t n, float scale) {
  const G* g = static_cast<const G*>(grad);
  const __m512 s = _mm512_set1_ps(scale);
  // acc0 holds lanes 0..7 and acc1 lanes 8..15 of each 16-element block.
  __m512d acc0 = _mm512_setzero_pd(), acc1 = acc0;
  size_t i = 0;
  for (; i + kSumLanes <= n; i += kSumLanes) {
    const __m512 x = _mm512_mul_ps(Avx512Ops::load(g + i), s);
    const __m512d d0 = _mm512_cvtps_pd(_mm512_castps512_ps256(x));
    const __m512d d1 =
        _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)));
    acc0 = _mm512_add_pd(acc0, _mm512_mul_pd(d0, d0));
    acc1 = _mm512_add_pd(acc1, _mm512_mul_pd(d1, d1));
  }
  double lanes[kSumLanes];
  _mm512_storeu_pd(lanes, acc0);
  _mm512_storeu_pd(lanes + 8, acc1);
  sum_of_squares_tail(g, i, n, scale, lanes);
  return reduce_lanes(lanes);
}

// Checks a chunk at a time so that a gradient with an early Inf returns early.
inline constexpr size_t kInfChunk = 4096;

bool has_inf_or_nan_avx512_f32(const void* grad, size_t n) {
  const float* g = static_cast<const float*>(grad);
  const __m512i exp = _mm512_set1_epi32(0x7f800000);
  size_t i = 0;
  while (i + 16 <= n) {
    const size_t chunk_end = i + kInfChunk < n ? i + kInfChunk : n;
    __mmask16 found = 0;
    for (; i + 16 <= chunk_end; i += 16) {
      const __m512i x = _mm512_and_si512(_mm512_loadu_si512(g + i), exp);
      found |= _mm512_cmpeq_epi32_mask(x, exp);
    }
    if (found) return true;
  }
  return has_inf_or_nan_tail(g, i, n);
}

template <class G, uint16_t kExpMask>
bool has_inf_or_nan_avx512_16(const void* grad, size_t n) {
  const G* g = static_cast<const G*>(grad);
  const __m512i exp = _mm512_set1_epi16(static_cast<short>(kExpMask));
  size_t i = 0;
  while (i + 32 <= n) {
    const size_t chunk_end = i + kInfChunk < n ? i + kInfChunk : n;
    __mmask32 found = 0;
    for (; i + 32 <= chunk_end; i += 32) {
      const __m512i x = _mm512_and_si512(_mm512_loadu_si512(g + i), exp);
      found |= _mm512_cmpeq_epi16_mask(x, exp);
    }
    if (found) return true;
  }
  return has_inf_or_nan_tail(g, i, n);
}

void scale_avx512(float* x, size_t n, float s) {
  const __m512 vs = _mm512_set1_ps(s);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(x + i, _mm512_mul_ps(_mm512_loadu_ps(x + i), vs));
  scale_tail(x, i, n, s);
}

KernelTable make_avx512_table() {
  KernelTable t;
  fill_step_kernels<Avx512Ops>(t);
  t.sum_of_squares[0] = &sum_of_squares_avx512<float>;
  t.sum_of_squares[1] = &sum_of_squares_avx512<Half>;
  t.sum_of_squares[2] = &sum_of_squares_avx512<BFloat16>;
  t.has_inf_or_nan[0] = &has_inf_or_nan_avx512_f32;
  t.has_inf_or_nan[1] = &has_inf_or_nan_avx512_16<Half, 0x7c00>;
  t.has_inf_or_nan[2] = &has_inf_or_nan_avx512_16<BFloat16, 0x7f80>;
  t.scale = &scale_avx512;
  return t;
}

}  // namespace

const KernelTable& kernels_avx512() {
  static const KernelTable table = make_avx512_table();
  return table;
}

}  // namespace zero::optim::detail

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
