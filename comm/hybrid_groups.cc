#include "comm/hybrid_groups.h"

#include <fmt/format.h>

#include <cstdint>

#include "base/check.h"

namespace zero::comm {

HybridGroups::HybridGroups(Communicator& world, int shard_group_size)
    : world_(world), shard_group_size_(shard_group_size) {
  // The ranks agree on the size before anything can throw: a rank that refused alone would leave
  // the others waiting in split().
  int64_t extremes[2] = {shard_group_size, -int64_t{shard_group_size}};  // max, -min
  world.all_reduce(extremes, 2, DType::kInt64, ReduceOp::kMax)->wait();
  if (extremes[0] != -extremes[1]) {
    ZERO_THROW(InvalidArgument,
               "shard group size differs across ranks: rank {} has {}, the ranks' sizes range from {} to {}",
               world.rank(), shard_group_size, -extremes[1], extremes[0]);
  }
  if (shard_group_size < 1) {
    ZERO_THROW(InvalidArgument, "shard group size must be >= 1, got {} (world size {})", shard_group_size,
               world.size());
  }
  if (world.size() % shard_group_size != 0) {
    ZERO_THROW(InvalidArgument, "world size {} is not a multiple of the shard group size {}", world.size(),
               shard_group_size);
  }
  if (shard_group_size == world.size()) return;  // plain sharding over the world
  // Keyed by world rank, so a rank's place in each group follows its world rank.
  const int rank = world.rank();
  shard_ = world.split(rank / shard_group_size, rank);
  replica_ = world.split(rank % shard_group_size, rank);
}

HybridGroups::~HybridGroups() = default;

std::string HybridGroups::layout() const {
  const int groups = num_shard_groups();
  return fmt::format("{} shard group{} of {} rank{}", groups, groups == 1 ? "" : "s", shard_group_size_,
                     shard_group_size_ == 1 ? "" : "s");
}

}  // namespace zero::comm
