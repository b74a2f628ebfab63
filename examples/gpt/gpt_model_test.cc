// The hand-written forward and backward against PyTorch (tests/data/pytorch/gpt, "check"): the loss
// within 1e-6 relative and every gradient tensor within 1e-5 x its largest magnitude.
#include "examples/gpt/gpt_model.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "testing/testdata.h"

namespace zero::examples {
namespace {

nlohmann::json load(const std::string& name) {
  std::ifstream in(testing::testdata_path("gpt/" + name));
  return nlohmann::json::parse(in);
}

GptConfig config_of(const nlohmann::json& j) {
  const auto& c = j["config"];
  return {c["vocab_size"], c["block_size"], c["n_embd"], c["n_head"], c["n_layer"]};
}

}  // namespace

TEST_CASE("parameter names and shapes are GPT-2's, in the reference's order") {
  const nlohmann::json ref = load("gpt_tiny_dp2.json");
  Gpt model(config_of(ref), 1);
  REQUIRE(model.params().size() == ref["params"].size());
  for (size_t i = 0; i < model.params().size(); ++i) {
    CAPTURE(i);
    CHECK(model.params()[i].name == ref["params"][i]["name"].get<std::string>());
    CHECK(model.params()[i].shape == ref["params"][i]["shape"].get<std::vector<int64_t>>());
  }
}

TEST_CASE("forward loss and every gradient equal PyTorch's") {
  const nlohmann::json ref = load("gpt_tiny_dp2.json");
  Gpt model(config_of(ref), 1);
  for (auto& p : model.params()) p.values = ref["initial_params"][p.name].get<std::vector<float>>();
  const auto rows = ref["check"]["tokens"].get<std::vector<std::vector<int>>>();
  const int B = static_cast<int>(rows.size());
  const int T = static_cast<int>(rows[0].size()) - 1;
  std::vector<int> tokens, targets;
  for (const auto& r : rows) {
    tokens.insert(tokens.end(), r.begin(), r.end() - 1);
    targets.insert(targets.end(), r.begin() + 1, r.end());
  }
  std::vector<std::vector<float>> grads;
  for (const auto& p : model.params()) grads.emplace_back(p.values.size(), 0.0f);
  Gpt::Access access;
  access.grad = [&](size_t i) { return grads[i].data(); };
  // Units are entered and left in the documented order.
  std::vector<std::pair<int, bool>> visits;
  access.enter = [&](int u, bool backward) { visits.emplace_back(u, backward); };
  const float loss = model.forward(tokens, targets, B, T, access);
  CHECK(loss == doctest::Approx(ref["check"]["loss"].get<double>()).epsilon(1e-6));
  model.backward(1.0f, access);
  const int L = model.config().n_layer;
  std::vector<std::pair<int, bool>> want{{0, false}};
  for (int l = 0; l < L; ++l) want.emplace_back(1 + l, false);
  want.insert(want.end(), {{L + 1, false}, {0, false}, {0, true}, {L + 1, true}});
  for (int l = L - 1; l >= 0; --l) want.emplace_back(1 + l, true);
  CHECK(visits == want);
  for (size_t i = 0; i < model.params().size(); ++i) {
    const std::string& name = model.params()[i].name;
    CAPTURE(name);
    const auto want_g = ref["check"]["grads"][name].get<std::vector<float>>();
    REQUIRE(want_g.size() == grads[i].size());
    double largest = 0, worst = 0;
    for (size_t e = 0; e < want_g.size(); ++e) {
      largest = std::max(largest, std::fabs(static_cast<double>(want_g[e])));
      worst = std::max(worst, std::fabs(static_cast<double>(want_g[e]) - grads[i][e]));
    }
    CHECK(worst <= 1e-5 * largest);
  }
}

}  // namespace zero::examples
