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
