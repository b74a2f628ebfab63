// A user's update rule (optim/custom_optimizer.h) in the engine, with the ranks as threads: momentum
// SGD written as a custom rule gives the built-in SGD's bits at stages 0-3 and offloaded; each step
// the ranks' ranges cover every parameter once, at offsets within the whole tensor; with whole-tensor
// ownership a per-tensor rule gets each tensor whole; the rule's state is saved and resumed bit for
// bit; bad rules and options are errors that name them.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "base/check.h"
#include "base/error.h"
#include "memory/device.h"
#include "optim/custom_optimizer.h"
#include "testing/thread_ranks.h"
#include "zero/engine.h"

namespace zero {
namespace {

using namespace std::chrono_literals;
using Params = std::vector<std::vector<float>>;

struct Seen {
  int64_t step;
  std::string param;
  size_t offset, numel;
  bool operator<(const Seen& o) const { return std::tie(step, param, offset) < std::tie(o.step, o.param, o.offset); }
};

// torch.optim.SGD with momentum (no dampening, no weight decay), in the built-in kernel's operations:
// buf = g on the first step, else g + buf * momentum; p = fma(buf, -lr, p) (one rounding, as the
// kernel's fused multiply-add).
class MomentumRule final : public optim::CustomOptimizer {
 public:
  explicit MomentumRule(bool whole_tensors = false, std::vector<Seen>* seen = nullptr, std::mutex* mu = nullptr)
      : whole_tensors_(whole_tensors), seen_(seen), mu_(mu) {}
  std::string name() const override { return whole_tensors_ ? "per-tensor momentum" : "momentum"; }
  std::vector<std::string> state_names() const override { return {"velocity"}; }
  void validate(const optim::Hyper& h, int g) const override {
    if (!(h.momentum >= 0.0f && h.momentum < 1.0f)) {
      ZERO_THROW(InvalidArgument, "groups[{}].momentum must be in [0, 1) (got {})", g, h.momentum);
    }
  }
  bool needs_whole_tensors() const override { return whole_tensors_; }
  void update(const optim::UpdateContext& context, const optim::OwnedRange& r) override {
    const optim::Hyper& h = context.groups[static_cast<size_t>(r.group)];
    for (size_t i = 0; i < r.numel; ++i) {
      float& v = r.state[0][i];
      v = context.step == 1 ? r.grad[i] : r.grad[i] + v * h.momentum;
      r.master[i] = std::fma(v, -h.lr, r.master[i]);
    }
    if (seen_ != nullptr) {
      std::lock_guard<std::mutex> lock(*mu_);
      seen_->push_back({context.step, std::string(r.param), r.param_offset, r.numel});
    }
  }

 private:
  bool whole_tensors_;
  std::vector<Seen>* seen_;
  std::mutex* mu_;
};

// Tensors that straddle the small buckets and the rank chunks.
const std::vector<std::pair<std::string, size_t>> kTensors{{"u0.w", 37}, {"u0.b", 5}, {"u1.w", 87}, {"u1.b", 5}};

struct Run {
  int stage = 2;
  bool offload = false;
  std::shared_ptr<optim::CustomOptimizer> rule;  // null: the built-in SGD
  int steps = 4;
  std::string save_after_2, load_before_3;  // checkpoint folders
  DType state_dtype = DType::kFloat32;
  bool whole_tensors = false;  // ShardLayoutOptions.whole_tensors
};

Params train(comm::Communicator& comm, const Run& run) {
  EngineOptions opt;
  opt.stage = run.stage;
  opt.optimizer.kind = optim::OptimizerKind::kSgd;
  opt.optimizer.custom = run.rule;
  opt.optimizer.state_dtype = run.state_dtype;
  opt.optimizer.groups = {optim::Hyper{.lr = 0.05f, .momentum = 0.9f}};
  opt.max_grad_norm = 0.5f;  // the clip coefficient reaches the rule in its gradient
  opt.deterministic = true;
  opt.micro_batches = 2;
  opt.timeout = 30s;
  opt.layout = {.alignment = 4, .bucket_numel = 64, .block = 16, .whole_tensors = run.whole_tensors};
  opt.offload.optimizer = run.offload;
  memory::MemoryTracker tracker;
  std::unique_ptr<memory::Device> device = memory::make_host_device(tracker);
  Engine engine(EngineComms{.shard = &comm, .device = device.get()}, opt);
  Params params(kTensors.size());
  std::vector<int> ids;
  for (size_t i = 0; i < kTensors.size(); ++i) {
    params[i].resize(kTensors[i].second);
    for (size_t e = 0; e < params[i].size(); ++e) params[i][e] = std::cos(0.1f * static_cast<float>(e) + static_cast<float>(i));
    ids.push_back(engine.add_param({.name = kTensors[i].first, .shape = {static_cast<int64_t>(params[i].size())},
                                    .dtype = DType::kFloat32, .data = {params[i].data(), params[i].size()},
                                    .unit = static_cast<int>(i / 2)}));
  }
  engine.finalize();
  int first = 0;
  if (!run.load_before_3.empty()) {
    engine.load(run.load_before_3);
    first = 2;
  }
  for (int step = first; step < run.steps; ++step) {
    for (int m = 0; m < 2; ++m) {
      for (int k = 2; k-- > 0;) {
        UnitScope scope = engine.gather_for_backward(k);
        for (size_t i = 2 * static_cast<size_t>(k); i < 2 * static_cast<size_t>(k) + 2; ++i) {
          const float* p = scope.param_as<float>(ids[i]);
          float* g = scope.grad_as<float>(ids[i]);
          for (size_t e = 0; e < params[i].size(); ++e) {
            g[e] += std::sin(0.37f * static_cast<float>(e) + 1.3f * static_cast<float>(comm.rank() * 2 + m) +
                             0.7f * static_cast<float>(step)) + 0.1f * p[e];
          }
        }
      }
      engine.finish_backward();
    }
    engine.step();
    if (step == 1 && !run.save_after_2.empty()) engine.save(run.save_after_2);
  }
  Params out(params.size());
  for (int k = 0; k < 2; ++k) {
    UnitScope scope = engine.gather(k);
    for (size_t i = 2 * static_cast<size_t>(k); i < 2 * static_cast<size_t>(k) + 2; ++i) {
      const float* p = scope.param_as<float>(ids[i]);
      out[i].assign(p, p + params[i].size());
    }
  }
  return out;
}

std::string scratch(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = std::string(tmp != nullptr ? tmp : "/tmp") + "/custom_optimizer_test_" + name;
  std::filesystem::remove_all(dir);
  return dir;
}

}  // namespace

TEST_CASE("a momentum rule written against the interface gives the built-in SGD's bits at stages 0-3 and offloaded") {
  for (int stage = 0; stage <= 3; ++stage) {
    for (bool offload : {false, true}) {
      if (offload && stage == 0) continue;
      CAPTURE(stage);
      CAPTURE(offload);
      testing::run_thread_ranks(2, [&](comm::Communicator& comm) {
        const Params builtin = train(comm, {.stage = stage, .offload = offload});
        const Params custom = train(comm, {.stage = stage, .offload = offload, .rule = std::make_shared<MomentumRule>()});
        CHECK(custom == builtin);
      });
    }
  }
}

TEST_CASE("each step the ranks' ranges cover every parameter once, at offsets within the whole tensor") {
  for (int stage : {1, 3}) {
    CAPTURE(stage);
    std::vector<Seen> seen;
    std::mutex mu;
    auto rule = std::make_shared<MomentumRule>(false, &seen, &mu);
    testing::run_thread_ranks(2, [&](comm::Communicator& comm) { train(comm, {.stage = stage, .rule = rule}); });
    std::sort(seen.begin(), seen.end());
    std::map<std::pair<int64_t, std::string>, size_t> covered;  // (step, param) -> elements covered in order
    bool split = false;
    for (const Seen& s : seen) {
      size_t& next = covered[{s.step, s.param}];
      CHECK(s.offset == next);  // no gap, no overlap
      next = s.offset + s.numel;
      split = split || s.offset > 0;
    }
    for (int64_t step = 1; step <= 4; ++step) {
      for (const auto& [name, numel] : kTensors) CHECK(covered[{step, name}] == numel);
    }
    CHECK(split);  // some tensor is cut (across ranks or buckets) and seen in pieces
  }
}

TEST_CASE("with whole-tensor ownership a per-tensor rule gets whole tensors, once a step, at stages 0-3, and resumes") {
  // The built-in SGD on the same layout gives the reference bits (the layout, not the rule, sets the
  // norm's blocks).
  std::vector<Params> builtin(2);
  testing::run_thread_ranks(2, [&](comm::Communicator& comm) {
    builtin[static_cast<size_t>(comm.rank())] = train(comm, {.stage = 1, .whole_tensors = true});
  });
  const std::string dir = scratch("whole_tensors");
  for (int stage = 0; stage <= 3; ++stage) {
    for (bool offload : {false, true}) {
      if (offload && stage == 0) continue;
      CAPTURE(stage);
      CAPTURE(offload);
      std::vector<Seen> seen;
      std::mutex mu;
      auto rule = std::make_shared<MomentumRule>(true, &seen, &mu);
      testing::run_thread_ranks(2, [&](comm::Communicator& comm) {
        const Run run{.stage = stage, .offload = offload, .rule = rule, .whole_tensors = true};
        CHECK(train(comm, run) == builtin[static_cast<size_t>(comm.rank())]);
      });
      std::map<std::pair<int64_t, std::string>, int> whole;  // (step, param) -> calls holding all of it
      for (const Seen& s : seen) {
        CHECK(s.offset == 0);
        const auto it = std::find_if(kTensors.begin(), kTensors.end(), [&](const auto& t) { return t.first == s.param; });
        REQUIRE(it != kTensors.end());
        CHECK(s.numel == it->second);
        ++whole[{s.step, s.param}];
      }
      for (int64_t step = 1; step <= 4; ++step) {
        for (const auto& [name, numel] : kTensors) CHECK(whole[{step, name}] == (stage == 0 ? 2 : 1));
      }
    }
  }
  // Saved at stage 2, resumed at stage 3: the uninterrupted run's bits.
  testing::run_thread_ranks(2, [&](comm::Communicator& comm) {
    const auto rule = std::make_shared<MomentumRule>(true);
    train(comm, {.stage = 2, .rule = rule, .save_after_2 = dir, .whole_tensors = true});
    const Params resumed = train(comm, {.stage = 3, .rule = rule, .load_before_3 = dir, .whole_tensors = true});
    CHECK(resumed == builtin[static_cast<size_t>(comm.rank())]);
  });
}

TEST_CASE("the rule's state is saved and resumed bit for bit") {
  for (int stage : {1, 3}) {
    CAPTURE(stage);
    const std::string dir = scratch("stage" + std::to_string(stage));
    testing::run_thread_ranks(2, [&](comm::Communicator& comm) {
      const auto rule = std::make_shared<MomentumRule>();
      const Params whole = train(comm, {.stage = stage, .rule = rule, .save_after_2 = dir});
      const Params resumed = train(comm, {.stage = stage, .rule = rule, .load_before_3 = dir});
      CHECK(resumed == whole);
    });
  }
}

TEST_CASE("a per-tensor rule, bf16 state, a rule's bad hyperparameter: errors that name them") {
  testing::run_thread_ranks(1, [&](comm::Communicator& comm) {
    CHECK_THROWS_WITH_AS(train(comm, {.rule = std::make_shared<MomentumRule>(true)}),
                         doctest::Contains("'per-tensor momentum' needs whole tensors"), InvalidArgument);
    CHECK_THROWS_WITH_AS(train(comm, {.rule = std::make_shared<MomentumRule>(), .state_dtype = DType::kBFloat16}),
                         doctest::Contains("optimizer.state_dtype: the custom optimizer 'momentum' keeps fp32 state"),
                         InvalidArgument);
  });
  EngineOptions opt;
  opt.optimizer.custom = std::make_shared<MomentumRule>();
  opt.optimizer.groups = {optim::Hyper{.lr = 0.1f, .momentum = 1.5f}};
  CHECK_THROWS_WITH_AS(optim::validate_groups(opt.optimizer), "groups[0].momentum must be in [0, 1) (got 1.5)",
                       InvalidArgument);
  CHECK_THROWS_WITH_AS(optim::Optimizer(opt.optimizer, 4, {}), doctest::Contains("runs in an engine"), InvalidArgument);
  CHECK(optim::optimizer_label(opt.optimizer) == "custom:momentum");
  CHECK(optim::optimizer_state_names(opt.optimizer) == std::vector<std::string>{"velocity"});
}

}  // namespace zero
