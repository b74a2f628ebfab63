// Stage 3 against stage 2 on loops that change their unit order: the loop that used to stop with "the
// gather window is full" (eight single-tensor units of unequal sizes; each step a backward pass, step(),
// then a forward-only pass), and a property test over random unit sizes, random orders that change
// from step to step, forward-only, backward-only and evaluation passes, random window, prefetch,
// persistence and resharding options, at 1 to 3 ranks, with and without offload. Deterministic mode:
// every value read in a scope and every final parameter equal stage 2's bit for bit. Also the stale
// storage guard, grad() outside a backward scope, and the evaluation scope's rules.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "base/error.h"
#include "memory/device.h"
#include "testing/thread_ranks.h"
#include "zero/engine.h"

namespace zero {
namespace {

using namespace std::chrono_literals;

// One pass over units: forward scopes (gather), backward scopes (gather_for_backward, which write
// gradients), or forward scopes inside engine.evaluation().
struct Pass {
  enum Kind { kForward, kBackward, kEvaluation } kind = kForward;
  std::vector<int> units;
};

struct Config {
  int stage = 3;
  std::vector<size_t> sizes;          // one single-tensor unit each
  std::vector<std::vector<Pass>> steps;  // the passes of each step, then step()
  bool deterministic = true;
  bool offload = false;               // optimizer offload (and, at stage 3, the parameter shard)
  size_t window_bytes = 0;
  size_t prefetch_bytes = 0;
  size_t persistence_bytes = 0;
  bool reshard_after_forward = true;
};

struct Result {
  std::vector<std::vector<float>> params;  // after the last step, read through scopes
  std::vector<uint64_t> reads;             // a hash of every parameter read in a scope, in order
  size_t window_peak = 0;
};

uint64_t hash_of(const float* p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t e = 0; e < n; ++e) {
    uint32_t bits;
    std::memcpy(&bits, p + e, 4);
    h = (h ^ bits) * 1099511628211ull;
  }
  return h;
}

Result train(comm::Communicator& comm, const Config& c) {
  EngineOptions opt;
  opt.stage = c.stage;
  opt.optimizer.kind = optim::OptimizerKind::kAdamW;
  opt.optimizer.groups = {optim::Hyper{.lr = 1e-2f, .weight_decay = 0.01f}};
  opt.max_grad_norm = 1.0f;
  opt.deterministic = c.deterministic;
  opt.timeout = 30s;
  // Small buckets: stage 2 cuts several, stage 3's larger units are reduced in pieces.
  opt.layout = {.alignment = 4, .bucket_numel = 256, .block = 16};
  opt.max_live_gathered_bytes = c.window_bytes;
  opt.prefetch_bytes = c.prefetch_bytes;
  opt.param_persistence_bytes = c.persistence_bytes;
  opt.reshard_after_forward = c.reshard_after_forward;
  opt.offload.optimizer = c.offload;
  opt.offload.params = c.offload && c.stage == 3;
  Engine engine(comm, opt);
  std::vector<std::vector<float>> storage(c.sizes.size());
  std::vector<int> ids;
  for (size_t u = 0; u < c.sizes.size(); ++u) {
    storage[u].resize(c.sizes[u]);
    for (size_t e = 0; e < c.sizes[u]; ++e) storage[u][e] = std::cos(0.1f * static_cast<float>(e) + static_cast<float>(u));
    ids.push_back(engine.add_param({.name = "unit" + std::to_string(u) + ".w", .shape = {static_cast<int64_t>(c.sizes[u])},
                                    .dtype = DType::kFloat32, .data = {storage[u].data(), storage[u].size()},
                                    .unit = static_cast<int>(u)}));
  }
  engine.finalize();
  Result r;
  auto read = [&](UnitScope& s, int u) {
    const float* p = s.param_as<float>(ids[static_cast<size_t>(u)]);
    r.reads.push_back(hash_of(p, c.sizes[static_cast<size_t>(u)]));
  };
  for (size_t step = 0; step < c.steps.size(); ++step) {
    for (const Pass& pass : c.steps[step]) {
      if (pass.kind == Pass::kBackward) {
        for (int u : pass.units) {
          UnitScope s = engine.gather_for_backward(u);
          read(s, u);
          const float* p = s.param_as<float>(ids[static_cast<size_t>(u)]);
          float* g = s.grad_as<float>(ids[static_cast<size_t>(u)]);
          for (size_t e = 0; e < c.sizes[static_cast<size_t>(u)]; ++e) {
            g[e] += 0.01f * std::sin(0.37f * static_cast<float>(e) + 1.3f * static_cast<float>(comm.rank()) +
                                     0.7f * static_cast<float>(step) + static_cast<float>(u)) +
                    0.1f * p[e];
          }
        }
        continue;
      }
      std::optional<EvaluationScope> evaluating;
      if (pass.kind == Pass::kEvaluation) evaluating.emplace(engine.evaluation());
      for (int u : pass.units) {
        UnitScope s = engine.gather(u);
        read(s, u);
      }
    }
    engine.step();
  }
  for (size_t u = 0; u < c.sizes.size(); ++u) {
    UnitScope s = engine.gather(static_cast<int>(u));
    const float* p = s.param_as<float>(ids[u]);
    r.params.emplace_back(p, p + c.sizes[u]);
  }
  for (const MemoryReport::Row& row : engine.memory_report().rows) {
    if (row.category == "gather_window") r.window_peak = std::max(r.window_peak, static_cast<size_t>(row.peak));
  }
  return r;
}

// Rank 0's result; every rank's error, if any, fails the test with its message.
Result run(int world, const Config& c) {
  Result out;
  std::mutex mu;
  testing::run_thread_ranks(world, [&](comm::Communicator& comm) {
    try {
      Result r = train(comm, c);
      std::lock_guard<std::mutex> lock(mu);
      if (comm.rank() == 0) out = std::move(r);
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> lock(mu);
      FAIL_CHECK(e.what());
    }
  });
  return out;
}

std::vector<int> range(int n, bool reversed) {
  std::vector<int> v(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) v[static_cast<size_t>(i)] = reversed ? n - 1 - i : i;
  return v;
}

}  // namespace

TEST_CASE("stage 3: a backward pass, step(), then a forward-only pass never fails and equals stage 2") {
  // An embedding-sized unit first, a few tiny ones last.
  Config c;
  c.sizes = {6000, 700, 1300, 400, 900, 12, 3, 30};
  const int n = static_cast<int>(c.sizes.size());
  for (int step = 0; step < 4; ++step) {
    c.steps.push_back({{Pass::kBackward, range(n, true)}});
    if (step > 0) c.steps.back().insert(c.steps.back().begin(), Pass{Pass::kForward, range(n, false)});
  }
  const size_t largest = 6016 * 4;  // padded to a multiple of 3 x 16 elements... at most
  for (int world : {1, 3}) {
    for (bool offload : {false, true}) {
      // The defaults, a byte budget as large as the largest unit (which prefetches every tiny unit at
      // once), and a window that holds only the largest unit (every prefetch must make way).
      for (const auto& limits : {std::pair<size_t, size_t>{0, 0}, {0, largest}, {largest + 64, largest}}) {
        const size_t window = limits.first, prefetch = limits.second;  // CAPTURE takes no structured binding
        CAPTURE(world);
        CAPTURE(offload);
        CAPTURE(window);
        CAPTURE(prefetch);
        Config s3 = c, s2 = c;
        s3.offload = s2.offload = offload;
        s3.window_bytes = window;
        s3.prefetch_bytes = prefetch;
        s2.stage = 2;
        const Result a = run(world, s3), b = run(world, s2);
        CHECK(a.reads == b.reads);
        CHECK(a.params == b.params);
      }
    }
  }
}

TEST_CASE("stage 3 property: random sizes, orders, passes and options always give stage 2's result") {
  for (uint32_t seed = 1; seed <= 10; ++seed) {
    std::mt19937 rng(seed);
    auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
    Config c;
    const int n = pick(2, 7);
    for (int u = 0; u < n; ++u) c.sizes.push_back(static_cast<size_t>(u == 0 && pick(0, 1) ? pick(1500, 4000) : pick(1, 600)));
    size_t largest = 0, total = 0;
    for (size_t s : c.sizes) {
      largest = std::max(largest, (s + 48) * 4);  // an upper bound of the padded unit
      total += (s + 48) * 4;
    }
    const size_t windows[] = {0, largest, largest + largest / 2, total};
    const size_t prefetches[] = {0, largest / 4, largest, 3 * largest};
    c.window_bytes = windows[pick(0, 3)];
    c.prefetch_bytes = prefetches[pick(0, 3)];
    c.persistence_bytes = pick(0, 2) == 0 ? 200 : 0;
    c.reshard_after_forward = pick(0, 2) != 0;
    // Passes: forward (units in any order, repeats allowed), backward (each unit at most once per
    // step, any order), evaluation; one to three per step.
    const int steps = pick(3, 5);
    for (int s = 0; s < steps; ++s) {
      std::vector<Pass> passes;
      bool backward_done = false;
      for (int k = pick(1, 3); k-- > 0;) {
        Pass p;
        p.kind = static_cast<Pass::Kind>(pick(0, 2));
        if (p.kind == Pass::kBackward && backward_done) p.kind = Pass::kForward;
        if (p.kind == Pass::kBackward) {
          backward_done = true;
          p.units = range(n, pick(0, 3) != 0);
          std::shuffle(p.units.begin(), p.units.end() - pick(0, n - 1), rng);
          p.units.resize(static_cast<size_t>(pick(1, n)));
        } else {
          for (int k2 = pick(1, 2 * n); k2-- > 0;) p.units.push_back(pick(0, n - 1));
        }
        passes.push_back(p);
      }
      c.steps.push_back(passes);
    }
    for (int world : {1, 2, 3}) {
      const bool offload = (seed + static_cast<uint32_t>(world)) % 3 == 0;
      CAPTURE(seed);
      CAPTURE(world);
      CAPTURE(offload);
      CAPTURE(c.window_bytes);
      CAPTURE(c.prefetch_bytes);
      Config s3 = c, s2 = c;
      s3.offload = s2.offload = offload;
      s2.stage = 2;
      const Result a = run(world, s3), b = run(world, s2);
      CHECK(a.reads == b.reads);
      CHECK(a.params == b.params);
      if (c.window_bytes) CHECK(a.window_peak <= c.window_bytes);
      // Without determinism the sums may be ordered differently: the reference tolerance.
      if (seed % 4 == 0) {
        Config n3 = s3, n2 = s2;
        n3.deterministic = n2.deterministic = false;
        const Result x = run(world, n3), y = run(world, n2);
        REQUIRE(x.params.size() == y.params.size());
        for (size_t u = 0; u < x.params.size(); ++u) {
          for (size_t e = 0; e < x.params[u].size(); ++e) {
            CHECK(std::fabs(x.params[u][e] - y.params[u][e]) <= 1e-6f * std::max(1.0f, std::fabs(y.params[u][e])));
          }
        }
      }
    }
  }
}

TEST_CASE("stage 3: the registered storage holds NaN; grad() outside a backward scope names the parameter") {
  testing::run_thread_ranks(2, [&](comm::Communicator& comm) {
    for (int stage : {2, 3}) {
      EngineOptions opt;
      opt.stage = stage;
      opt.optimizer.groups = {optim::Hyper{.lr = 1e-2f}};
      opt.timeout = 30s;
      Engine engine(comm, opt);
      std::vector<float> w(100, 0.5f), b(10, 0.25f);
      const int wid = engine.add_param({.name = "layer.w", .shape = {100}, .dtype = DType::kFloat32,
                                        .data = {w.data(), w.size()}, .unit = 0});
      engine.add_param({.name = "layer.b", .shape = {10}, .dtype = DType::kFloat32, .data = {b.data(), b.size()}, .unit = 1});
      engine.finalize();
      CHECK(engine.params_resident() == (stage < 3));
      CHECK(std::isnan(w[0]) == (stage == 3));
      CHECK(std::isnan(w[99]) == (stage == 3));
      CHECK(std::isnan(b[9]) == (stage == 3));
      if (stage == 3) {
        CHECK_THROWS_WITH_AS((void)engine.grad(wid), doctest::Contains("grad(0): parameter 'layer.w' outside a backward scope of its unit 0"),
                             InvalidArgument);
        CHECK_THROWS_WITH_AS(engine.grad_ready(wid), doctest::Contains("'layer.w' outside a backward scope"), InvalidArgument);
        // Inside the unit's backward scope it is the gradient; a forward scope is not enough.
        UnitScope f = engine.gather(0);
        CHECK(f.param_as<float>(wid)[7] == 0.5f);
        CHECK_THROWS_AS((void)engine.grad(wid), InvalidArgument);
        f.close();
        UnitScope s = engine.gather_for_backward(0);
        CHECK(engine.grad(wid) != nullptr);
      } else {
        CHECK(engine.grad(wid) != nullptr);
      }
    }
  });
}

TEST_CASE("evaluation scopes: forward only, not recorded, and the next step still prefetches") {
  testing::run_thread_ranks(2, [&](comm::Communicator& comm) {
    EngineOptions opt;
    opt.stage = 3;
    opt.optimizer.groups = {optim::Hyper{.lr = 1e-2f}};
    opt.timeout = 30s;
    // Room for training's next unit (kept across the evaluation) beside the evaluation's unit in use
    // and its prefetch; with less, the evaluation's prefetch takes that room and the unit is gathered
    // again, ahead of use, when the evaluation ends.
    opt.max_live_gathered_bytes = 3 * 2048 * sizeof(float);
    Engine engine(comm, opt);
    std::vector<std::vector<float>> w(4, std::vector<float>(300, 0.5f));
    for (int u = 0; u < 4; ++u) {
      engine.add_param({.name = "w" + std::to_string(u), .shape = {300}, .dtype = DType::kFloat32,
                        .data = {w[static_cast<size_t>(u)].data(), 300}, .unit = u});
    }
    engine.finalize();
    auto train_step = [&] {
      for (int u = 0; u < 4; ++u) UnitScope s = engine.gather(u);
      for (int u = 4; u-- > 0;) {
        UnitScope s = engine.gather_for_backward(u);
        s.grad_as<float>(u)[0] += 1.0f;
      }
      engine.step();
    };
    train_step();
    train_step();
    const StepTimings before = engine.step_timings();
    CHECK(before.prefetched_bytes > 0);
    CHECK(before.prefetched_bytes == before.gathered_bytes);  // every unit ahead of use
    {
      EvaluationScope eval = engine.evaluation();
      CHECK_THROWS_WITH_AS((void)engine.gather_for_backward(0), doctest::Contains("inside an evaluation scope"), InvalidArgument);
      {
        UnitScope s = engine.gather(0);
        CHECK_THROWS_WITH_AS((void)engine.grad(0), doctest::Contains("inside an evaluation scope"), InvalidArgument);
      }
      CHECK_THROWS_WITH_AS(engine.step(), doctest::Contains("step() inside an evaluation scope"), InvalidArgument);
      for (int u = 1; u < 4; ++u) UnitScope s = engine.gather(u);
      CHECK_THROWS_WITH_AS((void)engine.evaluation(), doctest::Contains("inside an evaluation scope"), InvalidArgument);
    }
    // The step after the evaluation follows the recorded order: the same gathers, prefetched alike
    // (the evaluation's own gathers belong to no step).
    train_step();
    CHECK(engine.step_timings().gathered_bytes == before.gathered_bytes);
    CHECK(engine.step_timings().prefetched_bytes == before.prefetched_bytes);
  });
}

}  // namespace zero
