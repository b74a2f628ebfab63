#include "zero/shard_ownership.h"

#include <doctest/doctest.h>

namespace zero {

TEST_CASE("replicated ownership covers every bucket whole; sharded ownership one chunk each") {
  const ShardLayout layout({100, 3000, 50}, 2, {.alignment = 4, .bucket_numel = 1024, .block = 16});
  const auto rep = ShardOwnership::replicated(layout);
  CHECK(rep.is_replicated());
  CHECK(rep.numel() == layout.padded_numel());
  size_t covered = 0;
  for (const OwnedPiece& p : rep.pieces()) covered += p.tensor_end - p.tensor_begin;
  CHECK(covered == 3150);

  size_t both = 0;
  for (int r = 0; r < 2; ++r) {
    const auto sh = ShardOwnership::sharded(layout, r);
    CHECK_FALSE(sh.is_replicated());
    CHECK(sh.numel() == layout.shard_numel());
    for (size_t b = 0; b < layout.buckets().size(); ++b) {
      const OwnedRange own = sh.range(b);
      CHECK(own.len == layout.buckets()[b].chunk);
      CHECK(own.flat_begin == layout.chunk_begin(b, r));
      CHECK(own.opt_begin == layout.buckets()[b].shard_offset);
    }
    size_t prev_end = 0;
    for (const OwnedPiece& p : sh.pieces()) {
      CHECK(p.opt_offset >= prev_end);  // pieces in optimizer-space order, not overlapping
      prev_end = p.opt_offset + (p.tensor_end - p.tensor_begin);
      both += p.tensor_end - p.tensor_begin;
    }
  }
  CHECK(both == 3150);  // the two shards together hold every element once
}

}  // namespace zero
