#include "layout/shrink.h"

#include <doctest/doctest.h>

#include "base/error.h"

namespace zero {
namespace {

Layout planned(int dp, int tp, int pp, int m) {
  Layout l;
  l.dp = dp;
  l.tp = tp;
  l.pp = pp;
  l.micro_batches = m;
  l.stage = 3;
  return l;
}

TEST_CASE("the header's cases: the micro-batch keeps its rows, dp takes what splits the batch") {
  ShrunkLayout s = shrink_layout(planned(4, 1, 1, 3), 48, 3, "test");
  CHECK(s.layout.dp == 3);
  CHECK(s.layout.micro_batches == 4);
  CHECK(s.spares == 0);
  CHECK(s.layout.stage == 3);

  s = shrink_layout(planned(4, 1, 1, 1), 48, 3, "test");
  CHECK(s.layout.dp == 2);
  CHECK(s.layout.micro_batches == 2);
  CHECK(s.spares == 1);
}

TEST_CASE("the model-parallel shape is kept; the ranks past one copy are spares") {
  Layout p = planned(2, 2, 2, 4);
  p.schedule = "zb-v";
  p.chunks = 2;
  p.sequence_parallel = true;
  // 7 ranks left of 8: one copy of tp 2 x pp 2, twice the micro-batches, 3 spares.
  const ShrunkLayout s = shrink_layout(p, 32, 7, "test");
  CHECK(s.layout.dp == 1);
  CHECK(s.layout.tp == 2);
  CHECK(s.layout.pp == 2);
  CHECK(s.layout.micro_batches == 8);
  CHECK(s.layout.schedule == "zb-v");
  CHECK(s.layout.chunks == 2);
  CHECK(s.layout.sequence_parallel);
  CHECK(s.spares == 3);
  // The same world again is the planned layout.
  CHECK(shrink_layout(p, 32, 8, "test").layout == p);
}

TEST_CASE("the interleaved schedule keeps a multiple of pp micro-batches") {
  Layout p = planned(3, 1, 2, 2);
  p.schedule = "interleaved";
  p.chunks = 2;
  // 24 rows in micro-batches of 4: dp 2 would run 3 micro-batches (not a multiple of pp 2), dp 1 runs 6.
  const ShrunkLayout s = shrink_layout(p, 24, 5, "test");
  CHECK(s.layout.dp == 1);
  CHECK(s.layout.micro_batches == 6);
  CHECK(s.spares == 3);
}

TEST_CASE("a hybrid-sharding group keeps its size where it divides the new dp") {
  Layout p = planned(8, 1, 1, 1);
  p.shard = 4;
  CHECK(shrink_layout(p, 64, 7, "test").layout.dp == 4);
  CHECK(shrink_layout(p, 64, 7, "test").layout.shard == 0);  // one group of all 4
  p.shard = 2;
  const ShrunkLayout s = shrink_layout(p, 64, 7, "test");
  CHECK(s.layout.dp == 4);
  CHECK(s.layout.shard == 2);
}

TEST_CASE("named when no layout fits") {
  CHECK_THROWS_WITH_AS(shrink_layout(planned(2, 2, 2, 1), 8, 3, "the restart"),
                       "the restart: no layout fits 3 rank(s): one copy of the model takes tp 2 x pp 2 = 4",
                       InvalidArgument);
  CHECK_THROWS_WITH_AS(shrink_layout(planned(4, 1, 1, 2), 20, 3, "the restart"),
                       "the restart: the global batch of 20 rows does not split into dp 4 x 2 micro-batches",
                       InvalidArgument);
  // dp 1 always splits a batch that split as planned: a single rank that holds the model fits.
  CHECK(shrink_layout(planned(4, 1, 1, 1), 44, 1, "test").layout.micro_batches == 4);
}

}  // namespace
}  // namespace zero
