#include "zero/adafactor_stats.h"

#include <algorithm>
#include <cstddef>

#include "base/check.h"

namespace zero {

AdafactorStats::AdafactorStats(const ShardLayout& layout, const ShardOwnership& ownership,
                               std::vector<FactoredTensor> tensors, comm::Communicator* shard,
                               std::chrono::milliseconds timeout)
    : shard_(ownership.is_replicated() || shard == nullptr || shard->size() == 1 ? nullptr : shard),
      timeout_(timeout), tensors_(std::move(tensors)), slots_(layout.buckets().size()),
      sizes_(layout.buckets().size(), {0, 0}) {
  if (shard_ != nullptr && !shard_->accepts(memory::DeviceKind::kHost)) {
    ZERO_THROW(InvalidArgument,
               "Adafactor's statistics are reduced in host memory but the shard group's {} communicator takes "
               "device memory only", shard_->backend_name());
  }
  for (size_t b = 0; b < layout.buckets().size(); ++b) bucket_at_[ownership.range(b).opt_begin] = b;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const FactoredTensor& t = tensors_[i];
    const auto [first, last] = layout.buckets_of_tensor(t.tensor);
    if (first != last) {
      ZERO_THROW(InvalidArgument, "parameter '{}' lies across buckets {} and {}: Adafactor needs whole-tensor buckets",
                 t.name, first, last);
    }
    ZERO_CHECK(t.rows * t.cols == (t.rows == 0 ? 0 : t.numel), "matrix {} x {} for '{}' of {} elements", t.rows, t.cols,
               t.name, t.numel);
    if (t.split) {
      if (split_over_ != nullptr && split_over_ != t.split.over) {
        ZERO_THROW(InvalidArgument,
                   "parameter '{}' is split across another group than the Adafactor tensors before it: their "
                   "statistics are summed over one",
                   t.name);
      }
      split_over_ = t.split.over;
    }
    auto& [stats, updates] = sizes_[first];
    Slot s{t, i, stats, stats + t.rows + t.cols, updates};
    stats += t.rows + t.cols + 1;
    updates += 1;
    by_name_[t.name] = {first, slots_[first].size()};
    slots_[first].push_back(std::move(s));
  }
}

size_t AdafactorStats::bucket_at(size_t opt_begin) const {
  const auto it = bucket_at_.find(opt_begin);
  return it == bucket_at_.end() ? SIZE_MAX : it->second;
}

const AdafactorStats::Slot* AdafactorStats::find(const std::string& name) const {
  const auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &slots_[it->second.first][it->second.second];
}

void AdafactorStats::sum_over(comm::Communicator* group, double* values, size_t n, const char* what) {
  if (group == nullptr || n == 0) return;
  comm::CallLabel label(*group, what);
  group->all_reduce(values, n, DType::kFloat64, comm::ReduceOp::kSum)->wait(timeout_);
}

void AdafactorStats::sum_stats(size_t bucket, double* values) {
  sum_over(shard_, values, stats_size(bucket), "adafactor statistics");
  sum_split(bucket, values, false);
}

void AdafactorStats::sum_updates(size_t bucket, double* values) {
  sum_over(shard_, values, update_size(bucket), "adafactor update sums");
  sum_split(bucket, values, true);
}

void AdafactorStats::sum_split(size_t bucket, double* values, bool updates) {
  if (split_over_ == nullptr || split_over_->size() == 1) return;
  // A slot's statistics are contiguous: its rows, its columns, its sum of squares (a vector's: the sum).
  const auto range = [&](const Slot& s) {
    return updates ? std::pair{s.update_at, s.update_at + 1} : std::pair{s.rows_at, s.squares_at + 1};
  };
  packed_.clear();
  for (const Slot& s : slots_[bucket]) {
    if (!s.t.split) continue;
    const auto [lo, hi] = range(s);
    packed_.insert(packed_.end(), values + lo, values + hi);
  }
  if (packed_.empty()) return;
  sum_over(split_over_, packed_.data(), packed_.size(),
           updates ? "adafactor split update sums" : "adafactor split statistics");
  size_t at = 0;
  for (const Slot& s : slots_[bucket]) {
    if (!s.t.split) continue;
    const auto [lo, hi] = range(s);
    const auto from = packed_.begin() + static_cast<std::ptrdiff_t>(at);
    std::copy(from, from + static_cast<std::ptrdiff_t>(hi - lo), values + lo);
    at += hi - lo;
  }
}

void AdafactorStats::merge_max(float* values, size_t n) {
  if (n == 0) return;
  for (comm::Communicator* group : {shard_, split_over_}) {
    if (group == nullptr || group->size() == 1) continue;
    comm::CallLabel label(*group, "adafactor statistics merge");
    group->all_reduce(values, n, DType::kFloat32, comm::ReduceOp::kMax)->wait(timeout_);
  }
}

}  // namespace zero
