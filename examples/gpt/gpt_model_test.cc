// The hand-written forward and backward against PyTorch (tests/data/pytorch/gpt, "check"): the loss
// within 1e-6 relative and every gradient tensor within 1e-5 x its largest magnitude.
#include "examples/gpt/gpt_model.h"

#include <doctest/doctest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "examples/gpt/gpt_reference.h"
#include "testing/testdata.h"

namespace zero::examples {
namespace {

nlohmann::json load(const std::string& name) {
  std::ifstream in(testing::testdata_path("gpt/" + name));
  return nlohmann::json::parse(in);
}

}  // namespace

TEST_CASE("parameter names and shapes are GPT-2's, in the reference's order") {
  const nlohmann::json ref = load("gpt_tiny_dp2.json");
  Gpt model(reference_config(ref), 1);
  REQUIRE(model.params().size() == ref["params"].size());
  for (size_t i = 0; i < model.params().size(); ++i) {
    CAPTURE(i);
    CHECK(model.params()[i].name == ref["params"][i]["name"].get<std::string>());
    CHECK(model.params()[i].shape == ref["params"][i]["shape"].get<std::vector<int64_t>>());
  }
}

TEST_CASE("forward loss and every gradient equal PyTorch's") {
  const nlohmann::json ref = load("gpt_tiny_dp2.json");
  Gpt model = reference_model(ref);
  // Units are entered and left in the documented order.
  std::vector<std::pair<int, bool>> visits;
  const CheckResult r = run_check(ref, model, [&](int u, bool backward) { visits.emplace_back(u, backward); });
  CHECK(r.loss == doctest::Approx(r.want_loss).epsilon(1e-6));
  const int L = model.config().n_layer;
  std::vector<std::pair<int, bool>> want{{0, false}};
  for (int l = 0; l < L; ++l) want.emplace_back(1 + l, false);
  want.insert(want.end(), {{L + 1, false}, {0, false}, {0, true}, {L + 1, true}});
  for (int l = L - 1; l >= 0; --l) want.emplace_back(1 + l, true);
  CHECK(visits == want);
  REQUIRE(r.grads.size() == model.params().size());
  for (const CheckResult::Grad& g : r.grads) {
    CAPTURE(g.name);
    CHECK(g.worst <= 1e-5 * g.largest);
  }
}

}  // namespace zero::examples
