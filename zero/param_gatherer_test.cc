// ParamGatherer alone (stage 3's gather window), on real Gloo communicators between threads and the
// host device: the bytes it gathers and prefetches (StepTimings), the window's bytes (the memory
// tracker's kGatherWindow), and the values every scope reads. The units are those of the loop that
// once stopped with "the gather window is full": an embedding-sized unit first, tiny ones last.
//
// A steady step whose units fit the window gathers each unit once, all of it ahead of use; an order
// change never fails and is followed by the next step; prefetch stays within its byte budget and
// never evicts a unit needed sooner; reshard_after_forward = false and param_persistence_bytes save
// the gathers they promise; the window never holds more than its limit; an evaluation leaves the
// training order and its prefetch alone.
#include "zero/param_gatherer.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "base/error.h"
#include "memory/device.h"
#include "memory/tracker.h"
#include "testing/thread_ranks.h"

namespace zero {
namespace {

using namespace std::chrono_literals;

const std::vector<size_t> kSizes = {4096, 64, 1024, 256, 2048, 16, 16, 16};
constexpr size_t kBlock = 16;

struct Entry {
  size_t unit;
  GatherUse use;
};

// Forward over every unit, then backward in reverse: the loop every step follows unless a test
// changes it.
std::vector<Entry> forward_backward(size_t n) {
  std::vector<Entry> out;
  for (size_t u = 0; u < n; ++u) out.push_back({u, GatherUse::kForward});
  for (size_t u = n; u-- > 0;) out.push_back({u, GatherUse::kBackward});
  return out;
}

// The value of element e of unit u, the same on every rank (each rank contributes its chunk).
float value(size_t u, size_t e) { return static_cast<float>(u * 10000 + e); }

// One rank's gatherer over single-tensor units, with the window's bytes in its own tracker.
class Rig {
 public:
  Rig(comm::Communicator& comm, const std::vector<size_t>& sizes, GathererConfig config)
      : sizes_(sizes), device_(memory::make_host_device(tracker_)) {
    std::vector<int> units(sizes.size());
    std::iota(units.begin(), units.end(), 0);
    layout_ = ShardLayout(sizes, comm.size(), {.alignment = 4, .bucket_numel = 256, .block = kBlock, .unit_buckets = true},
                          units);
    for (size_t u = 0; u < sizes.size(); ++u) {
      std::vector<float> v(sizes[u]);
      for (size_t e = 0; e < v.size(); ++e) v[e] = value(u, e);
      initial_.push_back(std::move(v));
    }
    std::vector<RegisteredValues> initial;
    for (const auto& v : initial_) initial.push_back({v.data(), DType::kFloat32});
    config.timings = &timings_;
    config.timeout = 20s;
    ownership_ = std::make_unique<ShardOwnership>(ShardOwnership::sharded(layout_, comm.rank()));
    gatherer_ = std::make_unique<ParamGatherer>(config, layout_, *ownership_, comm, *device_, initial);
  }

  ParamGatherer& gatherer() { return *gatherer_; }
  // Bytes a unit takes in the window (its padded length).
  size_t bytes(size_t u) const { return layout_.buckets()[u].padded * sizeof(float); }
  size_t largest() const { return layout_.max_bucket_padded() * sizeof(float); }
  size_t total_bytes(const std::vector<Entry>& entries) const {
    size_t s = 0;
    for (const Entry& e : entries) s += bytes(e.unit);
    return s;
  }
  size_t window_peak() const { return tracker_.usage(memory::Category::kGatherWindow).peak; }

  // One scope: gathers the unit, checks every value it reads, releases it.
  void scope(Entry e) {
    const auto* p = static_cast<const float*>(gatherer_->acquire(e.unit, e.use));
    device_->synchronize(device_->compute_stream(), 20s);
    for (size_t i = 0; i < sizes_[e.unit]; ++i) {
      if (p[i] != value(e.unit, i)) {
        FAIL_CHECK("unit " << e.unit << " element " << i << " reads " << p[i] << ", not " << value(e.unit, i));
        break;
      }
    }
    gatherer_->release(e.unit, e.use);
  }
  // The scopes of one step, then step()'s part (the shard is not changed: the values stay).
  // Returns what the step gathered, up to and including the next step's first prefetch.
  StepTimings step(const std::vector<Entry>& entries) {
    timings_ = {};
    for (const Entry& e : entries) scope(e);
    gatherer_->after_step();
    return timings_;
  }
  StepTimings evaluate(const std::vector<size_t>& units) {
    timings_ = {};
    gatherer_->begin_evaluation();
    for (size_t u : units) scope({u, GatherUse::kEvaluation});
    gatherer_->end_evaluation();
    return timings_;
  }

 private:
  std::vector<size_t> sizes_;
  memory::MemoryTracker tracker_;
  std::unique_ptr<memory::Device> device_;
  ShardLayout layout_;
  std::unique_ptr<ShardOwnership> ownership_;
  std::vector<std::vector<float>> initial_;
  StepTimings timings_;
  std::unique_ptr<ParamGatherer> gatherer_;
};

// Runs fn on `ranks` thread ranks, each with its own rig.
template <typename Fn>
void on_ranks(int ranks, const GathererConfig& config, Fn fn, const std::vector<size_t>& sizes = kSizes) {
  testing::run_thread_ranks(ranks, [&](comm::Communicator& comm) {
    Rig rig(comm, sizes, config);
    fn(rig);
  });
}

}  // namespace

// Every unit's bytes once.
size_t all_units(const Rig& rig) {
  size_t s = 0;
  for (size_t u = 0; u < kSizes.size(); ++u) s += rig.bytes(u);
  return s;
}

TEST_CASE("a steady order: recorded by the first step, then every unit gathered once, all ahead of use") {
  for (int ranks : {1, 2}) {
    CAPTURE(ranks);
    on_ranks(ranks, {}, [&](Rig& rig) {
      const auto order = forward_backward(kSizes.size());
      // The first step knows no order: every scope gathers on demand and every unit leaves the
      // window when its scope ends, so backward gathers each unit again. Its end prefetches the
      // next step's first unit.
      const StepTimings first = rig.step(order);
      CHECK(first.gathered_bytes == rig.total_bytes(order) + rig.bytes(0));
      CHECK(first.prefetched_bytes == rig.bytes(0));
      for (int s = 0; s < 3; ++s) {
        // Every unit fits the window (two of the largest): each stays from its forward to its
        // backward, gathered once, ahead of use.
        const StepTimings t = rig.step(order);
        CHECK(t.gathered_bytes == all_units(rig));
        CHECK(t.prefetched_bytes == t.gathered_bytes);
      }
      CHECK(rig.window_peak() <= 2 * rig.largest());
    });
  }
}

TEST_CASE("order changes never fail, whatever the mix of unit sizes, and the next step follows the new order") {
  for (int ranks : {1, 2, 3}) {
    for (uint32_t seed = 1; seed <= 4; ++seed) {
      CAPTURE(ranks);
      CAPTURE(seed);
      GathererConfig config;
      std::mt19937 rng(seed);  // the same sequence on every rank
      // One unit ahead, or a budget of one to many units (at least the largest, so that every unit
      // can be fetched ahead).
      const size_t budgets[] = {0, 20000, 40000, 1 << 20};
      config.prefetch_bytes = budgets[std::uniform_int_distribution<size_t>(0, 3)(rng)];
      on_ranks(ranks, config, [&](Rig& rig) {
        std::mt19937 steps(seed * 7919u);
        std::vector<Entry> order = forward_backward(kSizes.size());
        for (int s = 0; s < 6; ++s) {
          if (s % 2 == 0) {
            // A new order: units in any order, forward-only or backward-only passes, repeats.
            std::vector<size_t> units(kSizes.size());
            std::iota(units.begin(), units.end(), 0);
            std::shuffle(units.begin(), units.end(), steps);
            order.clear();
            const int kind = static_cast<int>(steps() % 3);
            for (size_t u : units) {
              if (kind != 1) order.push_back({u, GatherUse::kForward});
              if (kind != 0) order.push_back({u, GatherUse::kBackward});
            }
            if (kind == 2) order.push_back({units[0], GatherUse::kForward});
            rig.step(order);
          } else {
            // The same order again: recorded by the step before, so every gather is a prefetch.
            const StepTimings t = rig.step(order);
            CHECK(t.prefetched_bytes == t.gathered_bytes);
          }
          CHECK(rig.window_peak() <= 2 * rig.largest());
        }
      });
    }
  }
}

TEST_CASE("an order change that finds the window full of prefetches in flight evicts them instead of failing") {
  // The recorded order asks for the tiny units first, so the end of a step prefetches all but unit
  // 0 (everything the window has room for). The next step starts with unit 0: only prefetches in
  // flight can make room for it, and they must (the latest issued first), however many there are.
  GathererConfig config;
  config.prefetch_bytes = 1 << 20;
  config.max_live_bytes = (4096 + 2048) * sizeof(float);
  on_ranks(2, config, [&](Rig& rig) {
    const std::vector<size_t> tiny_first = {5, 6, 7, 1, 3, 2, 4, 0};
    std::vector<Entry> a, b;
    for (size_t u : tiny_first) a.push_back({u, GatherUse::kForward});
    for (size_t u = 0; u < kSizes.size(); ++u) b.push_back({u, GatherUse::kForward});
    rig.step(a);
    rig.step(a);
    rig.step(b);  // the order change
    const StepTimings t = rig.step(b);
    CHECK(t.gathered_bytes == rig.total_bytes(b));
    CHECK(rig.window_peak() <= config.max_live_bytes);
  });
}

TEST_CASE("prefetch runs ahead within its byte budget and never evicts a unit needed sooner") {
  // A budget of two tiny units ahead, in an order that ends with the tiny ones: the window holds
  // the unit in use and at most the budget beyond it.
  SUBCASE("within the budget") {
    GathererConfig config;
    config.prefetch_bytes = 2 * 64;
    config.max_live_bytes = 1 << 20;
    on_ranks(1, config, [&](Rig& rig) {
      std::vector<Entry> forward;
      for (size_t u = 0; u < kSizes.size(); ++u) forward.push_back({u, GatherUse::kForward});
      rig.step(forward);
      for (int s = 0; s < 2; ++s) {
        const StepTimings t = rig.step(forward);
        CHECK(t.gathered_bytes == rig.total_bytes(forward));
      }
      CHECK(rig.gatherer().peak_resident_bytes() <= rig.largest() + config.prefetch_bytes);
      // The last three units (64 bytes each) were fetched two at a time: ahead of their use.
      CHECK(rig.gatherer().peak_resident_bytes() >= rig.bytes(5) + rig.bytes(6) + rig.bytes(7));
    });
  }
  SUBCASE("a budget larger than the window") {
    // Prefetch wants every unit; the window holds units 0 and 4 but not every unit. Each step
    // gathers the forward once and, for backward, at most what did not stay; the same every step.
    GathererConfig config;
    config.prefetch_bytes = 1 << 20;
    config.max_live_bytes = (4096 + 2048) * sizeof(float);
    on_ranks(2, config, [&](Rig& rig) {
      const auto order = forward_backward(kSizes.size());
      rig.step(order);
      const uint64_t steady = rig.step(order).gathered_bytes;
      CHECK(steady >= all_units(rig));
      CHECK(steady <= rig.total_bytes(order));
      for (int s = 0; s < 2; ++s) CHECK(rig.step(order).gathered_bytes == steady);
      CHECK(rig.window_peak() <= config.max_live_bytes);
    });
  }
}

TEST_CASE("reshard_after_forward = false and param_persistence_bytes save exactly the gathers they promise") {
  const auto order = forward_backward(kSizes.size());
  SUBCASE("forward kept for backward: backward gathers nothing, from the first step on") {
    GathererConfig config;
    config.reshard_after_forward = false;
    config.max_live_bytes = 64 << 10;  // every unit at once
    on_ranks(2, config, [&](Rig& rig) {
      CHECK(rig.step(order).gathered_bytes == all_units(rig) + rig.bytes(0));
      for (int s = 0; s < 2; ++s) CHECK(rig.step(order).gathered_bytes == all_units(rig));
    });
  }
  SUBCASE("forward kept for backward in a window too small for it: kept units make room, nothing fails") {
    GathererConfig config;
    config.reshard_after_forward = false;
    on_ranks(2, config, [&](Rig& rig) {
      for (int s = 0; s < 3; ++s) rig.step(order);
      CHECK(rig.window_peak() <= 2 * rig.largest());
    });
  }
  SUBCASE("prefetch never evicts a kept unit needed before the one it fetches") {
    // The window holds units 0 and 4 together but not every unit: forward evicts unit 0 (the least
    // recently used) to make room for unit 4, and backward needs 0 again last. Prefetch, whose
    // budget is every unit, must wait for room rather than evict units 1 to 6, each needed sooner
    // than unit 0: the step gathers the forward once and unit 0 twice, nothing more.
    GathererConfig config;
    config.reshard_after_forward = false;
    config.prefetch_bytes = 1 << 20;
    config.max_live_bytes = (4096 + 2048) * sizeof(float);
    on_ranks(1, config, [&](Rig& rig) {
      rig.step(order);
      size_t forward = 0;
      for (size_t u = 0; u < kSizes.size(); ++u) forward += rig.bytes(u);
      for (int s = 0; s < 2; ++s) CHECK(rig.step(order).gathered_bytes == forward + rig.bytes(0));
    });
  }
  SUBCASE("small units stay gathered for the rest of the step, even before an order is recorded") {
    // The first step knows no order, so only persistence keeps units 5, 6 and 7 (16 elements
    // each) from their forward to their backward.
    GathererConfig config;
    config.persistence_bytes = 64;
    on_ranks(1, config, [&](Rig& rig) {
      const size_t small = rig.bytes(5) + rig.bytes(6) + rig.bytes(7);
      CHECK(rig.step(order).gathered_bytes == rig.total_bytes(order) - small + rig.bytes(0));
    });
  }
}

TEST_CASE("the window's limit: units that cannot fit are named with the option, never a hang") {
  SUBCASE("a limit below the largest unit fails at construction") {
    GathererConfig config;
    config.max_live_bytes = 1024;
    testing::run_thread_ranks(1, [&](comm::Communicator& comm) {
      CHECK_THROWS_WITH_AS(Rig(comm, kSizes, config), doctest::Contains("max_live_gathered_bytes = 1024"),
                           InvalidArgument);
    });
  }
  SUBCASE("open scopes that fill the window") {
    GathererConfig config;
    config.max_live_bytes = 4096 * 4 + 2048 * 4;  // units 0 and 4, not 2 beside them
    on_ranks(1, config, [&](Rig& rig) {
      ParamGatherer& g = rig.gatherer();
      g.acquire(0, GatherUse::kForward);
      g.acquire(4, GatherUse::kForward);
      CHECK_THROWS_WITH_AS(g.acquire(2, GatherUse::kForward),
                           doctest::Contains("open scopes hold unit 0 (16384 bytes), unit 4 (8192 bytes)"),
                           InvalidArgument);
      g.release(4, GatherUse::kForward);
      g.acquire(2, GatherUse::kForward);  // room again once a scope closes
      g.release(2, GatherUse::kForward);
      g.release(0, GatherUse::kForward);
      CHECK(rig.window_peak() <= config.max_live_bytes);
    });
  }
}

TEST_CASE("an evaluation follows the recorded forward order without changing it or counting in a step") {
  on_ranks(2, {}, [&](Rig& rig) {
    const auto order = forward_backward(kSizes.size());
    rig.step(order);
    rig.step(order);
    std::vector<size_t> forward(kSizes.size());
    std::iota(forward.begin(), forward.end(), 0);
    // Between steps, and in an order of its own: neither changes what the next step prefetches.
    CHECK(rig.evaluate(forward).gathered_bytes == 0);  // an evaluation belongs to no step
    std::vector<size_t> shuffled = forward;
    std::reverse(shuffled.begin(), shuffled.end());
    rig.evaluate(shuffled);
    // This step and the next (which follows what this one recorded) gather each use once, ahead.
    for (int s = 0; s < 2; ++s) {
      const StepTimings t = rig.step(order);
      CHECK(t.gathered_bytes == all_units(rig));
      CHECK(t.prefetched_bytes == t.gathered_bytes);
    }
    CHECK(rig.window_peak() <= 2 * rig.largest());
  });
}

TEST_CASE("in a window too small for every unit, steps after evaluations gather exactly as steps without") {
  // Backward must gather again what did not stay, ahead of use when it follows the recorded order:
  // an evaluation that leaked into that order would turn those gathers on demand.
  GathererConfig config;
  config.max_live_bytes = (4096 + 2048) * sizeof(float);
  const auto order = forward_backward(kSizes.size());
  std::vector<size_t> reversed(kSizes.size());
  std::iota(reversed.rbegin(), reversed.rend(), 0);
  auto steps = [&](bool evaluate) {
    std::vector<uint64_t> bytes;
    on_ranks(1, config, [&](Rig& rig) {
      rig.step(order);
      rig.step(order);
      if (evaluate) rig.evaluate(reversed);
      for (int s = 0; s < 2; ++s) {
        const StepTimings t = rig.step(order);
        bytes.push_back(t.gathered_bytes);
        bytes.push_back(t.prefetched_bytes);
      }
    });
    return bytes;
  };
  CHECK(steps(true) == steps(false));
}

}  // namespace zero
