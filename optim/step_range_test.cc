// begin_step() + step_range() over a split of the shard must equal one step(), bit for bit.
#include <doctest/doctest.h>

#include <cstring>
#include <random>
#include <vector>

#include "base/error.h"
#include "optim/optimizer.h"

namespace zero::optim {
namespace {

struct Run {
  std::vector<float> master;
  std::vector<uint16_t> out;
};

Run run(OptimizerKind kind, int threads, const std::vector<size_t>& cuts, bool ranged) {
  const size_t n = 1000;
  std::vector<Segment> segs{{0, 300, 0, "a", 0}, {310, 700, 1, "b", 0}, {700, 1000, 0, "c", 0}};
  OptimizerOptions o;
  o.kind = kind;
  o.groups = {Hyper{.lr = 0.01f, .weight_decay = 0.1f, .momentum = 0.9f},
              Hyper{.lr = 0.02f, .momentum = 0.5f, .dampening = 0.1f}};
  o.num_threads = threads;
  Optimizer opt(o, n, segs);
  Run r;
  r.master.resize(n);
  r.out.assign(n, 0);
  std::mt19937 rng(5);
  std::normal_distribution<float> d;
  for (float& x : r.master) x = d(rng);
  std::vector<float> grad(n);
  for (int step = 0; step < 3; ++step) {
    for (float& g : grad) g = d(rng);
    if (!ranged) {
      opt.step({.master = r.master.data(), .grad = grad.data(), .grad_scale = 0.5f,
                .model_out = r.out.data(), .model_dtype = DType::kBFloat16});
      continue;
    }
    opt.begin_step();
    for (size_t i = 0; i + 1 < cuts.size(); ++i) {
      const size_t b = cuts[i], e = cuts[i + 1];
      opt.step_range({.master = r.master.data() + b, .grad = grad.data() + b, .grad_scale = 0.5f,
                      .model_out = r.out.data() + b, .model_dtype = DType::kBFloat16,
                      .master_numel = e - b},
                     b, e);
    }
  }
  return r;
}

}  // namespace

TEST_CASE("step_range over a split equals step()") {
  for (OptimizerKind kind : {OptimizerKind::kAdamW, OptimizerKind::kSgd, OptimizerKind::kAdagrad,
                             OptimizerKind::kLion, OptimizerKind::kAdam}) {
    for (int threads : {1, 3}) {
      CAPTURE(optimizer_name(kind));
      CAPTURE(threads);
      const Run whole = run(kind, threads, {}, false);
      const Run split = run(kind, threads, {0, 17, 305, 311, 512, 1000}, true);
      CHECK(std::memcmp(whole.master.data(), split.master.data(), whole.master.size() * 4) == 0);
      CHECK(whole.out == split.out);
    }
  }
}

TEST_CASE("step_range checks its range and its order") {
  OptimizerOptions o;
  Optimizer opt(o, 10, {{0, 10, 0, "p", 0}});
  std::vector<float> m(10), g(10);
  CHECK_THROWS_WITH_AS(opt.step_range({.master = m.data(), .grad = g.data()}, 0, 10),
                       doctest::Contains("begin_step"), InvalidArgument);
  opt.begin_step();
  CHECK_THROWS_WITH_AS(opt.step_range({.master = m.data(), .grad = g.data()}, 5, 11),
                       doctest::Contains("[5, 11)"), InvalidArgument);
  CHECK_THROWS_WITH_AS(
      opt.step_range({.master = m.data(), .grad = g.data(), .grad_numel = 3}, 0, 4),
      doctest::Contains("grad_numel"), InvalidArgument);
}

}  // namespace zero::optim
