// Newton-Schulz orthogonalization against the PyTorch reference of scripts/muon_reference.py
// (optim/testdata/muon_reference.json: square, wide, tall and 3-step cases, fp32 on both sides):
// every element within 4e-6 of the reference's largest (measured here: at most 1.6e-6). The products
// sum in another order than PyTorch's, and five steps of a quintic map amplify those roundings.
// Also: the output's singular values are near 1 (X X^T near the identity), in place equals out of
// place bit for bit, a zero matrix stays zero, and bad shapes are refused by name.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/float16.h"
#include "optim/newton_schulz.h"

namespace zero::optim {
namespace {

const nlohmann::json& reference() {
  static const nlohmann::json doc = [] {
    std::ifstream in("optim/testdata/muon_reference.json");
    REQUIRE(in.good());
    return nlohmann::json::parse(in).at("newton_schulz");
  }();
  return doc;
}

TEST_CASE("newton_schulz matches the PyTorch reference") {
  const nlohmann::json& ref = reference();
  REQUIRE(ref.at("cases").size() >= 5);
  for (const auto& c : ref.at("cases")) {
    const size_t rows = c.at("rows"), cols = c.at("cols");
    const int steps = c.at("steps");
    CAPTURE(rows);
    CAPTURE(cols);
    CAPTURE(steps);
    const std::vector<float> in = c.at("input").get<std::vector<float>>();
    const std::vector<float> expected = c.at("output").get<std::vector<float>>();
    std::vector<float> out(in.size());
    newton_schulz(in.data(), rows, cols, out.data(), {.steps = steps});
    float largest = 0, worst = 0;
    for (size_t i = 0; i < out.size(); ++i) {
      largest = std::max(largest, std::fabs(expected[i]));
      worst = std::max(worst, std::fabs(out[i] - expected[i]));
    }
    CHECK(worst <= 4e-6f * largest);
    MESSAGE(rows << " x " << cols << ", " << steps << " steps: largest difference " << worst / largest
                 << " of the largest element");
    // In place: the same bits.
    std::vector<float> inplace = in;
    newton_schulz(inplace.data(), rows, cols, inplace.data(), {.steps = steps});
    CHECK(inplace == out);
  }
}

// bf16 (NewtonSchulzOptions::bf16) against the reference's bf16 run (scripts/reference_optimizers.py:
// each operation's result rounded to bf16, products summed in fp32, as a GPU's bf16 units do): only
// the order of a product's fp32 sum differs, so the results agree but for an element whose rounding
// that order flips, and what it feeds (measured here: every element equal in all four cases).
TEST_CASE("newton_schulz in bf16 matches the reference's bf16 rounding, and differs from fp32 by it") {
  const nlohmann::json& cases = reference().at("bf16_cases");
  REQUIRE(cases.size() == 4);
  for (const auto& c : cases) {
    const size_t rows = c.at("rows"), cols = c.at("cols");
    CAPTURE(rows);
    CAPTURE(cols);
    const std::vector<float> in = c.at("input").get<std::vector<float>>();
    const std::vector<float> expected = c.at("output").get<std::vector<float>>();
    std::vector<float> out(in.size()), fp32(in.size());
    newton_schulz(in.data(), rows, cols, out.data(), {.steps = c.at("steps"), .bf16 = true});
    newton_schulz(in.data(), rows, cols, fp32.data(), {.steps = c.at("steps")});
    float largest = 0, worst = 0, from_fp32 = 0;
    size_t same = 0;
    for (size_t i = 0; i < out.size(); ++i) {
      largest = std::max(largest, std::fabs(expected[i]));
      worst = std::max(worst, std::fabs(out[i] - expected[i]));
      from_fp32 = std::max(from_fp32, std::fabs(out[i] - fp32[i]));
      same += out[i] == expected[i] ? 1 : 0;
      CHECK(out[i] == bf16_bits_to_fp32(fp32_to_bf16_bits(out[i])));  // bf16 values
    }
    CHECK(worst <= 2e-2f * largest);
    CHECK(from_fp32 > 1e-3f * largest);  // the option does round
    MESSAGE(rows << " x " << cols << " in bf16: " << same << " of " << out.size()
                 << " elements equal to the reference's, the largest difference " << worst / largest
                 << " of the largest element; " << from_fp32 / largest << " from the fp32 result");
  }
}

TEST_CASE("newton_schulz brings the singular values near 1") {
  const nlohmann::json& c = reference().at("cases").at(3);  // 16 x 48, five steps
  const size_t rows = c.at("rows"), cols = c.at("cols");
  const std::vector<float> in = c.at("input").get<std::vector<float>>();
  std::vector<float> x(in.size());
  newton_schulz(in.data(), rows, cols, x.data());
  // X X^T's eigenvalues are the squared singular values; the quintic leaves them in about
  // [0.5, 1.5] rather than at 1, so check the diagonal and that the rest is small beside it.
  for (size_t i = 0; i < rows; ++i) {
    for (size_t j = 0; j < rows; ++j) {
      double dot = 0;
      for (size_t k = 0; k < cols; ++k) dot += static_cast<double>(x[i * cols + k]) * x[j * cols + k];
      if (i == j) {
        CHECK(dot > 0.4);
        CHECK(dot < 1.6);
      } else {
        CHECK(std::fabs(dot) < 0.5);
      }
    }
  }
}

TEST_CASE("newton_schulz keeps a zero matrix zero and refuses empty shapes") {
  std::vector<float> z(12, 0.0f), out(12, 1.0f);
  newton_schulz(z.data(), 3, 4, out.data());
  CHECK(std::all_of(out.begin(), out.end(), [](float v) { return v == 0.0f; }));
  CHECK_THROWS_WITH_AS(newton_schulz(z.data(), 0, 4, out.data()), doctest::Contains("0 x 4"), InvalidArgument);
  CHECK_THROWS_WITH_AS(newton_schulz(z.data(), 3, 4, out.data(), {.steps = -1}), doctest::Contains("steps"),
                       InvalidArgument);
  CHECK(newton_schulz_flops(4, 8, 5) == newton_schulz_flops(8, 4, 5));
  CHECK(newton_schulz_flops(4, 8, 5) == 2.0 * 5 * (2.0 * 16 * 8 + 64));
}

}  // namespace
}  // namespace zero::optim
