#pragma once
// The engine side of the per-step training references (scripts/*_reference.py: Muon's, 8-bit
// AdamW's, Adafactor's): their tensors registered in the units reference_unit_of gives, trained on
// thread ranks at a stage and world size, the parameters compared with the reference's after each
// step it records. The references have two data-parallel ranks: one rank brings their mean, and a
// third rank brings the mean again, so the mean over any world size is the reference's (bit for bit
// on 1 and 2 ranks; the three-rank sum rounds otherwise).
#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "testing/steps_reference.h"
#include "testing/thread_ranks.h"
#include "zero/engine.h"

namespace zero::testing {

struct ReferenceParam {
  std::string name;
  std::vector<int64_t> shape;
  int group = 0;
  size_t numel() const { return shape_numel(shape); }
};

struct ReferenceModel {
  std::vector<ReferenceParam> params;
  int steps = 0;
  std::function<std::vector<float>(size_t index)> initial;
  // Reference rank `rank`'s (0 or 1) gradient of tensor `index` at `step` (1-based).
  std::function<std::vector<float>(int step, int rank, size_t index)> grad;
  // The reference's tensor `name` after `step`, or nullptr where it records none.
  std::function<const std::vector<float>*(int step, const std::string& name)> after;
};

// The model of a reference that generates its inputs from testing::pattern (adamw8bit_reference.py,
// adafactor_reference.py): tensor t starts from seed 1 + t at scale 0.2; reference rank r's gradient
// at step s comes from seed 100 s + 10 r + t at scale 0.3 + 0.2 r, the first `zero_elements` of tensor
// `zero_name`'s zero (a block or row that never gets a gradient).
inline ReferenceModel pattern_model(std::vector<ReferenceParam> params, int steps, std::string zero_name,
                                    size_t zero_elements,
                                    std::function<const std::vector<float>*(int, const std::string&)> after) {
  ReferenceModel m;
  m.params = std::move(params);
  m.steps = steps;
  m.after = std::move(after);
  const std::vector<ReferenceParam> p = m.params;
  m.initial = [p](size_t t) { return pattern(1 + static_cast<int64_t>(t), p[t].numel(), 0.2f); };
  m.grad = [p, zero_name, zero_elements](int step, int rank, size_t t) {
    std::vector<float> g =
        pattern(100 * step + 10 * rank + static_cast<int64_t>(t), p[t].numel(), static_cast<float>(0.3 + 0.2 * rank));
    if (p[t].name == zero_name) std::fill(g.begin(), g.begin() + static_cast<long>(zero_elements), 0.0f);
    return g;
  };
  return m;
}

struct ReferenceRun {
  int stage = 1;
  int world = 2;
  bool offload = false;
  bool deterministic = false;
  std::string save_after_step_3;  // a directory: save there after step 3 and stop
  std::string resume_from;        // a directory: load it (with `load`), then train steps 4 on
  LoadOptions load;
  bool stop_after_load = false;   // train nothing after the load
  std::string save_at_end;        // a directory: save there after the last step
  int optimizer_threads = 1;      // for the test's options (EngineOptions::optimizer.num_threads)
};

inline std::string describe(const ReferenceRun& run) {
  return fmt::format("stage {}, {} rank(s){}{}{}", run.stage, run.world, run.offload ? ", offloaded" : "",
                     run.deterministic ? ", deterministic" : "",
                     run.optimizer_threads > 1 ? fmt::format(", {} optimizer threads", run.optimizer_threads) : "");
}

struct ReferenceResult {
  std::map<int, double> errors;  // by step recorded: the largest relative_error over the tensors
  Tensors params;                // after the last step
};

// The engine options of `run` (its stage, determinism, offload and optimizer threads) with the
// reference's `groups` and `layout` (small buckets and blocks, so that rank chunks cut the tensors).
inline EngineOptions reference_options(const ReferenceRun& run, std::vector<optim::Hyper> groups,
                                       const ShardLayoutOptions& layout) {
  EngineOptions opt;
  opt.stage = run.stage;
  opt.optimizer.groups = std::move(groups);
  opt.optimizer.num_threads = run.optimizer_threads;
  opt.deterministic = run.deterministic;
  opt.timeout = std::chrono::seconds(30);
  opt.layout = layout;
  opt.offload.optimizer = run.offload;
  return opt;
}

// Rank `rank`'s gradient of tensor `index` at `step` in a world of `world` ranks.
inline std::vector<float> rank_grad(const ReferenceModel& m, int world, int rank, int step, size_t index) {
  if (world > 1 && rank < 2) return m.grad(step, rank, index);
  const std::vector<float> g0 = m.grad(step, 0, index), g1 = m.grad(step, 1, index);
  std::vector<float> mean(g0.size());
  for (size_t e = 0; e < g0.size(); ++e) mean[e] = (g0[e] + g1[e]) / 2.0f;
  return mean;
}

inline ReferenceResult train_reference(comm::Communicator& comm, const ReferenceModel& m, const EngineOptions& options,
                                       const ReferenceRun& run) {
  Engine engine(comm, options);
  std::vector<std::vector<float>> storage(m.params.size());
  std::vector<int> ids;
  for (size_t t = 0; t < m.params.size(); ++t) {
    const ReferenceParam& p = m.params[t];
    storage[t] = m.initial(t);
    ids.push_back(engine.add_param({.name = p.name, .shape = p.shape, .dtype = DType::kFloat32,
                                    .data = {storage[t].data(), storage[t].size()}, .unit = reference_unit_of(p.name),
                                    .group = p.group}));
  }
  engine.finalize();
  int first = 1, last = m.steps;
  if (!run.resume_from.empty()) {
    engine.load(run.resume_from, run.load);
    first = 4;
  }
  if (!run.save_after_step_3.empty() || run.stop_after_load) last = 3;
  ReferenceResult out;
  for (int step = first; step <= last; ++step) {
    for (int unit = 3; unit >= 0; --unit) {
      UnitScope s = engine.gather_for_backward(unit);
      for (size_t t = 0; t < m.params.size(); ++t) {
        if (reference_unit_of(m.params[t].name) != unit) continue;
        const std::vector<float> g = rank_grad(m, run.world, comm.rank(), step, t);
        std::memcpy(s.grad_as<float>(ids[t]), g.data(), g.size() * sizeof(float));
      }
    }
    engine.step();
    double worst = -1.0;
    for (int unit = 0; unit < 4; ++unit) {
      UnitScope s = engine.gather(unit);
      for (size_t t = 0; t < m.params.size(); ++t) {
        const ReferenceParam& p = m.params[t];
        if (reference_unit_of(p.name) != unit) continue;
        const float* w = s.param_as<float>(ids[t]);
        out.params[p.name].assign(w, w + p.numel());
        if (const std::vector<float>* want = m.after(step, p.name)) worst = std::max(worst, relative_error(w, *want));
      }
    }
    if (worst >= 0.0) out.errors[step] = worst;
  }
  if (!run.save_after_step_3.empty()) engine.save(run.save_after_step_3);
  if (!run.save_at_end.empty()) engine.save(run.save_at_end);
  return out;
}

// On run.world thread ranks: rank 0's result; every rank's errors are checked against `bound`.
inline ReferenceResult train_reference_ranks(const ReferenceModel& m, const EngineOptions& options,
                                             const ReferenceRun& run, double bound) {
  std::vector<ReferenceResult> results(static_cast<size_t>(run.world));
  run_thread_ranks(run.world, [&](comm::Communicator& comm) {
    results[static_cast<size_t>(comm.rank())] = train_reference(comm, m, options, run);
  });
  for (const ReferenceResult& r : results) {
    for (const auto& entry : r.errors) {
      const int step = entry.first;  // (clang 14 cannot capture a structured binding)
      CAPTURE(step);
      CHECK(entry.second <= bound);
    }
  }
  return results[0];
}

// The runs every reference is checked at: stages 0-3 on 2 ranks, stages 0 and 3 on 1, stages 1 and 3
// on 3, offloaded at stage 2 on 2 and stage 3 on 3.
inline std::vector<ReferenceRun> reference_runs() {
  using Run = ReferenceRun;
  return {Run{.stage = 0}, Run{.stage = 1}, Run{.stage = 2}, Run{.stage = 3}, Run{.stage = 0, .world = 1},
          Run{.stage = 3, .world = 1}, Run{.stage = 1, .world = 3}, Run{.stage = 3, .world = 3},
          Run{.stage = 2, .offload = true}, Run{.stage = 3, .world = 3, .offload = true}};
}

// Deterministic runs on `world` ranks compared with stage 0's: stages 1-3, and 3 offloaded.
inline std::vector<ReferenceRun> deterministic_runs(int world) {
  using Run = ReferenceRun;
  return {Run{.stage = 1, .world = world, .deterministic = true}, Run{.stage = 2, .world = world, .deterministic = true},
          Run{.stage = 3, .world = world, .deterministic = true},
          Run{.stage = 3, .world = world, .offload = true, .deterministic = true}};
}

// `params` registered on one rank under `options` (stage 1): the memory report's optimizer state
// row (offloaded or not) holds `expected` bytes, and the formula predicts them to 8 bytes (its k is
// an average over the elements, a double, rounded once).
inline void check_state_bytes(const EngineOptions& options, const std::vector<ReferenceParam>& params, uint64_t expected) {
  run_thread_ranks(1, [&](comm::Communicator& comm) {
    Engine engine(comm, options);
    std::vector<std::vector<float>> storage;
    for (const ReferenceParam& p : params) {
      std::vector<float>& w = storage.emplace_back(p.numel(), 0.5f);
      engine.add_param({.name = p.name, .shape = p.shape, .dtype = DType::kFloat32, .data = {w.data(), w.size()},
                        .unit = reference_unit_of(p.name), .group = p.group});
    }
    engine.finalize();
    bool found = false;
    for (const MemoryReport::Row& row : engine.memory_report().rows) {
      if (row.category != (options.offload.optimizer ? "offload state" : "optimizer_state")) continue;
      found = true;
      CHECK(row.current == expected);
      CHECK(row.predicted + 8 >= expected);
      CHECK(row.predicted <= expected + 8);
    }
    CHECK(found);
  });
}

// Every tensor of `want` has the same bits in `got`.
inline void check_same_bits(const Tensors& want, const Tensors& got) {
  for (const auto& entry : want) {
    const std::string& name = entry.first;  // (clang 14 cannot capture a structured binding)
    CAPTURE(name);
    REQUIRE(got.count(name) == 1);
    CHECK(std::memcmp(entry.second.data(), got.at(name).data(), entry.second.size() * sizeof(float)) == 0);
  }
}

}  // namespace zero::testing
