// The engine under pipeline parallelism, every rank a thread (Gloo over one in-memory store):
// - micro-batches within a step (EngineOptions::micro_batches): units' backward passes of different
//   micro-batches interleaved as a schedule runs them, the backward split into input and weight
//   scopes, train bit for bit as the same micro-batches accumulated one micro-step after another
//   (no_sync) do, at every stage; at stage 3 a unit is gathered once per step by default and once
//   per use with micro_batch_gather each;
// - tied copies (ParamSpec::tied, the tied copies' finalizer over the mesh's tied group): two pipeline stages holding a copy of one
//   weight train as one rank holding it once (its gradient the sum of both parts, counted once in
//   the norm), and the copies stay bitwise equal, at dp 1 and 2 and every stage;
// - misuse named: a unit with fewer backward passes than micro-batches, one too many, a gradient
//   written in an input scope, a parameter read in a weight scope, a tied parameter without its group.
#include <doctest/doctest.h>

#include <cmath>
#include <map>
#include <numeric>
#include <string>
#include <vector>

#include "base/error.h"
#include "comm/mesh.h"
#include "memory/device.h"
#include "parallel/engine_comms.h"
#include "testing/thread_ranks.h"
#include "zero/engine.h"

namespace zero {
namespace {

using namespace std::chrono_literals;

struct TensorDef {
  std::string name;
  size_t numel;
  int unit;
};

const std::vector<TensorDef> kModel = {{"u0.w", 24, 0}, {"u0.b", 6, 0}, {"u1.w", 40, 1}, {"u2.w", 18, 2}, {"u2.b", 5, 2}};
constexpr int kSteps = 3;
constexpr int kMicro = 3;

std::vector<float> initial(const std::string& name, size_t n) {
  std::vector<float> v(n);
  const auto salt = static_cast<float>(std::hash<std::string>{}(name) % 97);
  for (size_t e = 0; e < n; ++e) v[e] = std::cos(0.3f * static_cast<float>(e) + salt);
  return v;
}

// The gradient of a tensor for (step, micro-batch, data-parallel rank).
void add_gradient(const std::string& name, float* g, size_t n, int step, int mb, int rank) {
  const auto salt = static_cast<float>(std::hash<std::string>{}(name) % 89);
  for (size_t e = 0; e < n; ++e) {
    g[e] += 0.05f * std::sin(0.37f * static_cast<float>(e) + 0.7f * static_cast<float>(step) + 1.3f * static_cast<float>(mb) +
                             2.1f * static_cast<float>(rank) + salt);
  }
}

EngineOptions options(int stage) {
  EngineOptions o;
  o.stage = stage;
  o.optimizer.kind = optim::OptimizerKind::kAdamW;
  o.optimizer.groups = {optim::Hyper{.lr = 1e-2f, .weight_decay = 0.01f}};
  o.max_grad_norm = 0.2f;  // clips: the norm's value matters
  o.deterministic = true;
  o.timeout = 30s;
  o.layout = {.alignment = 4, .bucket_numel = 32, .block = 8};
  return o;
}

struct Run {
  std::vector<double> norms;
  std::vector<std::vector<float>> params;
  std::vector<uint64_t> gathered_bytes;
};

// One step's backward passes as a pipeline rank runs them: (unit, micro-batch, part), each unit's
// micro-batches in order, units of different micro-batches interleaved, some split into B and W.
struct Pass {
  int unit, mb;
  BackwardPart part;
};
const std::vector<Pass> kInterleaved = {
    {2, 0, BackwardPart::kAll},    {2, 1, BackwardPart::kInput},  {1, 0, BackwardPart::kAll},
    {2, 1, BackwardPart::kWeight}, {2, 2, BackwardPart::kAll},    {1, 1, BackwardPart::kInput},
    {0, 0, BackwardPart::kAll},    {1, 1, BackwardPart::kWeight}, {1, 2, BackwardPart::kAll},
    {0, 1, BackwardPart::kInput},  {0, 1, BackwardPart::kWeight}, {0, 2, BackwardPart::kAll},
};

std::vector<int> register_model(Engine& engine, Run& run) {
  std::vector<int> ids;
  run.params.clear();
  for (const TensorDef& d : kModel) run.params.push_back(initial(d.name, d.numel));
  for (size_t t = 0; t < kModel.size(); ++t) {
    ids.push_back(engine.add_param({.name = kModel[t].name, .shape = {static_cast<int64_t>(kModel[t].numel)},
                                    .data = {run.params[t].data(), run.params[t].size()}, .unit = kModel[t].unit}));
  }
  engine.finalize();
  return ids;
}

void write_grads(UnitScope& scope, const std::vector<int>& ids, int step, int mb, int rank) {
  for (size_t t = 0; t < kModel.size(); ++t) {
    if (kModel[t].unit != scope.unit()) continue;
    add_gradient(kModel[t].name, scope.grad_as<float>(ids[t]), kModel[t].numel, step, mb, rank);
  }
}

void read_params(Engine& engine, const std::vector<int>& ids, Run& run) {
  for (int unit = 0; unit < 3; ++unit) {
    UnitScope scope = engine.gather(unit);
    for (size_t t = 0; t < kModel.size(); ++t) {
      if (kModel[t].unit != unit) continue;
      const float* p = scope.param_as<float>(ids[t]);
      run.params[t].assign(p, p + kModel[t].numel);
    }
  }
}

// micro_batches = kMicro, the passes interleaved; forwards of every micro-batch first (GPipe-like).
Run run_micro_batches(comm::Communicator& dp, int stage, bool regather, bool each_micro_batch = false) {
  EngineOptions o = options(stage);
  o.micro_batches = kMicro;
  if (regather) o.micro_batch_gather = MicroBatchGather::kEach;
  if (each_micro_batch) o.micro_batch_reduce = MicroBatchReduce::kEach;
  Engine engine(dp, o);
  engine.interleave_micro_batches(kMicro);
  Run run;
  const std::vector<int> ids = register_model(engine, run);
  for (int step = 0; step < kSteps; ++step) {
    for (int mb = 0; mb < kMicro; ++mb) {
      for (int unit = 0; unit < 3; ++unit) {
        UnitScope s = engine.gather(unit);
        CHECK(std::isfinite(s.param_as<float>(ids[static_cast<size_t>(unit == 0 ? 0 : unit + 1)])[0]));
      }
    }
    for (const Pass& p : kInterleaved) {
      UnitScope s = engine.gather_for_backward(p.unit, p.part);
      if (p.part != BackwardPart::kInput) write_grads(s, ids, step, p.mb, dp.rank());
    }
    run.norms.push_back(engine.step().grad_norm);
    run.gathered_bytes.push_back(engine.step_timings().gathered_bytes);
  }
  read_params(engine, ids, run);
  return run;
}

// The same micro-batches as micro-steps, one after another: under no_sync, reduced once; or each
// reduced into the shard accumulator.
Run run_accumulated(comm::Communicator& dp, int stage, bool reduce_every_micro_step = false) {
  EngineOptions o = options(stage);
  o.micro_batches = kMicro;
  o.micro_batch_reduce = reduce_every_micro_step ? MicroBatchReduce::kEach : MicroBatchReduce::kOnce;
  Engine engine(dp, o);
  Run run;
  const std::vector<int> ids = register_model(engine, run);
  for (int step = 0; step < kSteps; ++step) {
    for (int mb = 0; mb < kMicro; ++mb) {
      for (int unit = 2; unit >= 0; --unit) {
        UnitScope s = engine.gather_for_backward(unit);
        write_grads(s, ids, step, mb, dp.rank());
      }
      engine.finish_backward();
    }
    run.norms.push_back(engine.step().grad_norm);
  }
  read_params(engine, ids, run);
  return run;
}

TEST_CASE("micro-batches interleaved within a step train bit for bit as accumulated micro-steps, stages 0-3") {
  for (int stage = 0; stage <= 3; ++stage) {
    CAPTURE(stage);
    testing::run_thread_ranks(2, [&](comm::Communicator& world) {
      const Run want = run_accumulated(world, stage);
      for (bool regather : {false, true}) {
        CAPTURE(regather);
        const Run got = run_micro_batches(world, stage, regather);
        CHECK(got.norms == want.norms);
        CHECK(got.params == want.params);
        if (stage == 3) {
          // After the first step (which records the order), kept units are gathered once per step;
          // regathered ones once per forward and backward use (kMicro times as many gathers, less
          // what the window keeps for reuse).
          CHECK(got.gathered_bytes[1] == got.gathered_bytes[2]);
          if (regather) {
            const Run kept = run_micro_batches(world, stage, false);
            CHECK(got.gathered_bytes[1] >= 2 * kept.gathered_bytes[1]);
          }
        }
      }
    });
  }
}

TEST_CASE("interleaved micro-batches reduced one by one (micro_batch_reduce each) train bit for bit as micro-steps reduced each") {
  for (int stage : {2, 3}) {
    CAPTURE(stage);
    testing::run_thread_ranks(2, [&](comm::Communicator& world) {
      const Run want = run_accumulated(world, stage, /*reduce_every_micro_step=*/true);
      const Run got = run_micro_batches(world, stage, false, /*each_micro_batch=*/true);
      CHECK(got.norms == want.norms);
      CHECK(got.params == want.params);
      // Reducing once per step rounds differently, so the match above says the reductions ran per
      // micro-batch.
      CHECK(run_micro_batches(world, stage, false).params != want.params);
    });
  }
  testing::run_thread_ranks(1, [&](comm::Communicator& world) {
    EngineOptions o = options(1);
    o.micro_batch_reduce = MicroBatchReduce::kEach;
    Engine engine(world, o);  // one after another, each micro-batch reduces: any stage
    CHECK_THROWS_WITH_AS(engine.interleave_micro_batches(2),
                         doctest::Contains("micro_batch_reduce = each under a pipeline needs stage 2 or 3"),
                         InvalidArgument);
    o.micro_batch_gather = MicroBatchGather::kOnce;
    CHECK_THROWS_WITH_AS(Engine(world, o), doctest::Contains("micro_batch_gather = once keeps units gathered across"),
                         InvalidArgument);
  });
}

// Pipeline stage s of 2 holds the tied "emb" (unit 0, registered first) and its own "s<s>.w". Its
// part of emb's gradient is add_gradient("emb<s>", ...). One rank holding everything once: emb's
// gradient is part 0 + part 1.
constexpr size_t kEmb = 20, kOwn = 12;

Run run_tied_stage(const comm::Mesh& mesh, int stage) {
  EngineOptions o = options(stage);
  Engine engine(parallel::engine_comms(mesh), o);
  const int s = mesh.coord().pp, r = mesh.coord().dp;
  Run run;
  run.params = {initial("emb", kEmb), initial(s == 0 ? "s0.w" : "s1.w", kOwn)};
  if (s == 1) run.params[0].assign(kEmb, 7.0f);  // replaced by stage 0's values at finalize
  const int emb = engine.add_param({.name = "emb", .shape = {int64_t{kEmb}}, .data = {run.params[0].data(), kEmb},
                                    .unit = 0, .tied = true});
  const int own = engine.add_param({.name = s == 0 ? "s0.w" : "s1.w", .shape = {int64_t{kOwn}},
                                    .data = {run.params[1].data(), kOwn}, .unit = 1});
  engine.finalize();
  for (int step = 0; step < kSteps; ++step) {
    {
      UnitScope u = engine.gather_for_backward(1);
      add_gradient(s == 0 ? "s0.w" : "s1.w", u.grad_as<float>(own), kOwn, step, 0, r);
    }
    {
      UnitScope u = engine.gather_for_backward(0);
      add_gradient(s == 0 ? "emb0" : "emb1", u.grad_as<float>(emb), kEmb, step, 0, r);
    }
    run.norms.push_back(engine.step().grad_norm);
  }
  for (int unit = 0; unit < 2; ++unit) {
    UnitScope u = engine.gather(unit);
    const float* p = u.param_as<float>(unit == 0 ? emb : own);
    run.params[static_cast<size_t>(unit)].assign(p, p + (unit == 0 ? kEmb : kOwn));
  }
  return run;
}

Run run_tied_reference(comm::Communicator& dp, int stage) {
  Engine engine(dp, options(stage));
  Run run;
  run.params = {initial("emb", kEmb), initial("s0.w", kOwn), initial("s1.w", kOwn)};
  std::vector<int> ids;
  const char* names[] = {"emb", "s0.w", "s1.w"};
  for (size_t t = 0; t < 3; ++t) {
    ids.push_back(engine.add_param({.name = names[t], .shape = {static_cast<int64_t>(run.params[t].size())},
                                    .data = {run.params[t].data(), run.params[t].size()}, .unit = static_cast<int>(t)}));
  }
  engine.finalize();
  for (int step = 0; step < kSteps; ++step) {
    for (int unit = 2; unit >= 0; --unit) {
      UnitScope u = engine.gather_for_backward(unit);
      if (unit > 0) add_gradient(names[unit], u.grad_as<float>(ids[static_cast<size_t>(unit)]), kOwn, step, 0, dp.rank());
      if (unit == 0) {
        // The two stages' parts, summed first (as the tied all-reduce does), then accumulated.
        std::vector<float> part(kEmb, 0.0f), other(kEmb, 0.0f);
        add_gradient("emb0", part.data(), kEmb, step, 0, dp.rank());
        add_gradient("emb1", other.data(), kEmb, step, 0, dp.rank());
        float* g = u.grad_as<float>(ids[0]);
        for (size_t e = 0; e < kEmb; ++e) g[e] += part[e] + other[e];
      }
    }
    run.norms.push_back(engine.step().grad_norm);
  }
  for (int unit = 0; unit < 3; ++unit) {
    UnitScope u = engine.gather(unit);
    const float* p = u.param_as<float>(ids[static_cast<size_t>(unit)]);
    run.params[static_cast<size_t>(unit)].assign(p, p + run.params[static_cast<size_t>(unit)].size());
  }
  return run;
}

TEST_CASE("a weight tied across two pipeline stages trains as one copy, and the copies stay equal") {
  for (int stage = 0; stage <= 3; ++stage) {
    for (int dp : {1, 2}) {
      CAPTURE(stage);
      CAPTURE(dp);
      Run want;
      testing::run_thread_ranks(dp, [&](comm::Communicator& world) {
        Run r = run_tied_reference(world, stage);
        if (world.rank() == 0) want = std::move(r);
      });
      std::map<int, Run> got;  // by world rank
      std::mutex mu;
      testing::run_thread_ranks(2 * dp, [&](comm::Communicator& world) {
        comm::Mesh mesh(world, comm::MeshShape{.pp = 2, .dp = dp, .tp = 1});
        Run r = run_tied_stage(mesh, stage);
        std::lock_guard<std::mutex> lock(mu);
        got[world.rank()] = std::move(r);
      });
      for (const auto& ranked : got) {
        const int rank = ranked.first;  // not a structured binding: CAPTURE takes it
        const Run& run = ranked.second;
        CAPTURE(rank);
        for (int s = 0; s < kSteps; ++s) {
          CHECK(std::abs(run.norms[static_cast<size_t>(s)] - want.norms[static_cast<size_t>(s)]) <=
                1e-6 * want.norms[static_cast<size_t>(s)]);
        }
        CHECK(run.params[0] == got.begin()->second.params[0]);  // every copy of emb, bit for bit
        double worst = 0;
        for (size_t e = 0; e < kEmb; ++e) worst = std::max(worst, double{std::abs(run.params[0][e] - want.params[0][e])});
        CHECK(worst <= 1e-6);
      }
    }
  }
}

TEST_CASE("micro-batch misuse is named") {
  testing::run_thread_ranks(1, [&](comm::Communicator& world) {
    EngineOptions o = options(2);
    o.micro_batches = 2;
    Engine engine(world, o);
    engine.interleave_micro_batches(2);
    Run run;
    const std::vector<int> ids = register_model(engine, run);
    { UnitScope s = engine.gather_for_backward(2); }
    CHECK_THROWS_WITH_AS(engine.finish_backward(), doctest::Contains("unit 2's backward ran 1 times in this micro-step"),
                         InvalidArgument);
    engine.zero_grad();
    { UnitScope s = engine.gather_for_backward(1); }
    { UnitScope s = engine.gather_for_backward(1); }
    CHECK_THROWS_WITH_AS(UnitScope s = engine.gather_for_backward(1), doctest::Contains("unit 1's backward already ran 2 times"),
                         InvalidArgument);
    {
      UnitScope s = engine.gather_for_backward(0, BackwardPart::kInput);
      CHECK_THROWS_WITH_AS(s.grad(ids[0]), doctest::Contains("written in an input-gradient scope of unit 0"),
                           InvalidArgument);
    }
    {
      UnitScope s = engine.gather_for_backward(0, BackwardPart::kWeight);
      CHECK_THROWS_WITH_AS(s.param(ids[0]), doctest::Contains("read in a weight-gradient scope of unit 0"),
                           InvalidArgument);
    }
    engine.zero_grad();
  });
  testing::run_thread_ranks(1, [&](comm::Communicator& world) {
    Engine engine(world, options(1));
    std::vector<float> w(4, 1.0f);
    engine.add_param({.name = "lm_head", .shape = {4}, .data = {w.data(), w.size()}, .tied = true});
    CHECK_THROWS_WITH_AS(engine.finalize(), doctest::Contains("parameter 'lm_head' is tied (ParamSpec.tied) but no gradient finalizer of "
                                                           "the engine takes it (EngineComms.finalizers)"),
                         InvalidArgument);
  });
}

}  // namespace
}  // namespace zero
