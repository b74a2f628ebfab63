// MatrixExchange on real collectives (thread ranks): on 1-4 ranks, with matrices that rank chunks
// cut, every rank's chunk comes back as newton_schulz of each whole matrix computed on one rank,
// bit for bit; the whole step's matrices are handed out so that no rank runs more than the largest
// matrix's FLOPs beyond the least loaded one (nor beyond an even share); replicated ownership
// orthogonalizes locally, bucket by bucket; a matrix across buckets is refused.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "base/error.h"
#include "memory/device.h"
#include "memory/tracker.h"
#include "optim/newton_schulz.h"
#include "testing/thread_ranks.h"
#include "zero/matrix_exchange.h"
#include "zero/shard_layout.h"
#include "zero/shard_ownership.h"

namespace zero {
namespace {

using namespace std::chrono_literals;

struct Shape {
  size_t rows, cols;
};
// Tensors 1 and 4 are vectors (not exchanged), the rest matrices of different sizes.
const std::vector<Shape> kShapes{{12, 20}, {1, 7}, {30, 6}, {16, 16}, {1, 5}, {9, 40}, {8, 8}};

float value_of(size_t tensor, size_t e) { return std::sin(static_cast<float>(tensor * 131 + e * 7)) * 0.3f; }

// The whole flat space (every bucket's values) as every rank would gather it.
std::vector<float> flat_values(const ShardLayout& layout) {
  std::vector<float> flat(layout.padded_numel(), 0.0f);
  for (size_t t = 0; t < layout.tensors().size(); ++t) {
    for (size_t e = 0; e < layout.tensors()[t].numel; ++e) flat[layout.tensors()[t].offset + e] = value_of(t, e);
  }
  return flat;
}

// Writes every bucket's owned range of `flat` as its input, then orthogonalizes as a step does:
// the whole step's at once where the exchange exchanges, else bucket by bucket. fn(bucket, result)
// for each bucket with matrices (the result in the exchange's input buffer).
template <typename Fn>
void exchange_step(MatrixExchange& exchange, const ShardOwnership& own, size_t buckets, const std::vector<float>& flat,
                   Fn&& fn) {
  auto write = [&](size_t b) {
    const OwnedRange r = own.range(b);
    std::memcpy(exchange.input(b), flat.data() + r.flat_begin, r.len * sizeof(float));
  };
  if (exchange.exchanges()) {
    for (size_t b = 0; b < buckets; ++b) {
      if (exchange.has_matrices(b)) write(b);
    }
    exchange.orthogonalize_step();
    for (size_t b = 0; b < buckets; ++b) {
      if (exchange.has_matrices(b)) fn(b, static_cast<const float*>(exchange.input(b)));
    }
    return;
  }
  for (size_t b = 0; b < buckets; ++b) {
    if (!exchange.has_matrices(b)) continue;
    write(b);
    exchange.orthogonalize_bucket(b);
    fn(b, static_cast<const float*>(exchange.input(b)));
  }
}

std::vector<ExchangedMatrix> matrices() {
  std::vector<ExchangedMatrix> m;
  for (size_t t = 0; t < kShapes.size(); ++t) {
    if (kShapes[t].rows > 1) m.push_back({t, kShapes[t].rows, kShapes[t].cols, {}});
  }
  return m;
}

ShardLayout layout_for(int world) {
  std::vector<size_t> numels;
  for (const Shape& s : kShapes) numels.push_back(s.rows * s.cols);
  return ShardLayout(numels, world, {.alignment = 4, .bucket_numel = 300, .block = 16, .whole_tensor_buckets = true});
}

TEST_CASE("each matrix is orthogonalized whole by one rank and its pieces come back bit for bit") {
  for (int world : {1, 2, 3, 4}) {
    CAPTURE(world);
    const ShardLayout layout = layout_for(world);
    const std::vector<float> flat = flat_values(layout);
    // What every rank must get: newton_schulz of each whole matrix, in place in the flat space.
    std::vector<float> expected = flat;
    for (const ExchangedMatrix& m : matrices()) {
      float* x = expected.data() + layout.tensors()[m.tensor].offset;
      optim::newton_schulz(x, m.rows, m.cols, x);
    }
    std::vector<std::vector<double>> flops(static_cast<size_t>(world));
    testing::run_thread_ranks(world, [&](comm::Communicator& comm) {
      memory::MemoryTracker tracker;
      auto host = memory::make_host_device(tracker);
      const ShardOwnership own = ShardOwnership::sharded(layout, comm.rank());
      MatrixExchange exchange(layout, own, matrices(), &comm, *host, 10s);
      CHECK(exchange.exchanges() == (world > 1));
      exchange_step(exchange, own, layout.buckets().size(), flat, [&](size_t b, const float* u) {
        CAPTURE(b);
        const OwnedRange r = own.range(b);
        for (const ExchangedMatrix& m : matrices()) {
          const ShardLayout::Tensor& t = layout.tensors()[m.tensor];
          for (size_t e = 0; e < t.numel; ++e) {
            const size_t at = t.offset + e;
            if (at < r.flat_begin || at >= r.flat_begin + r.len) continue;
            if (u[at - r.flat_begin] != expected[at]) {
              FAIL("rank " << comm.rank() << ": element " << e << " of tensor " << m.tensor << " differs");
            }
          }
        }
      });
      flops[static_cast<size_t>(comm.rank())] = exchange.flops_per_rank();
    });
    // Every rank agrees on the assignment, and it is balanced within the largest matrix.
    double largest = 0, total = 0;
    for (const ExchangedMatrix& m : matrices()) {
      largest = std::max(largest, optim::newton_schulz_flops(m.rows, m.cols, 5));
      total += optim::newton_schulz_flops(m.rows, m.cols, 5);
    }
    for (const auto& f : flops) {
      CHECK(f == flops[0]);
      CHECK(*std::max_element(f.begin(), f.end()) - *std::min_element(f.begin(), f.end()) <= largest);
      CHECK(*std::max_element(f.begin(), f.end()) <= total / world + largest);
    }
    if (world > 1) CHECK(*std::min_element(flops[0].begin(), flops[0].end()) > 0);  // every rank takes a share
  }
}

TEST_CASE("replicated ownership orthogonalizes every matrix locally") {
  const ShardLayout layout = layout_for(2);
  const std::vector<float> flat = flat_values(layout);
  memory::MemoryTracker tracker;
  auto host = memory::make_host_device(tracker);
  const ShardOwnership own = ShardOwnership::replicated(layout);
  MatrixExchange exchange(layout, own, matrices(), nullptr, *host, 10s);
  CHECK_FALSE(exchange.exchanges());
  exchange_step(exchange, own, layout.buckets().size(), flat, [&](size_t b, const float* u) {
    const OwnedRange r = own.range(b);
    for (const ExchangedMatrix& m : matrices()) {
      const ShardLayout::Tensor& t = layout.tensors()[m.tensor];
      if (layout.buckets_of_tensor(m.tensor).first != b) continue;
      std::vector<float> want(flat.begin() + static_cast<long>(t.offset), flat.begin() + static_cast<long>(t.offset + t.numel));
      optim::newton_schulz(want.data(), m.rows, m.cols, want.data());
      CHECK(std::memcmp(want.data(), u + (t.offset - r.flat_begin), t.numel * sizeof(float)) == 0);
    }
  });
}

TEST_CASE("a matrix across buckets is refused") {
  std::vector<size_t> numels;
  for (const Shape& s : kShapes) numels.push_back(s.rows * s.cols);
  const ShardLayout cut(numels, 2, {.alignment = 4, .bucket_numel = 64, .block = 16});
  memory::MemoryTracker tracker;
  auto host = memory::make_host_device(tracker);
  const ShardOwnership own = ShardOwnership::replicated(cut);
  CHECK_THROWS_WITH_AS(MatrixExchange(cut, own, matrices(), nullptr, *host, 10s),
                       doctest::Contains("lies across buckets"), InvalidArgument);
}

}  // namespace
}  // namespace zero
