#include "comm/gloo/reduce_kernels.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

namespace zero::comm {
namespace {

TEST_CASE("fp32 sum, avg, max, min over several sources and block boundaries") {
  const size_t n = 3000;  // crosses the 1024-element blocks with a partial tail
  std::vector<float> a(n), b(n), c(n), out(n);
  for (size_t i = 0; i < n; ++i) {
    a[i] = static_cast<float>(i % 13);
    b[i] = -static_cast<float>(i % 7);
    c[i] = 2.0f;
  }
  const void* srcs[] = {a.data(), b.data(), c.data()};
  reduce_arrays(DType::kFloat32, ReduceOp::kSum, srcs, 3, out.data(), n);
  for (size_t i = 0; i < n; ++i) REQUIRE(out[i] == a[i] + b[i] + c[i]);
  reduce_arrays(DType::kFloat32, ReduceOp::kAvg, srcs, 3, out.data(), n);
  for (size_t i = 0; i < n; ++i) REQUIRE(out[i] == (a[i] + b[i] + c[i]) / 3.0f);
  reduce_arrays(DType::kFloat32, ReduceOp::kMax, srcs, 3, out.data(), n);
  for (size_t i = 0; i < n; ++i) REQUIRE(out[i] == std::max({a[i], b[i], c[i]}));
  reduce_arrays(DType::kFloat32, ReduceOp::kMin, srcs, 3, out.data(), n);
  for (size_t i = 0; i < n; ++i) REQUIRE(out[i] == std::min({a[i], b[i], c[i]}));
}

TEST_CASE("the destination may be one of the sources") {
  std::vector<double> a = {1, 2, 3}, b = {10, 20, 30};
  const void* srcs[] = {a.data(), b.data()};
  reduce_arrays(DType::kFloat64, ReduceOp::kSum, srcs, 2, b.data(), 3);
  CHECK(b == std::vector<double>{11, 22, 33});
}

TEST_CASE("fp16 and bf16 sums accumulate in fp32 and round once") {
  // fp16: 2048 + 1 + 1 + 1 = 2051 -> 2052 (one rounding). A 16-bit accumulator stays at 2048.
  std::vector<uint16_t> big(5, fp32_to_fp16_bits(2048.0f)), one(5, fp32_to_fp16_bits(1.0f));
  std::vector<uint16_t> out(5);
  const void* srcs[] = {big.data(), one.data(), one.data(), one.data()};
  reduce_arrays(DType::kFloat16, ReduceOp::kSum, srcs, 4, out.data(), 5);
  for (auto h : out) CHECK(fp16_bits_to_fp32(h) == 2052.0f);
  // bf16: 256 + 1 + 1 = 258 exactly.
  std::vector<uint16_t> bbig(5, fp32_to_bf16_bits(256.0f)), bone(5, fp32_to_bf16_bits(1.0f));
  const void* bsrcs[] = {bbig.data(), bone.data(), bone.data()};
  reduce_arrays(DType::kBFloat16, ReduceOp::kSum, bsrcs, 3, out.data(), 5);
  for (auto h : out) CHECK(bf16_bits_to_fp32(h) == 258.0f);
  // avg: the fp32 quotient rounded once.
  reduce_arrays(DType::kBFloat16, ReduceOp::kAvg, bsrcs, 3, out.data(), 5);
  for (auto h : out) CHECK(h == fp32_to_bf16_bits(258.0f / 3.0f));
  reduce_arrays(DType::kFloat16, ReduceOp::kMax, srcs, 4, out.data(), 5);
  for (auto h : out) CHECK(fp16_bits_to_fp32(h) == 2048.0f);
}

TEST_CASE("integer sums wrap and averages truncate") {
  std::vector<int32_t> a = {std::numeric_limits<int32_t>::max(), -7, 7};
  std::vector<int32_t> b = {1, 0, 0};
  std::vector<int32_t> out(3);
  const void* srcs[] = {a.data(), b.data()};
  reduce_arrays(DType::kInt32, ReduceOp::kSum, srcs, 2, out.data(), 3);
  CHECK(out[0] == std::numeric_limits<int32_t>::min());
  reduce_arrays(DType::kInt32, ReduceOp::kAvg, srcs, 2, out.data(), 3);
  CHECK(out[1] == -3);
  CHECK(out[2] == 3);
  std::vector<int64_t> c = {5, -5}, d = {-9, 9};
  std::vector<int64_t> o64(2);
  const void* s64[] = {c.data(), d.data()};
  reduce_arrays(DType::kInt64, ReduceOp::kMin, s64, 2, o64.data(), 2);
  CHECK(o64 == std::vector<int64_t>{-9, -5});
  std::vector<uint8_t> u = {250, 3}, v = {10, 4}, o8(2);
  const void* s8[] = {u.data(), v.data()};
  reduce_arrays(DType::kUInt8, ReduceOp::kSum, s8, 2, o8.data(), 2);
  CHECK(o8 == std::vector<uint8_t>{4, 7});
}

}  // namespace
}  // namespace zero::comm
