#pragma once
// AdafactorStats: the sums Adafactor needs over a whole tensor (optim/adafactor.h) while at stages
// 1-3 each rank holds pieces of it. Per bucket, in the update's bucket order, every rank of the shard
// group adds its elements' contributions into a vector of doubles laid out per tensor of the bucket
// (slots(): for a matrix its row sums, its column sums and its sum of squares; for a vector its sum
// of squares) and all-reduces it (sum), then once more for the update's sum of squares (one per
// tensor): n + m + 1 and 1 doubles per matrix, not the matrix. The layout keeps each tensor inside
// one bucket (ShardLayoutOptions::whole_tensor_buckets and the whole-in-bucket marks), so every sum
// is complete after its bucket's reductions. Replicated ownership (stage 0) or one rank: the owned
// range is the whole bucket, and nothing is reduced.
#include <chrono>
#include <cstddef>
#include <map>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "zero/shard_layout.h"
#include "zero/shard_ownership.h"

namespace zero {

struct FactoredTensor {
  size_t tensor = 0;  // layout tensor index
  std::string name;
  size_t rows = 0, cols = 0;  // a matrix (shape[0] x the rest); rows = cols = 0: a vector
  size_t numel = 0;
  int group = 0;  // the optimizer group (its hyperparameters)
};

class AdafactorStats {
 public:
  // Where a tensor's sums sit in its bucket's vectors.
  struct Slot {
    FactoredTensor t;
    size_t index = 0;      // in tensors()
    size_t rows_at = 0;    // first: rows values, then cols values (a matrix)
    size_t squares_at = 0;  // the parameter's sum of squares
    size_t update_at = 0;   // in the second vector: the update's sum of squares
  };

  // `shard`: the group the layout's chunks are cut over (null or one rank: no collective). Throws
  // InvalidArgument when `shard` does not take host memory or a tensor lies across buckets.
  AdafactorStats(const ShardLayout& layout, const ShardOwnership& ownership, std::vector<FactoredTensor> tensors,
                 comm::Communicator* shard, std::chrono::milliseconds timeout);

  // The bucket whose owned range starts at optimizer-space element `opt_begin`; SIZE_MAX if none.
  size_t bucket_at(size_t opt_begin) const;
  const std::vector<Slot>& slots(size_t bucket) const { return slots_[bucket]; }
  // The lengths of bucket `bucket`'s two vectors.
  size_t stats_size(size_t bucket) const { return sizes_[bucket].first; }
  size_t update_size(size_t bucket) const { return sizes_[bucket].second; }
  // The slot of a tensor by name (nullptr: not an Adafactor tensor).
  const Slot* find(const std::string& name) const;
  const std::vector<FactoredTensor>& tensors() const { return tensors_; }

  // Sums `n` doubles over the shard group, in place. Collective for a bucket with tensors: every
  // rank calls it (the same n), in the same order.
  void sum(double* values, size_t n);
  // The element-wise maximum of `n` floats over the shard group, in place (a checkpoint's statistics,
  // each rank having loaded the rows and columns of its own elements). Collective.
  void merge_max(float* values, size_t n);
  bool sharded() const { return shard_ != nullptr; }

 private:
  comm::Communicator* shard_;  // null: nothing to reduce
  std::chrono::milliseconds timeout_;
  std::vector<FactoredTensor> tensors_;
  std::map<size_t, size_t> bucket_at_;
  std::vector<std::vector<Slot>> slots_;                // per bucket
  std::vector<std::pair<size_t, size_t>> sizes_;        // per bucket
  std::map<std::string, std::pair<size_t, size_t>> by_name_;  // bucket, slot
};

}  // namespace zero
