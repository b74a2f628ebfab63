// Adafactor in the engine against the reference of scripts/adafactor_reference.py
// (optim/testdata/adafactor_reference.json: numpy from the paper's algorithm), at stages 0-3 on 1, 2
// and 3 ranks and offloaded, with buckets and rank chunks small enough to cut the matrices across
// ranks (so the row and column sums are reduced over the shard group, zero/adafactor_stats.h): after
// every step each tensor within 1e-6 of its largest reference value (the sums are in double, in
// another order than numpy's). Also: deterministic mode gives the same bits at every stage; a
// checkpoint after step 3 (R and C per element, a vector's V) resumes at other stages and world
// sizes; the memory report prices O(n + m) per matrix; a vector group, a matrix and a 3-D kernel.
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
#include "testing/steps_reference.h"
#include "testing/thread_ranks.h"
#include "zero/engine.h"

namespace zero {
namespace {

using namespace std::chrono_literals;
using testing::Tensors;

struct Param {
  std::string name;
  std::vector<int64_t> shape;
  int group = 0;
  size_t numel() const { return shape_numel(shape); }
};

struct Reference {
  int world = 0, steps = 0;
  size_t zero_grad_elements = 0;
  std::vector<Param> params;
  std::vector<optim::Hyper> groups;
  std::vector<Tensors> after;  // [step - 1]
};

const Reference& reference() {
  static const Reference ref = [] {
    std::ifstream in("optim/testdata/adafactor_reference.json");
    REQUIRE(in.good());
    const nlohmann::json j = nlohmann::json::parse(in);
    Reference r;
    r.world = j.at("world_size");
    r.steps = j.at("steps");
    r.zero_grad_elements = j.at("zero_grad").at("elements");
    REQUIRE(j.at("zero_grad").at("name") == "emb");
    for (const auto& p : j.at("params")) r.params.push_back({p.at("name"), p.at("shape"), p.at("group")});
    for (const auto& g : j.at("groups")) {
      optim::Hyper h{.lr = g.at("lr"), .weight_decay = g.at("weight_decay")};
      h.kind = optim::parse_optimizer(g.at("kind").get<std::string>());
      if (h.kind == optim::OptimizerKind::kAdafactor) {
        h.adafactor = {.eps1 = g.at("eps1"), .eps2 = g.at("eps2"), .clip_threshold = g.at("clip_threshold"),
                       .decay_rate = g.at("decay_rate"), .relative_step = g.at("relative_step")};
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

// Gradients of step s (1-based) on reference rank r, by tensor index.
std::vector<float> reference_grad(int step, int rank, size_t index) {
  const Reference& ref = reference();
  std::vector<float> g = testing::pattern(100 * step + 10 * rank + static_cast<int64_t>(index), ref.params[index].numel(),
                                          static_cast<float>(0.3 + 0.2 * rank));
  if (ref.params[index].name == "emb") std::fill(g.begin(), g.begin() + static_cast<long>(ref.zero_grad_elements), 0.0f);
  return g;
}

// Rank r's gradient: one rank brings the reference ranks' mean, a third brings it again.
std::vector<float> grad_of(int world, int rank, int step, size_t index) {
  const std::vector<float> g0 = reference_grad(step, 0, index), g1 = reference_grad(step, 1, index);
  if (world > 1 && rank < 2) return rank == 0 ? g0 : g1;
  std::vector<float> mean(g0.size());
  for (size_t e = 0; e < g0.size(); ++e) mean[e] = (g0[e] + g1[e]) / 2.0f;
  return mean;
}

struct Run {
  int stage = 1;
  int world = 2;
  bool offload = false;
  bool deterministic = false;
  std::string save_after_step_3;  // a directory: save there after step 3 and stop
  std::string resume_from;        // a directory: load it, then train steps 4 and 5
};

std::string describe(const Run& run) {
  return fmt::format("stage {}, {} rank(s){}{}", run.stage, run.world, run.offload ? ", offloaded" : "",
                     run.deterministic ? ", deterministic" : "");
}

EngineOptions options_of(const Run& run) {
  EngineOptions opt;
  opt.stage = run.stage;
  opt.optimizer.groups = reference().groups;
  opt.deterministic = run.deterministic;
  opt.timeout = 30s;
  // Small buckets and blocks: the matrices' rows are cut across rank chunks.
  opt.layout = {.alignment = 4, .bucket_numel = 640, .block = 16};
  opt.offload.optimizer = run.offload;
  return opt;
}

struct Trained {
  std::vector<double> errors;  // per step trained: the largest relative error over the tensors
  Tensors params;              // after the last step
};

Trained train(comm::Communicator& comm, const Run& run) {
  const Reference& ref = reference();
  Engine engine(comm, options_of(run));
  std::map<std::string, std::vector<float>> storage;
  std::map<std::string, int> ids;
  for (size_t t = 0; t < ref.params.size(); ++t) {
    const Param& p = ref.params[t];
    storage[p.name] = testing::pattern(1 + static_cast<int64_t>(t), p.numel(), 0.2f);
    ids[p.name] = engine.add_param({.name = p.name, .shape = p.shape, .dtype = DType::kFloat32,
                                    .data = {storage[p.name].data(), storage[p.name].size()},
                                    .unit = testing::reference_unit_of(p.name), .group = p.group});
  }
  engine.finalize();
  int first = 1, last = ref.steps;
  if (!run.resume_from.empty()) {
    engine.load(run.resume_from);
    first = 4;
  }
  if (!run.save_after_step_3.empty()) last = 3;
  Trained out;
  for (int step = first; step <= last; ++step) {
    for (int unit = 3; unit >= 0; --unit) {
      UnitScope s = engine.gather_for_backward(unit);
      for (size_t t = 0; t < ref.params.size(); ++t) {
        const Param& p = ref.params[t];
        if (testing::reference_unit_of(p.name) != unit) continue;
        const std::vector<float> g = grad_of(run.world, comm.rank(), step, t);
        std::memcpy(s.grad_as<float>(ids[p.name]), g.data(), g.size() * sizeof(float));
      }
    }
    engine.step();
    double worst = 0.0;
    for (int unit = 0; unit < 4; ++unit) {
      UnitScope s = engine.gather(unit);
      for (const Param& p : ref.params) {
        if (testing::reference_unit_of(p.name) != unit) continue;
        const float* w = s.param_as<float>(ids[p.name]);
        out.params[p.name].assign(w, w + p.numel());
        worst = std::max(worst, testing::relative_error(w, ref.after[static_cast<size_t>(step - 1)].at(p.name)));
      }
    }
    out.errors.push_back(worst);
  }
  if (!run.save_after_step_3.empty()) engine.save(run.save_after_step_3);
  return out;
}

Trained train_ranks(const Run& run) {
  std::vector<Trained> results(static_cast<size_t>(run.world));
  testing::run_thread_ranks(run.world, [&](comm::Communicator& comm) {
    results[static_cast<size_t>(comm.rank())] = train(comm, run);
  });
  for (const Trained& t : results) {
    for (size_t step = 0; step < t.errors.size(); ++step) {
      CAPTURE(step);
      CHECK(t.errors[step] <= 1e-6);
    }
  }
  return results[0];
}

TEST_CASE("Adafactor matches its reference at stages 0-3, on 1, 2 and 3 ranks, and offloaded") {
  REQUIRE(reference().world == 2);
  for (const Run& run : {Run{.stage = 0}, Run{.stage = 1}, Run{.stage = 2}, Run{.stage = 3}, Run{.stage = 0, .world = 1},
                        Run{.stage = 3, .world = 1}, Run{.stage = 1, .world = 3}, Run{.stage = 3, .world = 3},
                        Run{.stage = 2, .offload = true}, Run{.stage = 3, .world = 3, .offload = true}}) {
    CAPTURE(describe(run));
    const Trained t = train_ranks(run);
    REQUIRE(t.errors.size() == static_cast<size_t>(reference().steps));
    MESSAGE(describe(run) << ": largest error after the last step, relative to the tensor's largest value: "
                          << t.errors.back());
  }
}

TEST_CASE("Adafactor in deterministic mode gives the same bits at every stage, offloaded or not") {
  for (const int world : {2, 3}) {
    CAPTURE(world);
    const Trained base = train_ranks({.stage = 0, .world = world, .deterministic = true});
    for (const Run& run : {Run{.stage = 1, .world = world, .deterministic = true},
                          Run{.stage = 2, .world = world, .deterministic = true},
                          Run{.stage = 3, .world = world, .deterministic = true},
                          Run{.stage = 3, .world = world, .offload = true, .deterministic = true}}) {
      CAPTURE(describe(run));
      const Trained t = train_ranks(run);
      for (const auto& entry : base.params) {
        const std::string& name = entry.first;  // (clang 14 cannot capture a structured binding)
        CAPTURE(name);
        CHECK(std::memcmp(entry.second.data(), t.params.at(name).data(), entry.second.size() * sizeof(float)) == 0);
      }
    }
  }
}

TEST_CASE("Adafactor's row, column and vector statistics resume from a checkpoint at another stage and world size") {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = std::string(tmp != nullptr ? tmp : "/tmp") + "/adafactor_engine_test_checkpoint";
  std::filesystem::remove_all(dir);
  train_ranks({.stage = 2, .world = 2, .save_after_step_3 = dir});
  for (const Run& run : {Run{.stage = 0, .world = 1, .resume_from = dir}, Run{.stage = 3, .world = 3, .resume_from = dir},
                        Run{.stage = 1, .world = 2, .offload = true, .resume_from = dir}}) {
    CAPTURE(describe(run));
    CHECK(train_ranks(run).errors.size() == 2);
  }
}

TEST_CASE("the memory report prices Adafactor's state: rows plus columns per matrix, an element per vector element") {
  for (const bool offload : {false, true}) {
    CAPTURE(offload);
    testing::run_thread_ranks(1, [&](comm::Communicator& comm) {
      const Reference& ref = reference();
      Engine engine(comm, options_of({.stage = 1, .world = 1, .offload = offload}));
      std::map<std::string, std::vector<float>> storage;
      uint64_t expected = 0;
      for (const Param& p : ref.params) {
        storage[p.name].assign(p.numel(), 0.5f);
        engine.add_param({.name = p.name, .shape = p.shape, .dtype = DType::kFloat32,
                          .data = {storage[p.name].data(), storage[p.name].size()},
                          .unit = testing::reference_unit_of(p.name), .group = p.group});
        if (ref.groups[static_cast<size_t>(p.group)].kind != optim::OptimizerKind::kAdafactor) {
          expected += 8 * p.numel();
        } else if (p.shape.size() >= 2) {
          expected += 4 * (static_cast<uint64_t>(p.shape[0]) + p.numel() / static_cast<uint64_t>(p.shape[0]));
        } else {
          expected += 4 * p.numel();
        }
      }
      engine.finalize();
      bool found = false;
      for (const MemoryReport::Row& row : engine.memory_report().rows) {
        if (row.category != (offload ? "offload state" : "optimizer_state")) continue;
        found = true;
        CHECK(row.current == expected);
        CHECK(row.predicted + 8 >= expected);
        CHECK(row.predicted <= expected + 8);
      }
      CHECK(found);
    });
  }
}

}  // namespace
}  // namespace zero
