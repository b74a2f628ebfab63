#include "zero/shard_ownership.h"

#include <algorithm>

namespace zero {

ShardOwnership ShardOwnership::replicated(const ShardLayout& layout) { return {layout, 0, true}; }

ShardOwnership ShardOwnership::sharded(const ShardLayout& layout, int rank) { return {layout, rank, false}; }

OwnedRange ShardOwnership::range(size_t b) const {
  const ShardLayout::Bucket& B = layout_->buckets()[b];
  if (replicated_) return {B.offset, B.padded, B.offset};
  return {B.shard_offset, B.chunk, layout_->chunk_begin(b, rank_)};
}

size_t ShardOwnership::numel() const {
  return replicated_ ? layout_->padded_numel() : layout_->shard_numel();
}

std::vector<OwnedPiece> ShardOwnership::pieces() const {
  std::vector<OwnedPiece> out;
  const auto& tensors = layout_->tensors();
  for (size_t b = 0; b < layout_->buckets().size(); ++b) {
    const ShardLayout::Bucket& B = layout_->buckets()[b];
    const OwnedRange own = range(b);
    for (size_t t = B.first_tensor; t < B.end_tensor; ++t) {
      const size_t ts = tensors[t].offset, te = ts + tensors[t].numel;
      const size_t s = std::max(ts, own.flat_begin), e = std::min(te, own.flat_begin + own.len);
      if (s < e) out.push_back({t, s - ts, e - ts, own.opt_begin + (s - own.flat_begin), b});
    }
  }
  return out;
}

}  // namespace zero
