#include "memory/block_quantization.h"
#include "memory/block_quantization_kernels.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "base/cpu.h"
#include "base/error.h"
#include "memory/device.h"
#include "memory/meta_device.h"
#include "memory/tracker.h"

namespace zero::memory {
namespace {

using host_kernels::dequantize_rows;
using host_kernels::quantize_blocks;

std::vector<uint8_t> quantize(const std::vector<float>& x, const BlockQuantization& q, uint64_t* bad = nullptr) {
  std::vector<uint8_t> seg(q.segment_bytes(x.size()), 0xAB);  // garbage the quantizer must overwrite
  const uint64_t n = quantize_blocks(x.data(), DType::kFloat32, x.size(), q, seg.data());
  if (bad != nullptr) *bad = n;
  return seg;
}

std::vector<float> dequantize(const std::vector<uint8_t>& seg, size_t n, const BlockQuantization& q) {
  std::vector<float> out(n);
  dequantize_rows(seg.data(), seg.size(), 1, n, q, out.data(), DType::kFloat32, n);
  return out;
}

float scale_at(const std::vector<uint8_t>& seg, size_t k) {
  float s = 0;
  std::memcpy(&s, seg.data() + k * sizeof(float), sizeof s);
  return s;
}

TEST_CASE("segment sizes: the scales, the codes (int4 two per byte), padded to 4 bytes") {
  const BlockQuantization int8{.block = 4, .bits = 8}, int4{.block = 4, .bits = 4};
  CHECK(int8.blocks(9) == 3);
  CHECK(int8.segment_bytes(9) == 3 * 4 + 12);  // 12 scale bytes + 9 codes, padded to 24
  CHECK(int4.segment_bytes(9) == 3 * 4 + 8);   // 12 + 5 code bytes, padded to 20
  CHECK(int8.segment_bytes(0) == 0);
  CHECK_THROWS_WITH_AS(check_block_quantization({.block = 256, .bits = 5}, "qwZ"),
                       doctest::Contains("qwZ: quantization to 5 bits (8 or 4 are offered)"), InvalidArgument);
  CHECK_THROWS_WITH_AS(check_block_quantization({.block = 0}, "qwZ"), doctest::Contains("block must be positive"),
                       InvalidArgument);
}

TEST_CASE("int8 by hand: codes rint(x * 127 / absmax), ties to even, within half a scale") {
  const BlockQuantization q{.block = 4, .bits = 8};
  const std::vector<float> x = {1.0f, -0.5f, 0.25f, 0.1f};
  const std::vector<uint8_t> seg = quantize(x, q);
  CHECK(scale_at(seg, 0) == 1.0f / 127.0f);
  // 127, -63.5 -> -64 (even), 31.75 -> 32, 12.7 -> 13.
  const int8_t want[] = {127, -64, 32, 13};
  for (size_t i = 0; i < 4; ++i) CHECK(static_cast<int8_t>(seg[4 + i]) == want[i]);
  const std::vector<float> back = dequantize(seg, x.size(), q);
  for (size_t i = 0; i < 4; ++i) {
    CHECK(back[i] == static_cast<float>(want[i]) * (1.0f / 127.0f));
    CHECK(std::fabs(back[i] - x[i]) <= 0.5f / 127.0f * (1 + 1e-6f));
  }
}

TEST_CASE("int4 by hand at an odd size: two codes per byte, low nibble first, a short last block") {
  const BlockQuantization q{.block = 2, .bits = 4};
  const std::vector<float> x = {1.0f, -0.5f, 0.25f, 0.0f, -2.0f};
  const std::vector<uint8_t> seg = quantize(x, q);
  REQUIRE(seg.size() == 16);  // 3 scales, 3 code bytes, 1 byte of padding
  CHECK(scale_at(seg, 0) == 1.0f / 7.0f);
  CHECK(scale_at(seg, 1) == 0.25f / 7.0f);
  CHECK(scale_at(seg, 2) == 2.0f / 7.0f);
  // [7, rint(-3.5) = -4] [7, 0] [-7]: 0xC7, 0x07, 0x09 (-7 is 1001), then the zeroed padding.
  CHECK(seg[12] == 0xC7);
  CHECK(seg[13] == 0x07);
  CHECK(seg[14] == 0x09);
  CHECK(seg[15] == 0x00);
  const std::vector<float> back = dequantize(seg, x.size(), q);
  const float scales[] = {1.0f / 7.0f, 0.25f / 7.0f, 2.0f / 7.0f};
  for (size_t i = 0; i < x.size(); ++i) {
    CAPTURE(i);
    CHECK(std::fabs(back[i] - x[i]) <= scales[i / 2] / 2 * (1 + 1e-6f));
  }
}

TEST_CASE("a block of zeros (or of values below 2^-120) has scale 0 and comes back as zeros") {
  const BlockQuantization q{.block = 3, .bits = 8};
  const std::vector<float> x = {0.0f, -0.0f, 0x1p-121f, 1.0f, 0.0f, 0.0f};
  const std::vector<uint8_t> seg = quantize(x, q);
  CHECK(scale_at(seg, 0) == 0.0f);
  const std::vector<float> back = dequantize(seg, x.size(), q);
  CHECK(back[0] == 0.0f);
  CHECK(back[2] == 0.0f);
  CHECK(back[3] == 1.0f);
}

TEST_CASE("a non-finite element keeps its own element (NaN), the block's scale is of the rest, and it is counted") {
  for (int bits : {8, 4}) {
    CAPTURE(bits);
    const BlockQuantization q{.block = 4, .bits = bits};
    const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
    const std::vector<float> x = {1.0f, nan, -inf, 0.5f, 2.0f, inf, 0.0f, 0.0f};
    uint64_t bad = 0;
    const std::vector<uint8_t> seg = quantize(x, q, &bad);
    CHECK(bad == 3);
    CHECK(scale_at(seg, 0) == 1.0f / static_cast<float>(q.qmax()));
    CHECK(scale_at(seg, 1) == 2.0f / static_cast<float>(q.qmax()));
    const std::vector<float> back = dequantize(seg, x.size(), q);
    CHECK(std::isnan(back[1]));
    CHECK(std::isnan(back[2]));
    CHECK(std::isnan(back[5]));
    for (size_t i : {0u, 3u, 4u, 6u, 7u}) {
      CAPTURE(i);
      CHECK(std::isfinite(back[i]));
      CHECK(std::fabs(back[i] - x[i]) <= scale_at(seg, i / 4) / 2 * (1 + 1e-6f));
    }
  }
}

TEST_CASE("round trips in every dtype, block and size: within half a scale plus the destination's rounding") {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  for (int bits : {8, 4}) {
    for (size_t block : {1u, 7u, 256u, 1000u, 3000u}) {
      for (size_t n : {0u, 1u, 255u, 257u, 5000u}) {
        for (DType dt : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
          CAPTURE(bits);
          CAPTURE(block);
          CAPTURE(n);
          CAPTURE(dtype_name(dt));
          const BlockQuantization q{.block = block, .bits = bits};
          std::vector<float> x(n);
          for (float& v : x) v = normal(rng);
          // The source in `dt` (what is quantized is its value), the destination in `dt` too.
          std::vector<uint16_t> narrow(n);
          std::vector<float> exact(x);
          if (dt == DType::kBFloat16) {
            convert_fp32_to_bf16(x.data(), narrow.data(), n);
            convert_bf16_to_fp32(narrow.data(), exact.data(), n);
          } else if (dt == DType::kFloat16) {
            convert_fp32_to_fp16(x.data(), narrow.data(), n);
            convert_fp16_to_fp32(narrow.data(), exact.data(), n);
          }
          const void* src = dt == DType::kFloat32 ? static_cast<const void*>(x.data()) : narrow.data();
          std::vector<uint8_t> seg(q.segment_bytes(n));
          CHECK(quantize_blocks(src, dt, n, q, seg.data()) == 0);
          // Two rows (the same segment twice) into a strided destination.
          std::vector<uint8_t> two(2 * seg.size());
          if (!seg.empty()) {
            std::memcpy(two.data(), seg.data(), seg.size());
            std::memcpy(two.data() + seg.size(), seg.data(), seg.size());
          }
          std::vector<uint8_t> out(2 * (n + 3) * dtype_size(dt));
          dequantize_rows(two.data(), seg.size(), 2, n, q, out.data(), dt, n + 3);
          for (size_t r = 0; r < 2; ++r) {
            std::vector<float> back(n);
            const uint8_t* row = out.data() + r * (n + 3) * dtype_size(dt);
            if (n == 0) {
              continue;  // nothing to read back (and back.data() may be null)
            } else if (dt == DType::kFloat32) {
              std::memcpy(back.data(), row, n * sizeof(float));
            } else if (dt == DType::kBFloat16) {
              convert_bf16_to_fp32(reinterpret_cast<const uint16_t*>(row), back.data(), n);
            } else {
              convert_fp16_to_fp32(reinterpret_cast<const uint16_t*>(row), back.data(), n);
            }
            const float rel = dt == DType::kBFloat16 ? 0x1p-8f : dt == DType::kFloat16 ? 0x1p-11f : 0.0f;
            size_t worst = 0;
            for (size_t i = 0; i < n; ++i) {
              const float bound = scale_at(seg, i / block) / 2 * (1 + 1e-6f) + std::fabs(back[i]) * rel + 1e-30f;
              if (!(std::fabs(back[i] - exact[i]) <= bound)) ++worst;
            }
            CHECK(worst == 0);
          }
        }
      }
    }
  }
}

TEST_CASE("every SIMD path writes the same segment bytes and the same values, NaN and Inf included") {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (size_t n : {1u, 15u, 16u, 17u, 300u, 4099u}) {
    for (size_t block : {5u, 16u, 256u, 301u}) {
      for (DType dt : {DType::kFloat32, DType::kBFloat16}) {
        CAPTURE(n);
        CAPTURE(block);
        CAPTURE(dtype_name(dt));
        std::vector<float> x(n);
        for (size_t i = 0; i < n; ++i) x[i] = normal(rng) * (i % 7 == 0 ? 100.0f : 1.0f);
        if (n > 3) x[3] = std::numeric_limits<float>::quiet_NaN();
        if (n > 20) x[20] = -std::numeric_limits<float>::infinity();
        std::vector<uint16_t> xb(n);
        convert_fp32_to_bf16(x.data(), xb.data(), n);
        const void* src = dt == DType::kFloat32 ? static_cast<const void*>(x.data()) : xb.data();
        for (int bits : {8, 4}) {
         for (uint64_t key : {uint64_t{0}, uint64_t{0x5EED}}) {  // round to nearest, stochastic
          CAPTURE(key);
          const BlockQuantization q{.block = block, .bits = bits, .stochastic_key = key};
          std::vector<uint8_t> first;
          std::vector<uint16_t> first_out;
          for (SimdPath path : supported_simd_paths()) {
            CAPTURE(simd_path_name(path));
            std::vector<uint8_t> seg(q.segment_bytes(n), 0x5A);
            const uint64_t bad = quantize_blocks(src, dt, n, q, seg.data(), path);
            CHECK(bad == (n > 20 ? 2u : n > 3 ? 1u : 0u));
            std::vector<uint16_t> out(n);
            dequantize_rows(seg.data(), seg.size(), 1, n, q, out.data(), DType::kBFloat16, n, path);
            if (first.empty()) {
              first = seg;
              first_out = out;
            }
            CHECK(seg == first);
            CHECK(out == first_out);
          }
         }
        }
      }
    }
  }
}

// The stochastic rule restated from memory/block_quantization.h, for one element.
int stochastic_code(float x, float inv, int qmax, uint64_t key, size_t i) {
  uint64_t z = key;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  const auto k = static_cast<uint32_t>((z ^ (z >> 31)) >> 32);
  uint32_t h = k ^ (static_cast<uint32_t>(i) * 0x9E3779B9u);
  h ^= h >> 16;
  h *= 0x7FEB352Du;
  h ^= h >> 15;
  h *= 0x846CA68Bu;
  h ^= h >> 16;
  const float u = static_cast<float>(h >> 8) / 16777216.0f;
  const float y = x * inv;
  const float c = std::floor(y + u);
  return static_cast<int>(std::min(std::max(c, static_cast<float>(-qmax)), static_cast<float>(qmax)));
}

TEST_CASE("stochastic rounding: the documented draw, each code's mean the value, within one scale, keyed") {
  // One block of 4096 (int8) whose largest value 127 makes the scale 1: every other element is 0.3,
  // which round-to-nearest would zero.
  const size_t n = 4096;
  std::vector<float> x(n, 0.3f);
  x[0] = 127.0f;
  for (int bits : {8, 4}) {
    CAPTURE(bits);
    const float top = bits == 8 ? 127.0f : 7.0f;  // int4: the largest value's scale makes 0.3 tiny steps
    x[0] = top;
    const BlockQuantization q{.block = n, .bits = bits, .stochastic_key = 42};
    const std::vector<uint8_t> seg = quantize(x, q);
    CHECK(scale_at(seg, 0) == 1.0f);
    const std::vector<float> back = dequantize(seg, n, q);
    double sum = 0;
    for (size_t i = 0; i < n; ++i) {
      CAPTURE(i);
      REQUIRE(back[i] == static_cast<float>(stochastic_code(x[i], 1.0f, q.qmax(), 42, i)));
      CHECK(std::fabs(back[i] - x[i]) < 1.0f);
      if (i > 0) sum += back[i];
    }
    // 4095 draws of 0 or 1 with mean 0.3: the mean's standard deviation is 0.007.
    CHECK(sum / (n - 1) == doctest::Approx(0.3).epsilon(0.1));
    CHECK(back[0] == top);
    // Another key draws otherwise; round to nearest gives zeros.
    CHECK(quantize(x, {.block = n, .bits = bits, .stochastic_key = 43}) != seg);
    CHECK(quantize(x, q) == seg);
    const std::vector<float> nearest = dequantize(quantize(x, {.block = n, .bits = bits}), n, q);
    CHECK(nearest[1] == 0.0f);
  }
}

TEST_CASE("stochastic rounding on every SIMD path: the documented draw at every element, keys of 64 bits") {
  // Blocks shorter than a vector, over a tile (1024) and across tiles, so that the vector loops
  // start at many element indices; a key with its top bits set; values over many scales.
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const size_t n = 4500;
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) x[i] = normal(rng) * (i % 11 == 0 ? 300.0f : 1.0f);
  const uint64_t key = 0xF00D000000000001ull;
  for (SimdPath path : supported_simd_paths()) {
    for (int bits : {8, 4}) {
      for (size_t block : {16u, 300u, 2000u}) {
        const std::string path_name(simd_path_name(path));
        CAPTURE(path_name);
        CAPTURE(bits);
        CAPTURE(block);
        const BlockQuantization q{.block = block, .bits = bits, .stochastic_key = key};
        std::vector<uint8_t> seg(q.segment_bytes(n), 0xAB);
        CHECK(quantize_blocks(x.data(), DType::kFloat32, n, q, seg.data(), path) == 0);
        const std::vector<float> back = dequantize(seg, n, q);
        for (size_t first = 0, k = 0; first < n; first += block, ++k) {
          float absmax = 0;
          for (size_t i = first; i < std::min(n, first + block); ++i) absmax = std::max(absmax, std::fabs(x[i]));
          const float inv = static_cast<float>(q.qmax()) / absmax;
          for (size_t i = first; i < std::min(n, first + block); ++i) {
            CAPTURE(i);
            REQUIRE(back[i] == static_cast<float>(stochastic_code(x[i], inv, q.qmax(), key, i)) * scale_at(seg, k));
          }
        }
      }
    }
  }
}

TEST_CASE("the devices: the host device and the meta device write the kernels' bytes, count, and refuse bad arguments") {
  const BlockQuantization q{.block = 8, .bits = 4};
  std::vector<float> x(37);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(static_cast<float>(i)) * (i == 5 ? 1e3f : 1.0f);
  x[11] = std::numeric_limits<float>::quiet_NaN();
  const std::vector<uint8_t> want = quantize(x, q);
  MemoryTracker tracker;
  std::unique_ptr<Device> host = make_host_device(tracker);
  std::unique_ptr<MetaDevice> meta = make_meta_device(tracker);
  for (Device* d : {host.get(), static_cast<Device*>(meta.get())}) {
    CAPTURE(d->name());
    Buffer src = d->allocate(x.size() * sizeof(float), Category::kOther);
    Buffer seg = d->allocate(q.segment_bytes(x.size()), Category::kOther);
    Buffer count = d->allocate(sizeof(uint64_t), Category::kOther);
    Stream& s = d->compute_stream();
    d->copy(src.data(), x.data(), x.size() * sizeof(float), s);
    d->fill_zero(count.data(), sizeof(uint64_t), s);
    d->quantize_blocks(src.data(), DType::kFloat32, x.size(), q, seg.data(), count.as<uint64_t>(), s);
    d->quantize_blocks(src.data(), DType::kFloat32, x.size(), q, seg.data(), count.as<uint64_t>(), s);
    Buffer out = d->allocate(x.size() * sizeof(float), Category::kOther);
    d->dequantize_rows(seg.data(), seg.size_bytes(), 1, x.size(), q, out.data(), DType::kFloat32, x.size(), s);
    d->synchronize(s, std::chrono::seconds(10));
    CHECK(std::memcmp(seg.data(), want.data(), want.size()) == 0);
    CHECK(*count.as<uint64_t>() == 2);  // one NaN, counted by each call
    CHECK(out.as<float>()[0] == dequantize(want, x.size(), q)[0]);
    CHECK_THROWS_WITH_AS(
        d->quantize_blocks(src.data(), DType::kFloat32, x.size(), {.block = 8, .bits = 2}, seg.data(), nullptr, s),
        doctest::Contains("quantize_blocks: quantization to 2 bits"), InvalidArgument);
    CHECK_THROWS_WITH_AS(
        d->dequantize_rows(seg.data(), seg.size_bytes() - 1, 2, x.size(), q, out.data(), DType::kFloat32, x.size(), s),
        doctest::Contains("the rows overlap"), InvalidArgument);
    CHECK_THROWS_WITH_AS(
        d->dequantize_rows(seg.data(), seg.size_bytes(), 1, x.size(), q, out.data(), DType::kInt32, x.size(), s),
        doctest::Contains("dtype must be fp32, fp16 or bf16"), InvalidArgument);
  }
}

}  // namespace
}  // namespace zero::memory
