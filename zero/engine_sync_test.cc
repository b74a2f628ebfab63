// The engine's host waits and allocations, counted: once its transient buffers are set up (two
// steps), the forward and backward (gathers, prefetch, gradient reductions) make the host wait for
// nothing of the engine's own and allocate nothing, and step() waits once at stages 0-2 (the block
// sums the clip and overflow decisions read on the host), twice at stage 3 (and the check that every
// rank followed the same unit order). The offload tier adds one event wait per bucket for its
// gradients' copy to the host and one per bucket for its new values' copy back.
//
// Counted through testing/sync_counting.h's wrappers on the host device with its streams on worker
// threads (so each wait is a real one) and Gloo, whose every collective needs its one wait; the
// count subtracts those (on a GPU with NCCL collectives need none). 2 ranks as threads; stages 0-3,
// units of one size, of three sizes and of a GPT's shape, deterministic reduction, gradient
// accumulation, offload.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "memory/device.h"
#include "testing/sync_counting.h"
#include "testing/thread_ranks.h"
#include "zero/engine.h"

namespace zero {
namespace {

using namespace std::chrono_literals;

struct Setup {
  int stage = 0;
  bool deterministic = false;
  bool offload = false;
  int micro = 2;  // gradient accumulation steps
  bool equal_units = false;  // every unit the same size (transformer blocks); else three sizes
  bool gpt_like = false;     // an embedding, four blocks and a final norm (units of three sizes)
};

// The engine's own host waits in one phase of a step.
struct Phase {
  int64_t waits = 0, calls = 0, allocations = 0;
  int64_t own() const { return waits - calls; }
};

struct StepCount {
  Phase backward;  // from the first forward gather to finish_backward of the last micro-step
  Phase step;      // Engine::step()
};

// Each unit: a matrix of this many elements and a bias of 6.
std::vector<size_t> unit_sizes(const Setup& s) {
  if (s.gpt_like) return {200, 60, 60, 60, 60, 8};
  if (s.equal_units) return {40, 40, 40};
  return {40, 70, 100};
}
constexpr int kSteps = 4;

// Trains kSteps steps of the model unit_sizes(s) gives and counts each step's waits, calls and
// allocations on this rank.
std::vector<StepCount> count_waits(comm::Communicator& gloo, const Setup& s, size_t* max_buckets) {
  testing::CountingCommunicator comm(gloo);
  memory::MemoryTracker tracker;
  std::unique_ptr<memory::Device> host = memory::make_host_device(tracker, {.threaded_streams = true});
  testing::CountingDevice device(*host);
  EngineOptions opt;
  opt.stage = s.stage;
  opt.optimizer.kind = optim::OptimizerKind::kAdamW;
  opt.optimizer.groups = {optim::Hyper{.lr = 1e-2f}};
  opt.max_grad_norm = 1.0f;
  opt.deterministic = s.deterministic;
  opt.micro_batches = s.micro;
  opt.offload.optimizer = s.offload;
  opt.timeout = 30s;
  opt.layout = {.alignment = 4, .bucket_numel = 64, .block = 16};
  Engine engine(EngineComms{&comm, nullptr, &device}, opt);
  std::vector<std::vector<float>> params;
  std::vector<int> ids;
  const std::vector<size_t> sizes = unit_sizes(s);
  const int units = static_cast<int>(sizes.size());
  for (int k = 0; k < units; ++k) {
    for (size_t n : {sizes[static_cast<size_t>(k)], size_t{6}}) {
      params.emplace_back(n, 0.5f);
      ids.push_back(engine.add_param({.name = "u" + std::to_string(k) + "." + std::to_string(params.size()),
                                      .shape = {static_cast<int64_t>(n)}, .dtype = DType::kFloat32,
                                      .data = {params.back().data(), n}, .unit = k}));
    }
  }
  engine.finalize();
  // A bound on the layout's buckets: a unit's buckets hold at most 64 elements each, and a unit
  // starts a new one.
  size_t numel = 0;
  for (const auto& p : params) numel += p.size();
  *max_buckets = (numel + 63) / 64 + sizes.size();

  std::vector<StepCount> counts;
  auto mark = [&](Phase& p, auto&& fn) {
    const int64_t w = device.host_waits(), c = comm.calls(), a = device.allocations();
    fn();
    p.waits += device.host_waits() - w;
    p.allocations += device.allocations() - a;
    p.calls += comm.calls() - c;
  };
  for (int step = 0; step < kSteps; ++step) {
    StepCount sc;
    mark(sc.backward, [&] {
      for (int m = 0; m < s.micro; ++m) {
        for (int k = 0; k < units; ++k) {
          UnitScope scope = engine.gather(k);
          CHECK(std::isfinite(scope.param_as<float>(ids[2 * static_cast<size_t>(k)])[0]));
        }
        for (int k = units; k-- > 0;) {
          UnitScope scope = engine.gather_for_backward(k);
          for (size_t i = 2 * static_cast<size_t>(k); i < 2 * static_cast<size_t>(k) + 2; ++i) {
            float* g = scope.grad_as<float>(ids[i]);
            for (size_t e = 0; e < params[i].size(); ++e) g[e] += 0.01f * static_cast<float>(e % 7 + m + step + comm.rank());
          }
        }
        engine.finish_backward();
      }
    });
    mark(sc.step, [&] { engine.step(); });
    counts.push_back(sc);
  }
  return counts;
}

void check_waits(const Setup& s, int64_t step_waits) {
  testing::run_thread_ranks(2, [&](comm::Communicator& c) {
    size_t max_buckets = 0;
    const std::vector<StepCount> counts = count_waits(c, s, &max_buckets);
    for (size_t step = 0; step < counts.size(); ++step) {
      CAPTURE(step);
      CAPTURE(c.rank());
      const StepCount& sc = counts[step];
      std::printf("stage %d%s%s%s rank %d step %zu: forward+backward %lld waits, %lld calls, %lld allocations; "
                  "step %lld waits, %lld calls, %lld allocations\n",
                  s.stage, s.deterministic ? " deterministic" : "", s.offload ? " offload" : "",
                  s.equal_units ? " equal units" : s.gpt_like ? " gpt-like" : "", c.rank(), step,
                  static_cast<long long>(sc.backward.waits), static_cast<long long>(sc.backward.calls),
                  static_cast<long long>(sc.backward.allocations), static_cast<long long>(sc.step.waits),
                  static_cast<long long>(sc.step.calls), static_cast<long long>(sc.step.allocations));
      CHECK(sc.backward.calls > 0);
      if (step < testing::kEngineWarmUpSteps) continue;
      CHECK(sc.backward.own() == 0);
      // Nothing allocated, so nothing freed (a cudaFree synchronizes the device).
      CHECK(sc.backward.allocations == 0);
      CHECK(sc.step.allocations == 0);
      if (s.offload) {
        // Per bucket: its gradients landed on the host, and (but for the last two, awaited after
        // the loop) its staging's new values left before the staging is reused; then the d2h
        // stream drained.
        CHECK(sc.step.own() >= step_waits);
        CHECK(sc.step.own() <= step_waits + 2 * static_cast<int64_t>(max_buckets) + 1);
      } else {
        CHECK(sc.step.own() == step_waits);
      }
    }
  });
}

TEST_CASE("the forward and backward wait for nothing of the engine's own; step() waits once, twice at stage 3") {
  check_waits({.stage = 0}, 1);
  check_waits({.stage = 1}, 1);
  check_waits({.stage = 2}, 1);  // two tensors span buckets: their scratch gradients come from a slab
  check_waits({.stage = 3, .equal_units = true}, 2);
}

TEST_CASE("stage 3 with units of several sizes reuses the window's and the staging's slabs") {
  // Units of three sizes taking turns two at a time, and a GPT's shape (an embedding, blocks, a final
  // norm): buffers of exact sizes kept within the live peak freed and allocated one on nearly every
  // turn (16 a step for the GPT shape, each after a host wait).
  check_waits({.stage = 3}, 2);
  check_waits({.stage = 3, .gpt_like = true}, 2);
}

TEST_CASE("deterministic reduction adds no host wait") {
  check_waits({.stage = 2, .deterministic = true}, 1);
  check_waits({.stage = 3, .deterministic = true, .gpt_like = true}, 2);
}

TEST_CASE("the offload tier's waits are per bucket, on events") {
  check_waits({.stage = 1, .offload = true}, 1);
  check_waits({.stage = 2, .offload = true}, 1);
  check_waits({.stage = 3, .offload = true, .gpt_like = true}, 2);
}

}  // namespace
}  // namespace zero
