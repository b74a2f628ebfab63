// The block-wise quantizer and the 8-bit AdamW step against scripts/adamw8bit_reference.py
// (optim/testdata/adamw8bit_reference.json): the maps and every case's codes and absmax bit for
// bit (a block with a negative absmax, a short block, all zeros, values across the decades, values
// exactly on the midpoints); the step gives the same bits on every SIMD path. (The training
// trajectory at stages 0-3: zero/adamw8bit_engine_test.cc.)
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <random>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/cpu.h"
#include "optim/adamw8bit.h"
#include "optim/dynamic_quantization.h"
#include "optim/step_coeffs.h"

namespace zero::optim {
namespace {

const nlohmann::json& reference() {
  static const nlohmann::json j = [] {
    std::ifstream in("optim/testdata/adamw8bit_reference.json");
    REQUIRE(in.good());
    return nlohmann::json::parse(in);
  }();
  return j;
}

TEST_CASE("the dynamic maps equal the reference's bit for bit, ascending, with 0 and 1") {
  for (const bool is_signed : {true, false}) {
    CAPTURE(is_signed);
    const std::vector<float> want = reference().at("map").at(is_signed ? "signed" : "unsigned").get<std::vector<float>>();
    const DynamicMap& map = dynamic_map(is_signed);
    REQUIRE(want.size() == 256);
    CHECK(std::memcmp(want.data(), map.values, sizeof map.values) == 0);
    for (int k = 1; k < 256; ++k) CHECK(map.values[k - 1] < map.values[k]);
    CHECK(map.values[255] == 1.0f);
    CHECK(map.values[is_signed ? 127 : 0] == 0.0f);
  }
  CHECK(dynamic_map(true).values[0] == -0.99296875f);  // the signed map has no -1
}

TEST_CASE("quantize_block gives the reference's absmax and codes, and dequantize_block map[code] * absmax") {
  int n = 0;
  for (const auto& c : reference().at("quantize_cases")) {
    CAPTURE(n);
    ++n;
    const bool is_signed = c.at("signed");
    const std::vector<float> x = c.at("input").get<std::vector<float>>();
    const std::vector<uint8_t> want = c.at("codes").get<std::vector<uint8_t>>();
    const DynamicMap& map = dynamic_map(is_signed);
    std::vector<uint8_t> codes(x.size());
    const float absmax = quantize_block(map, x.data(), x.size(), codes.data());
    CHECK(absmax == c.at("absmax").get<float>());
    CHECK(codes == want);
    std::vector<float> back(x.size());
    dequantize_block(map, codes.data(), codes.size(), absmax, back.data());
    for (size_t i = 0; i < x.size(); ++i) CHECK(back[i] == map.values[want[i]] * absmax);
    for (SimdPath path : supported_simd_paths()) {  // the vector kernels: the same bits
      CAPTURE(simd_path_name(path));
      const QuantizeKernels& k = quantize_kernels(path);
      std::vector<uint8_t> vcodes(x.size());
      CHECK(k.quantize_block(map, x.data(), x.size(), vcodes.data()) == absmax);
      CHECK(vcodes == want);
      std::vector<float> vback(x.size());
      k.dequantize_block(map, vcodes.data(), vcodes.size(), absmax, vback.data());
      CHECK(vback == back);
    }
    // Requantizing the dequantized values against the same absmax restores the codes (checkpoints).
    std::vector<uint8_t> again(x.size());
    quantize_with(map, back.data(), back.size(), absmax, again.data());
    for (size_t i = 0; i < x.size(); ++i) CHECK(map.values[again[i]] == map.values[codes[i]]);
  }
  CHECK(n == 9);
}

// Beyond the reference's nine blocks: every SIMD path's quantizer against the scalar rule on blocks
// of every length from 1 to 300 (each tail of the 8- and 16-lane loops), values over 12 decades
// with both signs, exact zeros, every map entry and every midpoint (the ties) in them.
TEST_CASE("every SIMD path quantizes and dequantizes as the scalar rule, at every block length") {
  std::mt19937 rng(20261206);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  std::uniform_int_distribution<int> decade(-12, 0);
  for (const bool is_signed : {true, false}) {
    const DynamicMap& map = dynamic_map(is_signed);
    for (size_t n = 1; n <= 300; ++n) {
      std::vector<float> x(n);
      for (size_t i = 0; i < n; ++i) {
        const float v = unit(rng) * std::pow(10.0f, static_cast<float>(decade(rng)));
        x[i] = i % 37 == 5 ? 0.0f : (is_signed ? v : std::fabs(v));
      }
      if (n >= 256) {  // the map's entries and midpoints themselves, scaled by an absmax of 1
        x[0] = 1.0f;
        for (size_t k = 1; k < 255 && k < n; ++k) x[k] = k % 2 ? map.values[k] : map.midpoints[k];
      }
      std::vector<uint8_t> want(n);
      std::vector<float> back(n);
      const float absmax = quantize_block(map, x.data(), n, want.data());
      dequantize_block(map, want.data(), n, absmax, back.data());
      for (SimdPath path : supported_simd_paths()) {
        CAPTURE(simd_path_name(path));
        CAPTURE(n);
        const QuantizeKernels& k = quantize_kernels(path);
        std::vector<uint8_t> codes(n);
        std::vector<float> values(n);
        REQUIRE(k.quantize_block(map, x.data(), n, codes.data()) == absmax);
        REQUIRE(codes == want);
        k.dequantize_block(map, codes.data(), n, absmax, values.data());
        REQUIRE(std::memcmp(values.data(), back.data(), n * sizeof(float)) == 0);
      }
    }
  }
}

TEST_CASE("adamw8bit_step gives the same bits on every SIMD path, with a short last block") {
  const size_t n = 1000, block = 256;  // blocks of 256, 256, 256, 232
  std::vector<float> grad(n);
  for (size_t i = 0; i < n; ++i) grad[i] = static_cast<float>(static_cast<int>(i * 7919 % 2001) - 1000) / 997.0f;
  Hyper h{.lr = 0.01f, .weight_decay = 0.1f, .beta1 = 0.9f, .beta2 = 0.95f};
  std::vector<std::vector<float>> results;
  for (SimdPath path : supported_simd_paths()) {
    std::vector<float> master(n, 0.25f);
    std::vector<uint8_t> mc(n, 0), vc(n, 0);
    std::vector<float> ma(4, 0.0f), va(4, 0.0f);
    for (int64_t step = 1; step <= 3; ++step) {
      StepCoeffs c = compute_step_coeffs(OptimizerKind::kAdamW8bit, h, step, 0.5f, false);
      StepInput in{.master = master.data(), .grad = grad.data(), .grad_scale = 0.5f};
      adamw8bit_step(in, n, block, c, {mc.data(), ma.data()}, {vc.data(), va.data()}, path);
    }
    CHECK(ma[3] > 0.0f);
    std::vector<float> all = master;
    all.insert(all.end(), ma.begin(), ma.end());
    all.insert(all.end(), va.begin(), va.end());
    for (size_t i = 0; i < n; ++i) all.push_back(static_cast<float>(mc[i] * 256 + vc[i]));
    results.push_back(std::move(all));
  }
  MESSAGE(results.size() << " SIMD path(s) compared");
  REQUIRE(!results.empty());
  for (size_t r = 1; r < results.size(); ++r) CHECK(results[r] == results[0]);
}

}  // namespace
}  // namespace zero::optim
