// GradReducer with two ranks as threads: reduced sums land in the owned ranges at each ownership,
// whatever order the completions come in; micro-steps and no-sync micro-steps accumulate; user
// gradient storage is added in and zeroed; clear() empties everything.
#include "zero/grad_reducer.h"

#include <doctest/doctest.h>

#include <vector>

#include "base/dtype.h"
#include "memory/device.h"
#include "testing/thread_ranks.h"

namespace zero {
namespace {

const std::vector<size_t> kNumels = {300, 50, 700};
const ShardLayoutOptions kLayout{.alignment = 4, .bucket_numel = 256, .block = 16};

// The gradient rank r writes for element e of tensor t in micro-step m (small integers / 1024:
// every sum is exact in fp32).
float grad_value(int r, size_t t, size_t e, int m) {
  return static_cast<float>((r + 1) * static_cast<int>(t + 1) + m) + static_cast<float>(e % 64) / 1024.0f;
}

// The sum over ranks and micro-steps at flat offset f (0 in padding).
float expected(const ShardLayout& layout, size_t f, int ranks, int micro) {
  for (size_t t = 0; t < layout.tensors().size(); ++t) {
    const auto& T = layout.tensors()[t];
    if (f < T.offset || f >= T.offset + T.numel) continue;
    float s = 0;
    for (int r = 0; r < ranks; ++r) {
      for (int m = 0; m < micro; ++m) s += grad_value(r, t, f - T.offset, m);
    }
    return s;
  }
  return 0.0f;
}

struct Case {
  const char* name;
  bool sharded, full, accumulate;
};

void write_grads(GradReducer& red, const ShardLayout& layout, int rank, int m, bool reverse) {
  const size_t n = layout.tensors().size();
  for (size_t k = 0; k < n; ++k) {
    const size_t t = reverse ? n - 1 - k : k;
    float* g = static_cast<float*>(red.grad(t));
    for (size_t e = 0; e < layout.tensors()[t].numel; ++e) g[e] += grad_value(rank, t, e, m);
    red.tensor_ready(t);
  }
}

void check_reduced(const GradReducer& red, const ShardLayout& layout, const ShardOwnership& own, int ranks,
                   int micro) {
  for (size_t b = 0; b < layout.buckets().size(); ++b) {
    const OwnedRange r = own.range(b);
    const float* g = static_cast<const float*>(red.reduced(b).ptr);
    for (size_t i = 0; i < r.len; ++i) {
      if (g[i] != expected(layout, r.flat_begin + i, ranks, micro)) {
        FAIL_CHECK("bucket " << b << " element " << i << ": " << g[i] << " != "
                              << expected(layout, r.flat_begin + i, ranks, micro));
        return;
      }
    }
  }
}

}  // namespace

TEST_CASE("reduced gradients land in the owned ranges, whatever the completion order") {
  for (const Case c : {Case{"replicated, full buffer", false, true, false}, Case{"sharded, full buffer", true, true, false},
                       Case{"sharded, staging + accumulator", true, false, true}}) {
    CAPTURE(c.name);
    testing::run_thread_ranks(2, [&](comm::Communicator& comm) {
      memory::MemoryTracker tracker;
      auto device = memory::make_host_device(tracker);
      const ShardLayout layout(kNumels, 2, kLayout);
      const ShardOwnership own = c.sharded ? ShardOwnership::sharded(layout, comm.rank()) : ShardOwnership::replicated(layout);
      GradReducer red({.full_grads = c.full, .accumulate = c.accumulate}, layout, own, {&comm}, *device,
                      std::vector<UserGrad>(kNumels.size()));
      red.begin_micro_step(true);
      write_grads(red, layout, comm.rank(), 0, comm.rank() == 1);  // rank 1 completes in reverse
      red.end_micro_step();
      check_reduced(red, layout, own, 2, 1);
    });
  }
}

TEST_CASE("micro-steps accumulate, no-sync ones locally until the next sync micro-step") {
  for (bool full : {true, false}) {
    CAPTURE(full);
    testing::run_thread_ranks(2, [&](comm::Communicator& comm) {
      memory::MemoryTracker tracker;
      auto device = memory::make_host_device(tracker, {.threaded_streams = true});
      const ShardLayout layout(kNumels, 2, kLayout);
      const ShardOwnership own = ShardOwnership::sharded(layout, comm.rank());
      GradReducer red({.full_grads = full, .accumulate = true}, layout, own, {&comm}, *device,
                      std::vector<UserGrad>(kNumels.size()));
      for (int m = 0; m < 3; ++m) {
        red.begin_micro_step(m != 1);  // micro-step 1 does not communicate
        write_grads(red, layout, comm.rank(), m, m == 2);
        red.end_micro_step();
        CHECK(red.holds_unreduced() == (m == 1));
      }
      check_reduced(red, layout, own, 2, 3);
      red.clear();
      for (size_t b = 0; b < layout.buckets().size(); ++b) {
        red.begin_micro_step(true);
        red.end_micro_step();  // nothing written: everything reduces to zero
        const float* g = static_cast<const float*>(red.reduced(b).ptr);
        for (size_t i = 0; i < own.range(b).len; ++i) REQUIRE(g[i] == 0.0f);
        red.clear();
      }
    });
  }
}

// Backward writes 16-bit gradients on the compute stream (the test's thread); the reduce stream (a
// worker thread here) converts them to fp32 before the collective. Under TSan, a missing event wait
// between the two is a data race.
TEST_CASE("16-bit gradients are converted on the reduce stream after backward's writes") {
  testing::run_thread_ranks(2, [&](comm::Communicator& comm) {
    memory::MemoryTracker tracker;
    auto device = memory::make_host_device(tracker, {.threaded_streams = true});
    const ShardLayout layout(kNumels, 2, kLayout, {}, {}, std::vector<DType>(kNumels.size(), DType::kBFloat16));
    const ShardOwnership own = ShardOwnership::sharded(layout, comm.rank());
    GradReducer red({.reduce_dtype = DType::kFloat32, .full_grads = false,
                     .accumulate = true},
                    layout, own, {&comm}, *device, std::vector<UserGrad>(kNumels.size()));
    for (int m = 0; m < 2; ++m) {
      red.begin_micro_step(true);
      for (size_t t = kNumels.size(); t-- > 0;) {
        auto* g = static_cast<uint16_t*>(red.grad(t));
        const float v = static_cast<float>((comm.rank() + 1) * static_cast<int>(t + 1) + m);  // exact in bf16
        for (size_t e = 0; e < kNumels[t]; ++e) g[e] = fp32_to_bf16_bits(v);
        red.tensor_ready(t);
      }
      red.end_micro_step();
    }
    for (size_t b = 0; b < layout.buckets().size(); ++b) {
      const OwnedRange r = own.range(b);
      const float* acc = static_cast<const float*>(red.reduced(b).ptr);
      for (size_t i = 0; i < r.len; ++i) {
        float want = 0;
        for (size_t t = 0; t < kNumels.size(); ++t) {
          const auto& T = layout.tensors()[t];
          if (r.flat_begin + i >= T.offset && r.flat_begin + i < T.offset + T.numel) {
            want = static_cast<float>(3 * static_cast<int>(t + 1) * 2 + 2);  // ranks 1 + 2, micro-steps 0 + 1
          }
        }
        REQUIRE(acc[i] == want);
      }
    }
  });
}

TEST_CASE("user gradient storage is added in when complete, then zeroed") {
  testing::run_thread_ranks(2, [&](comm::Communicator& comm) {
    memory::MemoryTracker tracker;
    auto device = memory::make_host_device(tracker);
    const ShardLayout layout(kNumels, 2, kLayout);
    const ShardOwnership own = ShardOwnership::sharded(layout, comm.rank());
    std::vector<std::vector<float>> user(kNumels.size());
    std::vector<UserGrad> grads;
    for (size_t t = 0; t < kNumels.size(); ++t) {
      user[t].assign(kNumels[t], 0.0f);
      grads.push_back({user[t].data()});
    }
    GradReducer red({.full_grads = false, .accumulate = true}, layout, own, {&comm}, *device, grads);
    red.begin_micro_step(true);
    for (size_t t = 0; t < kNumels.size(); ++t) {
      for (size_t e = 0; e < kNumels[t]; ++e) user[t][e] = grad_value(comm.rank(), t, e, 0);
      red.tensor_ready(t);
      for (float v : user[t]) REQUIRE(v == 0.0f);
    }
    red.end_micro_step();
    check_reduced(red, layout, own, 2, 1);
  });
}

}  // namespace zero
