#include "base/dtype.h"

#include "base/simd.h"

#include "base/check.h"

namespace zero {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::kFloat32: return 4;
    case DType::kFloat16: return 2;
    case DType::kBFloat16: return 2;
    case DType::kFloat64: return 8;
    case DType::kInt32: return 4;
    case DType::kInt64: return 8;
    case DType::kUInt8: return 1;
  }
  ZERO_THROW(InvalidArgument, "unknown dtype value {}", static_cast<int>(t));
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kFloat32: return "fp32";
    case DType::kFloat16: return "fp16";
    case DType::kBFloat16: return "bf16";
    case DType::kFloat64: return "fp64";
    case DType::kInt32: return "int32";
    case DType::kInt64: return "int64";
    case DType::kUInt8: return "uint8";
  }
  return "unknown";
}

DType parse_dtype(std::string_view name) {
  for (DType t : {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kFloat64, DType::kInt32,
                  DType::kInt64, DType::kUInt8}) {
    if (name == dtype_name(t)) return t;
  }
  ZERO_THROW(InvalidArgument,
             "unknown dtype '{}' (expected fp32, fp16, bf16, fp64, int32, int64 or uint8)", name);
}

namespace {

// ---- scalar ----

void fp32_to_fp16_scalar(const float* src, uint16_t* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = fp32_to_fp16_bits(src[i]);
}
void fp16_to_fp32_scalar(const uint16_t* src, float* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = fp16_bits_to_fp32(src[i]);
}
void fp32_to_bf16_scalar(const float* src, uint16_t* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = fp32_to_bf16_bits(src[i]);
}
void bf16_to_fp32_scalar(const uint16_t* src, float* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = bf16_bits_to_fp32(src[i]);
}

// ---- AVX2 + F16C ----
// fp16 uses the F16C instructions, which round to nearest even and handle subnormals and NaN exactly.
// bf16 uses integer rounding (add 0x7fff + lsb, keep the high half) with NaN lanes quieted: the
// AVX-512 BF16 instruction (vcvtneps2bf16) treats subnormal inputs as zero, which would lose them.

__attribute__((target("avx2,fma,f16c"))) void fp32_to_fp16_avx2(const float* src, uint16_t* dst,
                                                               size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), h);
  }
  fp32_to_fp16_scalar(src + i, dst + i, n - i);
}

__attribute__((target("avx2,fma,f16c"))) void fp16_to_fp32_avx2(const uint16_t* src, float* dst,
                                                               size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
  }
  fp16_to_fp32_scalar(src + i, dst + i, n - i);
}

__attribute__((target("avx2,fma,f16c"))) inline __m128i bf16_round_avx2(__m256 v) {
  const __m256i x = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_srli_epi32(
      _mm256_add_epi32(x, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
  const __m256i quiet_nan = _mm256_or_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(0x40));
  const __m256i is_nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  const __m256i r = _mm256_blendv_epi8(rounded, quiet_nan, is_nan);
  // Pack the eight 32-bit lanes (values < 2^16) into 16-bit lanes, keeping order.
  const __m256i packed = _mm256_packus_epi32(r, r);  // per 128-bit half: a0..a3 a0..a3 | b0..b3 b0..b3
  const __m256i ordered = _mm256_permute4x64_epi64(packed, 0x08);  // a0..a3 b0..b3 in the low half
  return _mm256_castsi256_si128(ordered);
}

__attribute__((target("avx2,fma,f16c"))) void fp32_to_bf16_avx2(const float* src, uint16_t* dst,
                                                               size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), bf16_round_avx2(_mm256_loadu_ps(src + i)));
  }
  fp32_to_bf16_scalar(src + i, dst + i, n - i);
}

__attribute__((target("avx2,fma,f16c"))) void bf16_to_fp32_avx2(const uint16_t* src, float* dst,
                                                               size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i w =
        _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i)));
    _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)));
  }
  bf16_to_fp32_scalar(src + i, dst + i, n - i);
}

// ---- AVX-512 ----

#define ZERO_AVX512_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))

ZERO_AVX512_TARGET void fp32_to_fp16_avx512(const float* src, uint16_t* dst, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    // The maskz forms avoid GCC 12's false -Wmaybe-uninitialized in the unmasked intrinsics.
    const __m256i h =
        _mm512_maskz_cvtps_ph(0xffff, _mm512_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), h);
  }
  fp32_to_fp16_avx2(src + i, dst + i, n - i);
}

ZERO_AVX512_TARGET void fp16_to_fp32_avx512(const uint16_t* src, float* dst, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    _mm512_storeu_ps(dst + i, _mm512_maskz_cvtph_ps(0xffff, h));
  }
  fp16_to_fp32_avx2(src + i, dst + i, n - i);
}

ZERO_AVX512_TARGET void fp32_to_bf16_avx512(const float* src, uint16_t* dst, size_t n) {
  size_t i = 0;
  const __m512i one = _mm512_set1_epi32(1);
  const __m512i bias = _mm512_set1_epi32(0x7fff);
  const __m512i quiet = _mm512_set1_epi32(0x40);
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_loadu_ps(src + i);
    const __m512i x = _mm512_castps_si512(v);
    const __m512i hi = _mm512_srli_epi32(x, 16);
    const __m512i rounded =
        _mm512_srli_epi32(_mm512_add_epi32(x, _mm512_add_epi32(_mm512_and_si512(hi, one), bias)), 16);
    const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    const __m512i r = _mm512_mask_blend_epi32(nan, rounded, _mm512_or_si512(hi, quiet));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), _mm512_cvtepi32_epi16(r));
  }
  fp32_to_bf16_avx2(src + i, dst + i, n - i);
}

ZERO_AVX512_TARGET void bf16_to_fp32_avx512(const uint16_t* src, float* dst, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i w =
        _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i)));
    _mm512_storeu_ps(dst + i, _mm512_castsi512_ps(_mm512_slli_epi32(w, 16)));
  }
  bf16_to_fp32_avx2(src + i, dst + i, n - i);
}

// The supported paths are every path up to the best the CPU has: a compare, not a list built per
// call (kernels call the conversions a tile at a time).
void check_path_supported(SimdPath path) {
  static const SimdPath top = supported_simd_paths().back();
  if (path <= top && path >= SimdPath::kScalar) return;
  ZERO_THROW(InvalidArgument, "SIMD path {} is not supported by this CPU", simd_path_name(path));
}

template <typename Src, typename Dst>
using ConvertFn = void (*)(const Src*, Dst*, size_t);

template <typename Src, typename Dst>
void dispatch(const Src* src, Dst* dst, size_t n, SimdPath path, ConvertFn<Src, Dst> scalar,
              ConvertFn<Src, Dst> avx2, ConvertFn<Src, Dst> avx512) {
  switch (path) {
    case SimdPath::kAvx512: return avx512(src, dst, n);
    case SimdPath::kAvx2: return avx2(src, dst, n);
    case SimdPath::kScalar: return scalar(src, dst, n);
  }
}

}  // namespace

void convert_fp32_to_fp16(const float* src, uint16_t* dst, size_t n, SimdPath path) {
  check_path_supported(path);
  dispatch(src, dst, n, path, fp32_to_fp16_scalar, fp32_to_fp16_avx2, fp32_to_fp16_avx512);
}
void convert_fp16_to_fp32(const uint16_t* src, float* dst, size_t n, SimdPath path) {
  check_path_supported(path);
  dispatch(src, dst, n, path, fp16_to_fp32_scalar, fp16_to_fp32_avx2, fp16_to_fp32_avx512);
}
void convert_fp32_to_bf16(const float* src, uint16_t* dst, size_t n, SimdPath path) {
  check_path_supported(path);
  dispatch(src, dst, n, path, fp32_to_bf16_scalar, fp32_to_bf16_avx2, fp32_to_bf16_avx512);
}
void convert_bf16_to_fp32(const uint16_t* src, float* dst, size_t n, SimdPath path) {
  check_path_supported(path);
  dispatch(src, dst, n, path, bf16_to_fp32_scalar, bf16_to_fp32_avx2, bf16_to_fp32_avx512);
}

void convert_fp32_to_fp16(const float* src, uint16_t* dst, size_t n) {
  dispatch(src, dst, n, best_simd_path(), fp32_to_fp16_scalar, fp32_to_fp16_avx2,
           fp32_to_fp16_avx512);
}
void convert_fp16_to_fp32(const uint16_t* src, float* dst, size_t n) {
  dispatch(src, dst, n, best_simd_path(), fp16_to_fp32_scalar, fp16_to_fp32_avx2,
           fp16_to_fp32_avx512);
}
void convert_fp32_to_bf16(const float* src, uint16_t* dst, size_t n) {
  dispatch(src, dst, n, best_simd_path(), fp32_to_bf16_scalar, fp32_to_bf16_avx2,
           fp32_to_bf16_avx512);
}
void convert_bf16_to_fp32(const uint16_t* src, float* dst, size_t n) {
  dispatch(src, dst, n, best_simd_path(), bf16_to_fp32_scalar, bf16_to_fp32_avx2,
           bf16_to_fp32_avx512);
}

}  // namespace zero
