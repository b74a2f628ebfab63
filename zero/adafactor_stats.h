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
//
// A tensor that is one rank's part of a tensor split across another group (tensor parallelism's
// split placements; FactoredTensor::split) has the statistics of the whole tensor: its slots are
// sized by the whole shape, each rank adds its part's elements at their whole rows and columns, and
// after the shard group's sum those slots are summed once more over the split's group (every rank
// of it holds the same tensors, the layouts being equal). A replicated tensor's are not: every rank
// of that group holds all of it.
#include <chrono>
#include <cstddef>
#include <map>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "zero/shard_layout.h"
#include "zero/shard_ownership.h"
#include "zero/split_tensor.h"

namespace zero {

struct FactoredTensor {
  size_t tensor = 0;  // layout tensor index
  std::string name;
  size_t rows = 0, cols = 0;  // a matrix (shape[0] x the rest); rows = cols = 0: a vector. The whole's.
  size_t numel = 0;           // the whole tensor's
  int group = 0;  // the optimizer group (its hyperparameters)
  SplitTensor split;  // set where the layout tensor is a part of it
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

  // Sums bucket `bucket`'s statistics (stats_size values) or update sums (update_size values) over
  // the shard group, then the split tensors' slots over their group, in place. Collective for a
  // bucket with tensors: every rank calls them in the same order.
  void sum_stats(size_t bucket, double* values);
  void sum_updates(size_t bucket, double* values);
  // The element-wise maximum of `n` floats over the shard group and the split tensors' group, in
  // place (a checkpoint's statistics, each rank having loaded the rows and columns of its own
  // elements). Collective.
  void merge_max(float* values, size_t n);
  bool sharded() const { return shard_ != nullptr; }

 private:
  // Sums `n` doubles over `group` (null: none), in place; `what` labels the call.
  void sum_over(comm::Communicator* group, double* values, size_t n, const char* what);
  // The split slots' values of one of a bucket's vectors, packed for their group's sum and back.
  void sum_split(size_t bucket, double* values, bool updates);

  comm::Communicator* shard_;  // null: nothing to reduce
  comm::Communicator* split_over_ = nullptr;  // the group split tensors' parts lie across (null: none)
  std::chrono::milliseconds timeout_;
  std::vector<FactoredTensor> tensors_;
  std::map<size_t, size_t> bucket_at_;
  std::vector<std::vector<Slot>> slots_;                // per bucket
  std::vector<std::pair<size_t, size_t>> sizes_;        // per bucket
  std::map<std::string, std::pair<size_t, size_t>> by_name_;  // bucket, slot
  std::vector<double> packed_;  // the split slots' values for their group's sum
};

}  // namespace zero
