// ZeRO++'s parts that work on nodes, on thread ranks cut into "nodes" of consecutive ranks:
// hpZ (EngineOptions.secondary_shard): the backward reads the forward's values bit for bit, and
// without quantized gathers the whole run is bitwise plain stage 3's; qgZ
// (EngineOptions.quantized_gradients): the reduced gradient is within the two hops' quantization
// bound of the exact one at every node size (one node, one rank per node, 2 x 2), two runs are
// bitwise equal (with stochastic rounding too, within a scale per hop), and offload works; wrong
// node sizes are refused naming the option.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "base/error.h"
#include "comm/hybrid_groups.h"
#include "testing/thread_ranks.h"
#include "testing/unit_model.h"
#include "zero/engine.h"
#include "zero/memory_report.h"

namespace zero {
namespace {

using namespace std::chrono_literals;

const std::vector<size_t> kSizes = {3000, 700, 257, 40};

struct Config {
  int node_size = 2;
  bool hpz = false;
  int gradient_bits = 0;  // qgZ
  int weight_bits = 0;    // qwZ
  bool offload = false;
  bool sgd = false;       // plain SGD at lr 1: the update is the reduced gradient
  int steps = 3;
  int shard_group = 0;  // hybrid sharding: shard groups of this many ranks (0: none)
  bool stochastic = false;  // qgZ's codes rounded stochastically
};

struct Result {
  std::vector<std::vector<float>> forward, backward;  // what the last step's scopes read, per unit
  std::vector<std::vector<float>> initial, final;     // the parameters before and after training
  float grad_absmax = 0;                              // the largest gradient value any rank wrote
  MemoryReport memory;                                // after the last step
};

float gradient(size_t u, size_t e, int rank, int step) {
  const float x = static_cast<float>(e) * 0.013f + static_cast<float>(u);
  return std::cos(x * static_cast<float>(rank + 1) + static_cast<float>(step)) * (e % 89 == 0 ? 2.0f : 0.3f);
}

Result train(comm::Communicator& comm, const Config& c) {
  EngineOptions opt;
  opt.stage = 3;
  if (c.sgd) {
    opt.optimizer.kind = optim::OptimizerKind::kSgd;
    opt.optimizer.groups = {optim::Hyper{.lr = 1.0f}};
  } else {
    opt.optimizer.kind = optim::OptimizerKind::kAdamW;
    opt.optimizer.groups = {optim::Hyper{.lr = 1e-2f, .weight_decay = 0.01f}};
  }
  opt.deterministic = true;
  opt.timeout = 30s;
  opt.layout = {.alignment = 4, .bucket_numel = 1024, .block = 64};
  opt.node_size = c.node_size;
  opt.secondary_shard = c.hpz;
  opt.quantized_gradients = {.bits = c.gradient_bits, .block = 64, .stochastic = c.stochastic};
  opt.quantized_weights = {.bits = c.weight_bits, .block = 64, .backward = false};
  opt.offload.optimizer = opt.offload.params = c.offload;
  std::unique_ptr<comm::HybridGroups> groups;
  if (c.shard_group > 0) groups = std::make_unique<comm::HybridGroups>(comm, c.shard_group);
  Engine engine(groups ? EngineComms{.shard = groups->shard(), .replica = groups->replica()} : EngineComms{.shard = &comm},
                opt);
  Result r;
  testing::UnitModel model(engine, kSizes, [](size_t u, size_t e) {
    return std::sin(0.37f * static_cast<float>(e) + static_cast<float>(u)) * 0.05f;
  });
  r.initial = model.initial();
  engine.finalize();
  for (int step = 0; step < c.steps; ++step) {
    const testing::UnitReads reads = model.gather_step([&](size_t u, const std::vector<float>& read, float* g) {
      for (size_t e = 0; e < kSizes[u]; ++e) {
        g[e] += gradient(u, e, comm.rank(), step) + 0.1f * read[e];
        r.grad_absmax = std::max(r.grad_absmax, std::fabs(g[e]));
      }
    });
    r.forward = reads.forward;
    r.backward = reads.backward;
    engine.step();
  }
  r.memory = engine.memory_report();
  // The trained values, read by an evaluation's gathers (full precision without qwZ).
  EvaluationScope eval = engine.evaluation();
  for (size_t u = 0; u < kSizes.size(); ++u) {
    UnitScope s = engine.gather(static_cast<int>(u));
    r.final.push_back(model.read(s, u));
  }
  return r;
}

// Every rank's result; a rank's error fails the test with its message, or is collected in `errors`.
std::vector<Result> run(int world, const Config& c, std::vector<std::string>* errors = nullptr) {
  std::vector<std::string> own;
  std::vector<Result> out = testing::thread_rank_results<Result>(
      world, [&](comm::Communicator& comm) { return train(comm, c); }, errors != nullptr ? *errors : own);
  for (const std::string& e : own) FAIL_CHECK(e);
  return out;
}

bool has_row(const MemoryReport& m, const std::string& category) {
  return std::any_of(m.rows.begin(), m.rows.end(), [&](const MemoryReport::Row& r) { return r.category == category; });
}

const MemoryReport::Row& row(const MemoryReport& m, const std::string& category) {
  for (const MemoryReport::Row& r : m.rows) {
    if (r.category == category) return r;
  }
  FAIL("no row " << category);
  return m.rows.front();
}

}  // namespace

TEST_CASE("hpZ: the backward reads the forward's values; alone it trains bitwise as plain stage 3") {
  for (int weight_bits : {0, 8}) {
    for (bool offload : {false, true}) {
      CAPTURE(weight_bits);
      CAPTURE(offload);
      const std::vector<Result> hpz = run(4, {.hpz = true, .weight_bits = weight_bits, .offload = offload});
      for (const Result& r : hpz) {
        // Quantized gathers that leave the backward at full precision (backward = false) are
        // overridden by the node parts: the backward computes with what the forward did.
        CHECK(r.backward == r.forward);
        CHECK(r.forward == hpz[0].forward);
        CHECK(r.final == hpz[0].final);
      }
      if (weight_bits == 0) {
        const std::vector<Result> plain = run(4, {.hpz = false, .offload = offload});
        CHECK(hpz[0].final == plain[0].final);
        CHECK(hpz[0].forward == plain[0].forward);
        // The node parts have a row of their own: as predicted, and not in the gather window.
        CHECK(row(hpz[0].memory, "gather_window").peak == row(plain[0].memory, "gather_window").peak);
        CHECK_FALSE(has_row(plain[0].memory, "secondary_shard"));
        const MemoryReport::Row& parts = row(hpz[0].memory, "secondary_shard");
        CHECK(parts.predicted > 0);
        CHECK(parts.peak == parts.predicted);
        if (!offload) {
          // A bucket's node part is padded / node size and its shard padded / world size: 4 / 2.
          CHECK(parts.predicted == 2 * row(hpz[0].memory, "params (shard)").current);
        }
        CHECK(hpz[0].memory.table().find("secondary_shard") != std::string::npos);
      }
    }
  }
}

TEST_CASE("qgZ: the reduced gradient is within the two hops' bound at every node size, deterministic") {
  for (const std::pair<int, int>& shape : {std::pair{4, 2}, std::pair{4, 4}, std::pair{4, 1}, std::pair{3, 3}, std::pair{2, 1}}) {
    const int world = shape.first, node = shape.second;  // (plain names: doctest's CAPTURE cannot take a binding)
    const std::vector<Result> exact = run(world, {.node_size = node, .sgd = true, .steps = 1});
    float gmax = 0;
    for (const Result& r : exact) gmax = std::max(gmax, r.grad_absmax);
    for (int bits : {8, 4}) {
      CAPTURE(world);
      CAPTURE(node);
      CAPTURE(bits);
      const Config q{.node_size = node, .gradient_bits = bits, .sgd = true, .steps = 1};
      const std::vector<Result> a = run(world, q);
      // A second run to compare bitwise: once, at the two hops of 2 x 2.
      const std::vector<Result> b = world == 4 && node == 2 ? run(world, q) : a;
      // Each rank's gradient is quantized once (half a scale: gmax / qmax / 2), each node's sum of L once
      // more (L gmax / qmax / 2); averaged over the world: at most gmax / qmax per element.
      const float qmax = bits == 8 ? 127.0f : 7.0f;
      const float bound = gmax / qmax * 1.001f;
      size_t differ = 0;
      for (size_t u = 0; u < kSizes.size(); ++u) {
        CAPTURE(u);
        CHECK(a[0].final[u] == b[0].final[u]);
        for (const Result& r : a) CHECK(r.final[u] == a[0].final[u]);
        for (size_t e = 0; e < kSizes[u]; ++e) {
          CHECK(std::fabs(a[0].final[u][e] - exact[0].final[u][e]) <= bound);
          differ += a[0].final[u][e] != exact[0].final[u][e] ? 1 : 0;
        }
      }
      CHECK(differ > 0);
    }
  }
}

TEST_CASE("qgZ with stochastic rounding: within a scale per hop of the exact reduction, deterministic, unlike nearest") {
  const int world = 4, node = 2;
  const std::vector<Result> exact = run(world, {.node_size = node, .sgd = true, .steps = 1});
  float gmax = 0;
  for (const Result& r : exact) gmax = std::max(gmax, r.grad_absmax);
  for (int bits : {8, 4}) {
    CAPTURE(bits);
    const Config q{.node_size = node, .gradient_bits = bits, .sgd = true, .steps = 1, .stochastic = true};
    Config nearest_config = q;
    nearest_config.stochastic = false;
    const std::vector<Result> a = run(world, q), b = run(world, q), nearest = run(world, nearest_config);
    // Each hop's code is within one scale of its value (not half): each rank's gradient gmax / qmax,
    // each node's sum of L L gmax / qmax; averaged over the world, at most 2 gmax / qmax.
    const float qmax = bits == 8 ? 127.0f : 7.0f;
    size_t unlike_nearest = 0;
    for (size_t u = 0; u < kSizes.size(); ++u) {
      CAPTURE(u);
      CHECK(a[0].final[u] == b[0].final[u]);
      for (const Result& r : a) CHECK(r.final[u] == a[0].final[u]);
      for (size_t e = 0; e < kSizes[u]; ++e) {
        CHECK(std::fabs(a[0].final[u][e] - exact[0].final[u][e]) <= 2 * gmax / qmax * 1.001f);
        unlike_nearest += a[0].final[u][e] != nearest[0].final[u][e] ? 1 : 0;
      }
    }
    CHECK(unlike_nearest > 0);
  }
  EngineOptions o;
  o.stage = 3;
  o.quantized_gradients.stochastic = true;
  CHECK_THROWS_WITH_AS(validate(o), doctest::Contains("quantized_gradients.stochastic rounds qgZ's codes, but "
                                                      "quantized_gradients.bits is 0 (off)"), InvalidArgument);
}

TEST_CASE("qgZ and hpZ beside hybrid sharding: within the bound of the exact reduction, replicas alike") {
  // Shard groups {0, 1} and {2, 3}, each cut into nodes of one rank: qgZ's second hop spans the
  // shard group, then the replicas' all-reduce; hpZ's part is the whole unit.
  const Config q{.node_size = 1, .hpz = true, .gradient_bits = 8, .sgd = true, .steps = 1, .shard_group = 2};
  Config e = q;
  e.hpz = false;
  e.gradient_bits = 0;
  const std::vector<Result> a = run(4, q), exact = run(4, e);
  float gmax = 0;
  for (const Result& r : exact) gmax = std::max(gmax, r.grad_absmax);
  for (size_t u = 0; u < kSizes.size(); ++u) {
    CAPTURE(u);
    for (const Result& r : a) CHECK(r.final[u] == a[0].final[u]);
    for (size_t i = 0; i < kSizes[u]; ++i) CHECK(std::fabs(a[0].final[u][i] - exact[0].final[u][i]) <= gmax / 127 * 1.001f);
  }
}

TEST_CASE("qgZ with hpZ and qwZ, offloaded: training stays near full precision on 2 x 2") {
  const Result full = run(4, {})[0];
  const std::vector<Result> all = run(4, {.hpz = true, .gradient_bits = 8, .weight_bits = 8, .offload = true});
  for (const Result& r : all) CHECK(r.final == all[0].final);
  for (size_t u = 0; u < kSizes.size(); ++u) {
    CAPTURE(u);
    // Three AdamW steps at lr 1e-2 move a parameter by at most about 3e-2 whatever the gradient.
    for (size_t e = 0; e < kSizes[u]; ++e) CHECK(std::fabs(all[0].final[u][e] - full.final[u][e]) <= 0.07f);
  }
}

TEST_CASE("hpZ and qgZ: refused without a node size, with one that does not divide the group, below stage 3") {
  std::vector<std::string> errors;
  run(4, {.node_size = 3, .hpz = true, .steps = 1}, &errors);
  REQUIRE(errors.size() == 4);
  for (const std::string& e : errors) {
    CHECK(e.find("EngineOptions.node_size = 3 does not divide the shard group's 4 ranks") != std::string::npos);
  }
  errors.clear();
  run(2, {.node_size = 0, .gradient_bits = 4, .steps = 1}, &errors);
  REQUIRE(errors.size() == 2);
  for (const std::string& e : errors) {
    CHECK(e.find("EngineOptions.quantized_gradients (qgZ) needs EngineOptions.node_size") != std::string::npos);
  }
  EngineOptions o;
  o.stage = 2;
  o.node_size = 2;
  o.secondary_shard = true;
  CHECK_THROWS_WITH_AS(validate(o), doctest::Contains("secondary_shard (hpZ) needs stage 3"), InvalidArgument);
  o.secondary_shard = false;
  o.quantized_gradients.bits = 4;
  CHECK_THROWS_WITH_AS(validate(o), doctest::Contains("quantized_gradients (qgZ) needs stage 3"), InvalidArgument);
  o.stage = 3;
  o.quantized_gradients.bits = 2;
  CHECK_THROWS_WITH_AS(validate(o), doctest::Contains("quantized_gradients.bits must be 0 (off), 8 or 4, got 2"),
                       InvalidArgument);
}

}  // namespace zero
