// Adafactor in the engine against the reference of scripts/adafactor_reference.py
// (optim/testdata/adafactor_reference.json: numpy from the paper's algorithm), at stages 0-3 on 1, 2
// and 3 ranks and offloaded, with buckets and rank chunks small enough to cut the matrices across
// ranks (so the row and column sums are reduced over the shard group, zero/adafactor_stats.h): after
// every step each tensor within 1e-6 of its largest reference value (the sums are in double, in
// another order than numpy's). Also: deterministic mode gives the same bits at every stage; a
// checkpoint after step 3 (R and C per element, a vector's V) resumes at other stages and world
// sizes; the memory report prices O(n + m) per matrix; a vector group, a matrix and a 3-D kernel.
// The relative-step group keeps a first moment (adafactor.beta1 0.9, state "exp_avg_update").
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "testing/reference_training.h"
#include "zero/engine.h"

namespace zero {
namespace {

using testing::ReferenceParam;
using testing::ReferenceRun;

struct Reference {
  size_t zero_grad_elements = 0;
  int world = 0;
  std::vector<optim::Hyper> groups;
  std::vector<testing::Tensors> after;  // [step - 1]
  testing::ReferenceModel model;
};

const Reference& reference() {
  static const Reference ref = [] {
    std::ifstream in("optim/testdata/adafactor_reference.json");
    REQUIRE(in.good());
    const nlohmann::json j = nlohmann::json::parse(in);
    Reference r;
    r.world = j.at("world_size");
    r.zero_grad_elements = j.at("zero_grad").at("elements");
    REQUIRE(j.at("zero_grad").at("name") == "emb");
    testing::ReferenceModel& m = r.model;
    m.steps = j.at("steps");
    for (const auto& p : j.at("params")) m.params.push_back({p.at("name"), p.at("shape"), p.at("group")});
    for (const auto& g : j.at("groups")) {
      optim::Hyper h{.lr = g.at("lr"), .weight_decay = g.at("weight_decay")};
      h.kind = optim::parse_optimizer(g.at("kind").get<std::string>());
      if (h.kind == optim::OptimizerKind::kAdafactor) {
        h.adafactor = {.eps1 = g.at("eps1"), .eps2 = g.at("eps2"), .clip_threshold = g.at("clip_threshold"),
                       .decay_rate = g.at("decay_rate"), .relative_step = g.at("relative_step"),
                       .beta1 = g.value("beta1", 0.0f)};
      } else {
        h.beta1 = g.at("betas").at(0);
        h.beta2 = g.at("betas").at(1);
        h.eps = g.at("eps");
      }
      r.groups.push_back(h);
    }
    for (const auto& step : j.at("params_after_step")) r.after.push_back(testing::tensors_of(step));
    return r;
  }();
  return ref;
}

const testing::ReferenceModel& model() {
  static const testing::ReferenceModel m = testing::pattern_model(
      reference().model.params, reference().model.steps, "emb", reference().zero_grad_elements,
      [](int step, const std::string& name) { return &reference().after.at(static_cast<size_t>(step - 1)).at(name); });
  return m;
}

// Small buckets and blocks: the matrices' rows are cut across rank chunks.
EngineOptions options_of(const ReferenceRun& run) {
  return testing::reference_options(run, reference().groups, {.alignment = 4, .bucket_numel = 640, .block = 16});
}

testing::ReferenceResult train_ranks(const ReferenceRun& run) {
  return testing::train_reference_ranks(model(), options_of(run), run, 1e-6);
}

TEST_CASE("Adafactor matches its reference at stages 0-3, on 1, 2 and 3 ranks, and offloaded") {
  REQUIRE(reference().world == 2);
  for (const ReferenceRun& run : testing::reference_runs()) {
    CAPTURE(describe(run));
    const testing::ReferenceResult t = train_ranks(run);
    REQUIRE(t.errors.size() == static_cast<size_t>(model().steps));
    MESSAGE(describe(run) << ": largest error after the last step, relative to the tensor's largest value: "
                          << t.errors.at(model().steps));
  }
}

TEST_CASE("Adafactor in deterministic mode gives the same bits at every stage, offloaded or not") {
  for (const int world : {2, 3}) {
    CAPTURE(world);
    const testing::ReferenceResult base = train_ranks({.stage = 0, .world = world, .deterministic = true});
    for (const ReferenceRun& run : testing::deterministic_runs(world)) {
      CAPTURE(describe(run));
      testing::check_same_bits(base.params, train_ranks(run).params);
    }
  }
}

TEST_CASE("Adafactor's row, column and vector statistics resume from a checkpoint at another stage and world size") {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = std::string(tmp != nullptr ? tmp : "/tmp") + "/adafactor_engine_test_checkpoint";
  std::filesystem::remove_all(dir);
  train_ranks({.stage = 2, .world = 2, .save_after_step_3 = dir});
  using Run = ReferenceRun;
  for (const Run& run : {Run{.stage = 0, .world = 1, .resume_from = dir}, Run{.stage = 3, .world = 3, .resume_from = dir},
                        Run{.stage = 1, .world = 2, .offload = true, .resume_from = dir}}) {
    CAPTURE(describe(run));
    CHECK(train_ranks(run).errors.size() == 2);
  }
}

TEST_CASE("the memory report prices Adafactor's state: rows plus columns per matrix, an element per vector element, "
          "and one per element with a first moment") {
  const Reference& ref = reference();
  uint64_t expected = 0;
  for (const ReferenceParam& p : ref.model.params) {
    const optim::Hyper& h = ref.groups[static_cast<size_t>(p.group)];
    if (h.kind != optim::OptimizerKind::kAdafactor) {
      expected += 8 * p.numel();
      continue;
    }
    if (h.adafactor.beta1 > 0.0f) expected += 4 * p.numel();  // the first moment
    if (p.shape.size() >= 2) {
      expected += 4 * (static_cast<uint64_t>(p.shape[0]) + p.numel() / static_cast<uint64_t>(p.shape[0]));
    } else {
      expected += 4 * p.numel();
    }
  }
  for (const bool offload : {false, true}) {
    CAPTURE(offload);
    testing::check_state_bytes(options_of({.stage = 1, .world = 1, .offload = offload}), ref.model.params, expected);
  }
}

}  // namespace
}  // namespace zero
