#include "memory/block_quantization.h"

#include <algorithm>
#include <cstring>

#include "base/check.h"
#include "base/cpu.h"
#include "memory/block_quantization_kernels.h"
#include "memory/block_quantization_simd.h"

namespace zero::memory {

void check_block_quantization(const BlockQuantization& q, const char* what) {
  if (q.block == 0) ZERO_THROW(InvalidArgument, "{}: the quantization block must be positive", what);
  if (q.bits != 8 && q.bits != 4) {
    ZERO_THROW(InvalidArgument, "{}: quantization to {} bits (8 or 4 are offered)", what, q.bits);
  }
}

namespace host_kernels {
namespace {

// Elements widened per tile, on the stack of whichever thread runs the work.
constexpr size_t kTile = 1024;

const void* element(const void* base, DType dtype, size_t i) {
  return static_cast<const char*>(base) + i * dtype_size(dtype);
}

// n <= kTile elements as fp32: `src` itself for fp32, else widened into `tmp`.
const float* widen(const void* src, DType dtype, size_t n, float* tmp, SimdPath path) {
  switch (dtype) {
    case DType::kFloat16: convert_fp16_to_fp32(static_cast<const uint16_t*>(src), tmp, n, path); return tmp;
    case DType::kBFloat16: convert_bf16_to_fp32(static_cast<const uint16_t*>(src), tmp, n, path); return tmp;
    default: return static_cast<const float*>(src);
  }
}

// Elements e0.. e0 + m of int4 codes (a byte each, in [-8, 7]) into their nibbles, element e in
// byte e / 2, low nibble first; the bytes start as zeros. Whole bytes by the path's loop.
void pack_int4(const QuantizeLoops& loops, const uint8_t* c, size_t m, size_t e0, uint8_t* codes) {
  size_t i = 0;
  if (m > 0 && e0 % 2 == 1) codes[e0 / 2] |= static_cast<uint8_t>((c[i++] & 0xFu) << 4);
  uint8_t* out = codes + (e0 + i) / 2;
  const size_t pairs = (m - i) / 2;
  loops.pack4(c + i, pairs, out);
  i += 2 * pairs;
  if (i < m) out[pairs] |= static_cast<uint8_t>(c[i] & 0xFu);
}

// The reverse: elements e0.. e0 + m of the nibbles as int8 bytes (sign-extended).
void unpack_int4(const QuantizeLoops& loops, const uint8_t* codes, size_t m, size_t e0, uint8_t* c) {
  size_t i = 0;
  if (m > 0 && e0 % 2 == 1) c[i++] = widen_nibble(codes[e0 / 2] >> 4u);
  const uint8_t* in = codes + (e0 + i) / 2;
  const size_t pairs = (m - i) / 2;
  loops.unpack4(in, pairs, c + i);
  i += 2 * pairs;
  if (i < m) c[i] = widen_nibble(in[pairs]);
}

void narrow(const float* src, void* dst, DType dtype, size_t n, SimdPath path) {
  switch (dtype) {
    case DType::kFloat16: convert_fp32_to_fp16(src, static_cast<uint16_t*>(dst), n, path); return;
    case DType::kBFloat16: convert_fp32_to_bf16(src, static_cast<uint16_t*>(dst), n, path); return;
    default: std::memcpy(dst, src, n * sizeof(float)); return;
  }
}

}  // namespace

uint64_t quantize_blocks(const void* src, DType src_dtype, size_t n, const BlockQuantization& q, void* segment,
                         SimdPath path) {
  if (n == 0) return 0;  // an empty segment (whose pointer may be null)
  const QuantizeLoops& loops = quantize_loops(path);
  auto* scales = static_cast<float*>(segment);
  auto* codes = static_cast<uint8_t*>(segment) + q.blocks(n) * sizeof(float);
  // The padding (and int4's codes, filled a nibble at a time) starts as zeros: a segment's bytes are
  // a function of its values alone.
  const size_t after_scales = q.segment_bytes(n) - q.blocks(n) * sizeof(float);
  const size_t written = q.bits == 8 ? n : 0;
  std::memset(codes + written, 0, after_scales - written);
  const float qmax = static_cast<float>(q.qmax());
  uint64_t nonfinite = 0;
  float tmp[kTile];
  uint8_t tile_codes[kTile];  // int4's codes of a tile (a byte each), before they are packed
  // Stochastic rounding and int4 take the block loop below; int8 rounded to nearest, the fused
  // loops where they are.
  const bool stochastic = q.stochastic_key != 0;
  if (!stochastic && q.bits == 8 && src_dtype == DType::kBFloat16 && loops.quantize8_bf16 != nullptr) {
    return loops.quantize8_bf16(static_cast<const uint16_t*>(src), n, q.block, scales, codes);
  }
  if (!stochastic && q.bits == 8 && q.block <= kTile) {
    // Whole blocks a tile at a time, widened once: the common case in one call per tile.
    const size_t per = kTile / q.block * q.block;
    for (size_t first = 0; first < n; first += per) {
      const size_t m = std::min(per, n - first);
      const float* x = widen(element(src, src_dtype, first), src_dtype, m, tmp, path);
      nonfinite += loops.quantize8(x, m, q.block, scales + first / q.block, codes + first);
    }
    return nonfinite;
  }
  for (size_t first = 0, k = 0; first < n; first += q.block, ++k) {
    const size_t len = std::min(q.block, n - first);
    // A block within one tile is widened once for both passes; a longer one tile by tile, twice.
    const float* whole = len <= kTile ? widen(element(src, src_dtype, first), src_dtype, len, tmp, path) : nullptr;
    float absmax = 0.0f;
    for (size_t t = 0; t < len; t += kTile) {
      const size_t m = std::min(kTile, len - t);
      const float* x = whole != nullptr ? whole : widen(element(src, src_dtype, first + t), src_dtype, m, tmp, path);
      absmax = std::max(absmax, loops.absmax(x, m));
    }
    const BlockScale bs = block_scale(absmax, qmax);
    scales[k] = bs.scale;
    for (size_t t = 0; t < len; t += kTile) {
      const size_t m = std::min(kTile, len - t);
      const float* x = whole != nullptr ? whole : widen(element(src, src_dtype, first + t), src_dtype, m, tmp, path);
      const size_t e0 = first + t;
      uint8_t* c = q.bits == 8 ? codes + e0 : tile_codes;
      nonfinite += stochastic ? loops.codes_stochastic(x, m, bs.inv, qmax, q.stochastic_key, e0, c)
                              : loops.codes(x, m, bs.inv, qmax, c);
      if (q.bits == 4) pack_int4(loops, c, m, e0, codes);
    }
  }
  return nonfinite;
}

uint64_t quantize_blocks(const void* src, DType src_dtype, size_t n, const BlockQuantization& q, void* segment) {
  return quantize_blocks(src, src_dtype, n, q, segment, best_simd_path());
}

void dequantize_rows(const void* segments, size_t segment_stride, size_t rows, size_t n, const BlockQuantization& q,
                     void* dst, DType dst_dtype, size_t dst_stride, SimdPath path) {
  if (n == 0 || rows == 0) return;  // nothing (and pointers that may be null)
  const QuantizeLoops& loops = quantize_loops(path);
  const int marker = -q.qmax() - 1;
  const size_t es = dtype_size(dst_dtype);
  float tmp[kTile];
  uint8_t tile_codes[kTile];  // int4's codes of a tile, a byte each
  for (size_t r = 0; r < rows; ++r) {
    const auto* seg = static_cast<const uint8_t*>(segments) + r * segment_stride;
    const auto* scales = reinterpret_cast<const float*>(seg);
    const uint8_t* codes = seg + q.blocks(n) * sizeof(float);
    char* out = static_cast<char*>(dst) + r * dst_stride * es;
    if (q.bits == 8 && dst_dtype == DType::kBFloat16 && loops.decode8_bf16 != nullptr) {
      loops.decode8_bf16(codes, n, q.block, scales, reinterpret_cast<uint16_t*>(out));
      continue;
    }
    if (q.block <= kTile) {
      // Whole blocks a tile at a time: int4's unpacked once per tile, narrowed once per tile (fp32:
      // decoded in place).
      const size_t per = kTile / q.block * q.block;
      for (size_t first = 0; first < n; first += per) {
        const size_t m = std::min(per, n - first);
        const uint8_t* c = codes + first;
        if (q.bits == 4) {
          unpack_int4(loops, codes, m, first, tile_codes);
          c = tile_codes;
        }
        float* values = dst_dtype == DType::kFloat32 ? reinterpret_cast<float*>(out) + first : tmp;
        for (size_t b = 0; b < m; b += q.block) {
          loops.decode(c + b, std::min(q.block, m - b), scales[(first + b) / q.block], marker, values + b);
        }
        if (dst_dtype != DType::kFloat32) narrow(tmp, out + first * es, dst_dtype, m, path);
      }
      continue;
    }
    // Block by block, a tile at a time: a tile lies in one block, so it has one scale.
    for (size_t first = 0, k = 0; first < n; first += q.block, ++k) {
      const size_t len = std::min(q.block, n - first);
      for (size_t t = 0; t < len; t += kTile) {
        const size_t m = std::min(kTile, len - t), e0 = first + t;
        const uint8_t* c = codes + e0;
        if (q.bits == 4) {
          unpack_int4(loops, codes, m, e0, tile_codes);
          c = tile_codes;
        }
        loops.decode(c, m, scales[k], marker, tmp);
        narrow(tmp, out + e0 * es, dst_dtype, m, path);
      }
    }
  }
}

void dequantize_rows(const void* segments, size_t segment_stride, size_t rows, size_t n, const BlockQuantization& q,
                     void* dst, DType dst_dtype, size_t dst_stride) {
  dequantize_rows(segments, segment_stride, rows, n, q, dst, dst_dtype, dst_stride, best_simd_path());
}

}  // namespace host_kernels
}  // namespace zero::memory
