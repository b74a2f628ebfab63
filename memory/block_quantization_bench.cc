// block_quantization_bench: the host quantizer and dequantizer (memory/block_quantization.h) against
// the bound of their own memory traffic, measured in the same run on one thread (a host stream's).
//
//   bazel run -c opt //memory:block_quantization_bench -- [--millions=16] [--rounds=5]
//
// Quantizing n fp32 (or bf16) elements to int8 reads 4n (2n) bytes and writes n and a scale per
// block; dequantizing reads n and writes 4n (2n). The bound moves exactly those bytes with no
// arithmetic, vectorized as the kernels are (AVX-512 where the CPU has it): each output byte the
// top byte of its input (quantize), each output element its code widened (dequantize). Times are
// the best of --rounds runs after a warm-up.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "base/cpu.h"
#include "base/simd.h"
#include "memory/block_quantization.h"
#include "memory/block_quantization_kernels.h"

namespace zero::memory {
namespace {

using Clock = std::chrono::steady_clock;

template <typename F>
double best_of(int rounds, F&& f) {
  f();  // warm-up: pages touched, caches as in a steady state
  double best = 1e30;
  for (int r = 0; r < rounds; ++r) {
    const auto t0 = Clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return best;
}

// The quantizer's traffic without its arithmetic: a byte out per element in (its top byte), and
// the scales; AVX-512 where the CPU has it, as the kernels.
#define BENCH_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2")))

BENCH_AVX512 void quantize_traffic_avx512(const void* x, size_t n, size_t es, uint8_t* out) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i w = es == 4 ? _mm512_srli_epi32(_mm512_loadu_si512(static_cast<const float*>(x) + i), 24)
                              : _mm512_srli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(
                                                      reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(x) + i))),
                                                  8);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), _mm512_cvtepi32_epi8(w));
  }
}

// The dequantizer's traffic: each code widened into its element (its bits).
BENCH_AVX512 void dequantize_traffic_avx512(const uint8_t* codes, size_t n, size_t es, void* out) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + i));
    if (es == 4) {
      _mm512_storeu_si512(static_cast<float*>(out) + i, _mm512_cvtepi8_epi32(c));
    } else {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(static_cast<uint16_t*>(out) + i), _mm256_cvtepi8_epi16(c));
    }
  }
}

void quantize_traffic(const void* x, size_t n, size_t es, size_t block, uint8_t* out, float* scales) {
  if (cpu_features().avx512bw) {
    quantize_traffic_avx512(x, n, es, out);
  } else {
    for (size_t i = 0; i < n; ++i) out[i] = static_cast<const uint8_t*>(x)[i * es + es - 1];
  }
  for (size_t k = 0; k < (n + block - 1) / block; ++k) scales[k] = 1.0f;
}

void dequantize_traffic(const uint8_t* codes, size_t n, size_t es, void* out) {
  if (cpu_features().avx512bw) {
    dequantize_traffic_avx512(codes, n, es, out);
  } else {
    for (size_t i = 0; i < n; ++i) static_cast<uint8_t*>(out)[i * es] = codes[i];
  }
}

int run(int argc, char** argv) {
  size_t millions = 16;
  int rounds = 5;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--millions=", 0) == 0) {
      millions = std::stoul(a.substr(11));
    } else if (a.rfind("--rounds=", 0) == 0) {
      rounds = std::stoi(a.substr(9));
    } else {
      std::fprintf(stderr, "block_quantization_bench: unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  const size_t n = millions << 20;
  const BlockQuantization q{.block = 256, .bits = 8};
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) x[i] = std::sin(static_cast<float>(i) * 0.001f) * 0.02f;
  std::vector<uint16_t> xb(n);
  convert_fp32_to_bf16(x.data(), xb.data(), n);
  std::vector<uint8_t> seg(q.segment_bytes(n));
  std::vector<float> outf(n);
  std::vector<uint16_t> outb(n);
  std::vector<float> scales(q.blocks(n));
  uint8_t* codes = seg.data() + q.blocks(n) * sizeof(float);

  std::printf("%zuM elements, int8 blocks of %zu, one thread\n\n", millions, q.block);
  std::printf("| kernel | time | same traffic, no math | of the bound | GB/s moved |\n");
  std::printf("| --- | --- | --- | --- | --- |\n");
  auto row = [&](const char* name, double t, double bound, double bytes) {
    std::printf("| %s | %.2f ms | %.2f ms | %.0f%% | %.1f |\n", name, 1e3 * t, 1e3 * bound, 100 * bound / t,
                bytes / t / 1e9);
  };
  const double qb = static_cast<double>(n) * 5, qbb = static_cast<double>(n) * 3;
  row("quantize fp32 -> int8",
      best_of(rounds, [&] { host_kernels::quantize_blocks(x.data(), DType::kFloat32, n, q, seg.data()); }),
      best_of(rounds, [&] { quantize_traffic(x.data(), n, 4, q.block, codes, scales.data()); }), qb);
  // qgZ's stochastic rounding (memory/block_quantization.h): a hash drawn per element.
  BlockQuantization stochastic = q;
  stochastic.stochastic_key = 0x5EED;
  row("quantize fp32 -> int8, stochastic",
      best_of(rounds, [&] { host_kernels::quantize_blocks(x.data(), DType::kFloat32, n, stochastic, seg.data()); }),
      best_of(rounds, [&] { quantize_traffic(x.data(), n, 4, q.block, codes, scales.data()); }), qb);
  // int4 (qgZ's): half a byte per element out; the bound is int8's traffic (a byte per element),
  // which the int4 kernels' half-sized writes do not reach below.
  BlockQuantization int4 = q;
  int4.bits = 4;
  BlockQuantization int4_stochastic = int4;
  int4_stochastic.stochastic_key = 0x5EED;
  std::vector<uint8_t> seg4(int4.segment_bytes(n));
  row("quantize fp32 -> int4",
      best_of(rounds, [&] { host_kernels::quantize_blocks(x.data(), DType::kFloat32, n, int4, seg4.data()); }),
      best_of(rounds, [&] { quantize_traffic(x.data(), n, 4, q.block, codes, scales.data()); }), qb);
  row("quantize fp32 -> int4, stochastic",
      best_of(rounds, [&] { host_kernels::quantize_blocks(x.data(), DType::kFloat32, n, int4_stochastic, seg4.data()); }),
      best_of(rounds, [&] { quantize_traffic(x.data(), n, 4, q.block, codes, scales.data()); }), qb);
  row("dequantize int4 -> fp32",
      best_of(rounds,
              [&] {
                host_kernels::dequantize_rows(seg4.data(), seg4.size(), 1, n, int4, outf.data(), DType::kFloat32, n);
              }),
      best_of(rounds, [&] { dequantize_traffic(codes, n, 4, outf.data()); }), qb);
  row("quantize bf16 -> int8",
      best_of(rounds, [&] { host_kernels::quantize_blocks(xb.data(), DType::kBFloat16, n, q, seg.data()); }),
      best_of(rounds, [&] { quantize_traffic(xb.data(), n, 2, q.block, codes, scales.data()); }), qbb);
  row("dequantize int8 -> fp32",
      best_of(rounds,
              [&] {
                host_kernels::dequantize_rows(seg.data(), seg.size(), 1, n, q, outf.data(), DType::kFloat32, n);
              }),
      best_of(rounds, [&] { dequantize_traffic(codes, n, 4, outf.data()); }), qb);
  row("dequantize int8 -> bf16",
      best_of(rounds,
              [&] {
                host_kernels::dequantize_rows(seg.data(), seg.size(), 1, n, q, outb.data(), DType::kBFloat16, n);
              }),
      best_of(rounds, [&] { dequantize_traffic(codes, n, 2, outb.data()); }), qbb);
  return 0;
}

}  // namespace
}  // namespace zero::memory

int main(int argc, char** argv) { return zero::memory::run(argc, argv); }
