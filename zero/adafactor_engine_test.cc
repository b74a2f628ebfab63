// Adafactor in the engine against the reference of scripts/adafactor_reference.py
// (optim/testdata/adafactor_reference.json: numpy from the paper's algorithm), at stages 0-3 on 1, 2
// and 3 ranks and offloaded, with buckets and rank chunks small enough to cut the matrices across
// ranks (so the row and column sums are reduced over the shard group, zero/adafactor_stats.h): after
// every step each tensor within 1e-6 of its largest reference value (the sums are in double, in
// another order than numpy's). Also: deterministic mode gives the same bits at every stage; a
// checkpoint after step 3 (R and C, a vector's V) resumes at other stages and world sizes, holding
// R and C at O(n + m) bytes per matrix; the memory report prices O(n + m) per matrix; a vector group, a matrix and a 3-D kernel.
// The relative-step group keeps a first moment (adafactor.beta1 0.9, state "exp_avg_update"); a
// beta1 changed between steps is taken where the group has a first moment and refused across 0.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "testing/reference_training.h"
#include "testing/thread_ranks.h"
#include "zero/checkpoint/checkpoint_reader.h"
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
  // The file holds R once per row and C once per column of each piece of a matrix (O(n + m), not 4
  // bytes per element each), and the states an element does not keep (a matrix's V, a vector's R
  // and C) as one value per piece.
  const Manifest saved = read_manifest(dir);
  for (const ReferenceParam& p : reference().model.params) {
    CAPTURE(p.name);
    const bool adafactor = reference().groups.at(static_cast<size_t>(p.group)).kind == optim::OptimizerKind::kAdafactor;
    const bool matrix = adafactor && p.shape.size() >= 2;
    const size_t cols = matrix ? p.numel() / static_cast<size_t>(p.shape[0]) : 0;
    for (const SavedPiece& sp : saved.pieces.at(p.name)) {
      CAPTURE(sp.kind);
      const size_t n = sp.end - sp.begin;
      if (sp.kind == "state:exp_avg_sq_row") {
        CHECK(sp.bytes == (matrix ? 4 * ((n + sp.begin % cols + cols - 1) / cols) : 4));
      } else if (sp.kind == "state:exp_avg_sq_col") {
        CHECK(sp.bytes == (matrix ? 4 * std::min(n, cols) : 4));
      } else if (sp.kind == "state:exp_avg_sq" && matrix) {
        CHECK(sp.bytes == 4);
      }
    }
  }
  using Run = ReferenceRun;
  for (const Run& run : {Run{.stage = 0, .world = 1, .resume_from = dir}, Run{.stage = 3, .world = 3, .resume_from = dir},
                        Run{.stage = 1, .world = 2, .offload = true, .resume_from = dir}}) {
    CAPTURE(describe(run));
    CHECK(train_ranks(run).errors.size() == 2);
  }
}

// One rank: the reference model's parameters in an engine of its options, `steps` steps of the
// reference's gradients, `change` called on the engine before the step numbered `change_before`;
// the parameters after, or the error a step raised (an exception may not leave a rank's thread).
struct ChangedRun {
  testing::Tensors params;
  std::string error;
};
ChangedRun steps_with_change(int steps, int change_before, const std::function<void(Engine&)>& change) {
  ChangedRun out;
  testing::run_thread_ranks(1, [&](comm::Communicator& comm) {
    const testing::ReferenceModel& m = model();
    Engine engine(comm, options_of({.stage = 1, .world = 1}));
    std::vector<std::vector<float>> storage(m.params.size());
    std::vector<int> ids;
    for (size_t t = 0; t < m.params.size(); ++t) {
      storage[t] = m.initial(t);
      ids.push_back(engine.add_param({.name = m.params[t].name, .shape = m.params[t].shape, .dtype = DType::kFloat32,
                                      .data = {storage[t].data(), storage[t].size()}, .group = m.params[t].group}));
    }
    engine.finalize();
    try {
      for (int step = 1; step <= steps; ++step) {
        if (step == change_before) change(engine);
        for (size_t t = 0; t < m.params.size(); ++t) {
          const std::vector<float> g = testing::rank_grad(m, 1, 0, step, t);
          std::memcpy(engine.grad_as<float>(ids[t]), g.data(), g.size() * sizeof(float));
        }
        engine.step();
      }
    } catch (const InvalidArgument& e) {
      out.error = e.what();
    }
    for (size_t t = 0; t < m.params.size(); ++t) out.params[m.params[t].name] = storage[t];
  });
  return out;
}

TEST_CASE("adafactor.beta1 changed between steps: taken where the group keeps a first moment, refused across 0") {
  // Group 1 keeps a first moment (beta1 0.9), group 0 none. Another beta1 in (0, 1) for group 1 is
  // the next step's: its parameters move otherwise than without the change, group 0's do not.
  auto to_half = [](Engine& e) { e.param_group(1).adafactor.beta1 = 0.5f; };
  const ChangedRun same = steps_with_change(3, 3, [](Engine&) {}), changed = steps_with_change(3, 3, to_half);
  REQUIRE(same.error.empty());
  REQUIRE(changed.error.empty());
  CHECK(changed.params.at("h1.w") != same.params.at("h1.w"));
  CHECK(changed.params.at("h0.w") == same.params.at("h0.w"));
  CHECK(steps_with_change(2, 3, to_half).params.at("h1.w") == steps_with_change(2, 3, [](Engine&) {}).params.at("h1.w"));
  // Across 0 the state would have to appear or go: refused, naming the group, before the step
  // changes a parameter.
  const ChangedRun off = steps_with_change(3, 2, [](Engine& e) { e.param_group(1).adafactor.beta1 = 0.0f; });
  CHECK(off.error.find("groups[1].adafactor.beta1 changed to 0 after the engine was built") != std::string::npos);
  CHECK(off.params.at("h1.w") == steps_with_change(1, 2, [](Engine&) {}).params.at("h1.w"));
  const ChangedRun on = steps_with_change(3, 2, [](Engine& e) { e.param_group(0).adafactor.beta1 = 0.9f; });
  CHECK(on.error.find("groups[0].adafactor.beta1 changed from 0 after the engine was built") != std::string::npos);
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
