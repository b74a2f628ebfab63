#pragma once
// Which part of every bucket this rank reduces into, keeps optimizer state for, and updates.
//
// Two shapes, chosen once by the stage policy:
//   replicated  every rank owns every bucket whole (stage 0, DDP): the optimizer space is the
//               padded flat space itself;
//   sharded     rank r owns chunk r of every bucket (stages 1 and 2): the optimizer space is the
//               rank's shard, its chunks back to back (ShardLayout::Bucket::shard_offset).
// Parts ask for ranges and pieces; none of them asks for the stage.
#include <cstddef>
#include <vector>

#include "zero/shard_layout.h"

namespace zero {

struct OwnedRange {
  size_t opt_begin = 0;   // offset in the optimizer space (master weights, accumulator, state)
  size_t len = 0;
  size_t flat_begin = 0;  // offset of the same elements in the flat gradient/parameter space
};

// A piece of one tensor inside the optimizer space.
struct OwnedPiece {
  size_t tensor = 0;
  size_t tensor_begin = 0, tensor_end = 0;  // element range inside the tensor
  size_t opt_offset = 0;                    // where it starts in the optimizer space
  size_t bucket = 0;
};

class ShardOwnership {
 public:
  static ShardOwnership replicated(const ShardLayout& layout);
  static ShardOwnership sharded(const ShardLayout& layout, int rank);

  bool is_replicated() const { return replicated_; }
  OwnedRange range(size_t bucket) const;
  size_t numel() const;  // length of the optimizer space
  // Tensor pieces of the optimizer space, in its order (padding excluded).
  std::vector<OwnedPiece> pieces() const;

 private:
  ShardOwnership(const ShardLayout& layout, int rank, bool replicated)
      : layout_(&layout), rank_(rank), replicated_(replicated) {}
  const ShardLayout* layout_;
  int rank_;
  bool replicated_;
};

}  // namespace zero
