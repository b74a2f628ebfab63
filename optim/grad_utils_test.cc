// Gradient helpers on every SIMD path and length (vector tails), for fp32/fp16/bf16 data.
#include "optim/grad_utils.h"

#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "base/cpu.h"
#include "base/dtype.h"
#include "base/error.h"

namespace zero::optim {
namespace {

struct Data {
  std::vector<float> f32;
  std::vector<uint16_t> f16, bf16;
  const void* ptr(DType t) const {
    return t == DType::kFloat32 ? static_cast<const void*>(f32.data())
           : t == DType::kFloat16 ? static_cast<const void*>(f16.data())
                                  : static_cast<const void*>(bf16.data());
  }
  float value(DType t, size_t i) const {
    return t == DType::kFloat32 ? f32[i]
           : t == DType::kFloat16 ? fp16_bits_to_fp32(f16[i])
                                  : bf16_bits_to_fp32(bf16[i]);
  }
};

Data random_data(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, 3.f);
  Data d;
  for (size_t i = 0; i < n; ++i) {
    const float x = dist(rng);
    d.f32.push_back(x);
    d.f16.push_back(fp32_to_fp16_bits(x));
    d.bf16.push_back(fp32_to_bf16_bits(x));
  }
  return d;
}

const DType kTypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};

TEST_CASE("sum_of_squares: close to a long double sum, and bitwise equal on every path") {
  for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{15}, size_t{16}, size_t{17}, size_t{33},
                   size_t{100}, size_t{1000}, size_t{100003}}) {
    const Data d = random_data(n, static_cast<uint32_t>(n));
    for (DType t : kTypes) {
      for (float scale : {1.0f, 0.37f}) {
        long double ref = 0;
        for (size_t i = 0; i < n; ++i) {
          const long double x = d.value(t, i) * scale;  // the fp32 product, as documented
          ref += x * x;
        }
        const double first = sum_of_squares(d.ptr(t), t, n, scale, SimdPath::kScalar);
        CHECK(std::fabs(first - static_cast<double>(ref)) <= 1e-12 * static_cast<double>(ref));
        for (SimdPath path : supported_simd_paths()) {
          CAPTURE(n);
          CAPTURE(dtype_name(t));
          CAPTURE(simd_path_name(path));
          const double got = sum_of_squares(d.ptr(t), t, n, scale, path);
          CHECK(std::memcmp(&got, &first, sizeof got) == 0);
        }
        CHECK(sum_of_squares(d.ptr(t), t, n, scale) == first);
      }
    }
  }
}

TEST_CASE("sum_of_squares propagates Inf and NaN") {
  std::vector<float> g(40, 1.f);
  g[37] = std::numeric_limits<float>::infinity();
  for (SimdPath path : supported_simd_paths()) {
    CHECK(std::isinf(sum_of_squares(g.data(), DType::kFloat32, g.size(), 1.f, path)));
  }
  g[3] = std::numeric_limits<float>::quiet_NaN();
  for (SimdPath path : supported_simd_paths()) {
    CHECK(std::isnan(sum_of_squares(g.data(), DType::kFloat32, g.size(), 1.f, path)));
  }
}

TEST_CASE("has_inf_or_nan finds one bad element anywhere, on every path and dtype") {
  const float bad_values[] = {std::numeric_limits<float>::infinity(),
                              -std::numeric_limits<float>::infinity(),
                              std::numeric_limits<float>::quiet_NaN()};
  for (SimdPath path : supported_simd_paths()) {
    for (DType t : kTypes) {
      CAPTURE(simd_path_name(path));
      CAPTURE(dtype_name(t));
      for (size_t n = 0; n <= 70; ++n) {
        Data d = random_data(n, 3);
        CHECK_FALSE(has_inf_or_nan(d.ptr(t), t, n, path));
        for (size_t pos = 0; pos < n; ++pos) {
          for (float bad : bad_values) {
            Data e = d;
            e.f32[pos] = bad;
            e.f16[pos] = fp32_to_fp16_bits(bad);
            e.bf16[pos] = fp32_to_bf16_bits(bad);
            CAPTURE(n);
            CAPTURE(pos);
            REQUIRE(has_inf_or_nan(e.ptr(t), t, n, path));
          }
        }
      }
      // Large arrays: the bad element in the last chunk, in the tail, or absent; largest finite
      // values are not flagged.
      const size_t n = 100007;
      Data d = random_data(n, 4);
      d.f32[5] = std::numeric_limits<float>::max();
      d.f16[5] = 0x7bff;   // 65504
      d.bf16[5] = 0x7f7f;  // largest finite bf16
      CHECK_FALSE(has_inf_or_nan(d.ptr(t), t, n, path));
      for (size_t pos : {size_t{0}, size_t{4095}, size_t{4096}, size_t{50000}, n - 17, n - 1}) {
        Data e = d;
        e.f32[pos] = NAN;
        e.f16[pos] = 0x7e00;
        e.bf16[pos] = 0xffc0;
        CAPTURE(pos);
        CHECK(has_inf_or_nan(e.ptr(t), t, n, path));
      }
    }
  }
}

TEST_CASE("scale_in_place multiplies every element in fp32 on every path") {
  for (SimdPath path : supported_simd_paths()) {
    for (size_t n : {size_t{0}, size_t{5}, size_t{16}, size_t{31}, size_t{1001}}) {
      const Data d = random_data(n, 5);
      std::vector<float> x = d.f32;
      scale_in_place(x.data(), n, 0.3f, path);
      for (size_t i = 0; i < n; ++i) REQUIRE(x[i] == d.f32[i] * 0.3f);
    }
  }
  std::vector<float> x = {1.f, 2.f};
  scale_in_place(x.data(), 2, 0.5f);
  CHECK(x == std::vector<float>{0.5f, 1.f});
}

TEST_CASE("clip_coefficient follows torch.nn.utils.clip_grad_norm_") {
  CHECK(clip_coefficient(0.5, 1.0) == 1.0f);
  CHECK(clip_coefficient(4.0, 1.0) == static_cast<float>(1.0 / (4.0 + 1e-6)));  // in double, rounded once
  CHECK(clip_coefficient(3.0, 1.5) == static_cast<float>(1.5 / (3.0 + 1e-6)));
  CHECK(clip_coefficient(4.0, 0.0) == 1.0f);  // clipping off
  CHECK(clip_coefficient(INFINITY, 1.0) == 0.0f);
  CHECK(std::isnan(clip_coefficient(NAN, 1.0)));
}

TEST_CASE("bad dtype and null data are errors naming the function") {
  std::vector<double> g(4, 1.0);
  const auto message = [](auto&& fn) -> std::string {
    try {
      fn();
    } catch (const InvalidArgument& e) {
      return e.what();
    }
    return "";
  };
  CHECK(message([&] { sum_of_squares(g.data(), DType::kFloat64, 4); }).find(
            "sum_of_squares: dtype must be fp32, fp16 or bf16 (got fp64)") != std::string::npos);
  CHECK(message([&] { has_inf_or_nan(g.data(), DType::kInt32, 4); }).find("has_inf_or_nan: dtype") !=
        std::string::npos);
  CHECK(message([&] { has_inf_or_nan(nullptr, DType::kFloat32, 4); }).find("null data") !=
        std::string::npos);
  CHECK_FALSE(has_inf_or_nan(nullptr, DType::kFloat32, 0));
  CHECK(sum_of_squares(nullptr, DType::kFloat32, 0) == 0.0);
}

}  // namespace
}  // namespace zero::optim
