#include "zero/tp_placement.h"

#include <doctest/doctest.h>

#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "base/error.h"

namespace zero {
namespace {

std::vector<float> iota(size_t n) {
  std::vector<float> v(n);
  std::iota(v.begin(), v.end(), 0.0f);
  return v;
}

size_t count(const std::vector<int64_t>& s) {
  return std::accumulate(s.begin(), s.end(), size_t{1}, [](size_t a, int64_t d) { return a * static_cast<size_t>(d); });
}

// Shards `shape` for every rank, checks each part against `expected(r)` when given, and that the
// parts reassemble the tensor exactly.
void round_trip(const std::vector<int64_t>& shape, const TpPlacement& p, int tp,
                const std::vector<std::vector<float>>& expected = {}) {
  const std::vector<float> full = iota(count(shape));
  const std::vector<int64_t> ls = local_shape("w", shape, p, tp);
  std::vector<float> back(full.size(), -1.0f);
  for (int r = 0; r < tp; ++r) {
    std::vector<float> part(count(ls), -1.0f);
    shard(full.data(), shape, p, r, tp, part.data());
    if (!expected.empty()) CHECK(part == expected[static_cast<size_t>(r)]);
    unshard(part.data(), shape, p, r, tp, back.data());
  }
  CHECK(back == full);
}

TEST_CASE("replicated: every rank holds the whole tensor") {
  CHECK(local_shape("ln.weight", {8}, TpPlacement::replicated(), 4) == std::vector<int64_t>{8});
  const std::vector<float> full = iota(8);
  std::vector<float> part(8);
  shard(full.data(), {8}, TpPlacement::replicated(), 3, 4, part.data());
  CHECK(part == full);
  CHECK(describe(TpPlacement::replicated()) == "replicated");
}

TEST_CASE("split along a dimension: column-parallel rows, row-parallel columns") {
  // [6, 2] split(0) over 3: two rows each.
  CHECK(local_shape("c_fc.weight", {6, 2}, TpPlacement::split(0), 3) == std::vector<int64_t>{2, 2});
  round_trip({6, 2}, TpPlacement::split(0), 3, {{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9, 10, 11}});
  // [2, 4] split(1) over 2: columns 0-1 and 2-3 of each row.
  CHECK(local_shape("c_proj.weight", {2, 4}, TpPlacement::split(1), 2) == std::vector<int64_t>{2, 2});
  round_trip({2, 4}, TpPlacement::split(1), 2, {{0, 1, 4, 5}, {2, 3, 6, 7}});
  // A middle dimension of a 3-D tensor, and tp 1 (the whole tensor).
  round_trip({3, 8, 5}, TpPlacement::split(1), 4);
  round_trip({3, 8, 5}, TpPlacement::split(2), 1);
  CHECK(describe(TpPlacement::split(1)) == "split(1)");
}

TEST_CASE("interleaved blocks: a fused q|k|v weight gives each rank its heads of all three") {
  // c_attn [3C, 1] with C = 4, tp = 2: q rows 0-3, k rows 4-7, v rows 8-11; rank 0 holds the first
  // half of each (its heads), rank 1 the second.
  CHECK(local_shape("c_attn.weight", {12, 1}, TpPlacement::split(0, 3), 2) == std::vector<int64_t>{6, 1});
  round_trip({12, 1}, TpPlacement::split(0, 3), 2, {{0, 1, 4, 5, 8, 9}, {2, 3, 6, 7, 10, 11}});
  // The bias [3C] the same way; a wider matrix at tp 4.
  round_trip({24}, TpPlacement::split(0, 3), 4);
  round_trip({24, 3}, TpPlacement::split(0, 3), 4);
  CHECK(describe(TpPlacement::split(0, 3)) == "split(0, 3 blocks)");
}

TEST_CASE("runs map a part's element ranges to the whole tensor and back, at any tp") {
  // Elements numbered by their whole offset: a part's element is its whole offset.
  const std::vector<std::pair<std::vector<int64_t>, TpPlacement>> cases = {
      {{12, 4}, TpPlacement::split(0)}, {{4, 12}, TpPlacement::split(1)}, {{24, 2}, TpPlacement::split(0, 3)},
      {{3, 8, 4}, TpPlacement::split(1, 2)}, {{12}, TpPlacement::replicated()}};
  for (const auto& [shape, placement] : cases) {
    const size_t total =
        static_cast<size_t>(std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<>()));
    std::vector<float> whole(total);
    std::iota(whole.begin(), whole.end(), 0.0f);
    for (int tp : {1, 2, 4}) {
      if (placement.is_split() && shape[static_cast<size_t>(placement.dim)] % (placement.blocks * tp) != 0) continue;
      const std::vector<int64_t> local = local_shape("t", shape, placement, tp);
      const size_t n = static_cast<size_t>(std::accumulate(local.begin(), local.end(), int64_t{1}, std::multiplies<>()));
      for (int r = 0; r < (placement.is_split() ? tp : 1); ++r) {
        std::vector<float> part(n);
        shard(whole.data(), shape, placement, r, tp, part.data());
        // Every sub-range of the part, its runs in local order, each run's elements where it says.
        for (size_t b = 0; b < n; b += 3) {
          for (size_t e = b + 1; e <= n; e += 5) {
            size_t at = b;
            for (const TpRun& run : part_runs(shape, placement, r, tp, b, e)) {
              CHECK(run.local == at);
              CHECK(run.part == r);
              for (size_t j = 0; j < run.n; ++j) CHECK(part[run.local + j] == static_cast<float>(run.full + j));
              at += run.n;
            }
            CHECK(at == e);
          }
        }
      }
      // The whole's ranges by part: each run names the part and the local offset that hold them.
      for (size_t b = 0; b < total; b += 7) {
        size_t at = b;
        for (const TpRun& run : whole_runs(shape, placement, tp, b, total)) {
          CHECK(run.full == at);
          std::vector<float> part(n);
          shard(whole.data(), shape, placement, run.part, tp, part.data());
          for (size_t j = 0; j < run.n; ++j) CHECK(part[run.local + j] == static_cast<float>(run.full + j));
          at += run.n;
        }
        CHECK(at == total);
      }
    }
  }
}

TEST_CASE("a split that does not divide is an error naming the parameter and the sizes") {
  try {
    local_shape("h.0.attn.c_attn.weight", {12, 4}, TpPlacement::split(0, 3), 3);
    FAIL("accepted");
  } catch (const InvalidArgument& e) {
    CHECK(std::string(e.what()).find("parameter 'h.0.attn.c_attn.weight': dimension 0 has size 12, which "
                                     "does not divide into 3 block(s) x tp 3") != std::string::npos);
  }
  CHECK_THROWS_WITH_AS(local_shape("b", {4}, TpPlacement::split(1), 2),
                       doctest::Contains("placement split(1) but the tensor has 1 dimension(s)"), InvalidArgument);
  CHECK_THROWS_WITH_AS(local_shape("b", {4}, TpPlacement::split(0, 0), 2),
                       doctest::Contains("positive number of blocks"), InvalidArgument);
  std::vector<float> full(4), part(2);
  CHECK_THROWS_WITH_AS(shard(full.data(), {4}, TpPlacement::split(0), 2, 2, part.data()),
                       doctest::Contains("tp rank 2 is outside [0, 2)"), InvalidArgument);
}

}  // namespace
}  // namespace zero
