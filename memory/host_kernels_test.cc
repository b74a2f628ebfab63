// host_kernels::block_sum_of_squares against optim::sum_of_squares (the function the engine's
// global norm used before, and which the CUDA kernel must also match): bit for bit per block, for
// fp32/fp16/bf16, odd block sizes and every SIMD path optim has on this machine.
#include "memory/host_kernels.h"

#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "base/cpu.h"
#include "base/dtype.h"
#include "memory/device_test_util.h"
#include "optim/grad_utils.h"

namespace zero::memory {
namespace {

using testing::kFloatTypes;
using testing::pattern;

bool same(double a, double b) {
  return std::memcmp(&a, &b, sizeof a) == 0 || (std::isnan(a) && std::isnan(b));
}

TEST_CASE("block_sum_of_squares == optim::sum_of_squares per block, bit for bit") {
  const size_t blocks_of[] = {0, 1, 3, 15, 16, 17, 31, 33, 255, 1000, 4099, 100003};
  for (DType t : kFloatTypes) {
    for (bool finite : {true, false}) {
      for (size_t block : blocks_of) {
        const size_t blocks = block > 5000 ? 2 : 5;
        CAPTURE(dtype_name(t));
        CAPTURE(finite);
        CAPTURE(block);
        const auto x = pattern(t, block * blocks, 7 + static_cast<uint32_t>(block), finite);
        std::vector<double> out(blocks, -1.0);
        host_kernels::block_sum_of_squares(x.data(), t, block, blocks, out.data());
        for (SimdPath path : supported_simd_paths()) {
          CAPTURE(simd_path_name(path));
          for (size_t j = 0; j < blocks; ++j) {
            const double want = optim::sum_of_squares(x.data() + j * block * dtype_size(t), t,
                                                      block, 1.0f, path);
            CHECK(same(out[j], want));
          }
        }
        // Also the single-block form.
        if (blocks > 0) CHECK(same(host_kernels::sum_of_squares(x.data(), t, block), out[0]));
      }
    }
  }
}

TEST_CASE("convert matches base/dtype's scalar conversions, accumulate and scale the fp32 ops") {
  for (DType t : {DType::kFloat16, DType::kBFloat16}) {
    const size_t n = 5003;
    const auto x = pattern(DType::kFloat32, n, 3);
    std::vector<uint16_t> got(n), want(n);
    host_kernels::convert(x.data(), DType::kFloat32, got.data(), t, n);
    const auto* f = reinterpret_cast<const float*>(x.data());
    for (size_t i = 0; i < n; ++i) {
      want[i] = t == DType::kFloat16 ? fp32_to_fp16_bits(f[i]) : fp32_to_bf16_bits(f[i]);
    }
    CHECK(got == want);
    std::vector<float> back(n);
    host_kernels::convert(got.data(), t, back.data(), DType::kFloat32, n);
    bool ok = true;
    for (size_t i = 0; i < n; ++i) {
      const float w = t == DType::kFloat16 ? fp16_bits_to_fp32(got[i]) : bf16_bits_to_fp32(got[i]);
      ok &= std::memcmp(&w, &back[i], 4) == 0;
    }
    CHECK(ok);
  }
}

}  // namespace
}  // namespace zero::memory
