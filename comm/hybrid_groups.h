#pragma once
// Hybrid sharding (HSDP; DeepSpeed's MiCS) groups: the world cut into shard groups of consecutive
// ranks, each sharding the whole state over its members, and replica groups of the ranks that hold
// the same shard in every group. A sharded engine takes the pair as its communicators
// (zero::EngineComms{.shard = g.shard(), .replica = g.replica()}).
//
// World 4, shard group size 2: shard groups {0, 1} and {2, 3}; replica groups {0, 2} and {1, 3}.
// Consecutive ranks share a shard group because launchers number a node's ranks consecutively, so the
// frequent collectives (reduce-scatter, all-gather) stay on a node's fast links and only the gradient
// shard's all-reduce crosses nodes.
#include <memory>
#include <string>

#include "comm/communicator.h"

namespace zero::comm {

class HybridGroups {
 public:
  // Collective over `world` (it splits it): every rank must call it, with the same size. Throws
  // InvalidArgument on every rank when the ranks' sizes differ, when the size is < 1, or when the
  // world size is not a multiple of it. `world` must outlive this object.
  HybridGroups(Communicator& world, int shard_group_size);
  ~HybridGroups();
  HybridGroups(const HybridGroups&) = delete;
  HybridGroups& operator=(const HybridGroups&) = delete;

  // This rank's shard group: world ranks [g * size, (g + 1) * size) for g = world rank / size, in
  // which this rank is world rank % size. The world itself when the size is the world size.
  Communicator* shard() const { return shard_ ? shard_.get() : &world_; }
  // The ranks with this rank's shard rank in every shard group, ordered by group (this rank is
  // world rank / size in it); nullptr when one shard group is the whole world (plain sharding).
  Communicator* replica() const { return replica_.get(); }

  int shard_group_size() const { return shard_group_size_; }
  int num_shard_groups() const { return world_.size() / shard_group_size_; }
  // "2 shard groups of 2 ranks".
  std::string layout() const;

 private:
  Communicator& world_;
  int shard_group_size_;
  std::unique_ptr<Communicator> shard_;    // null when the world is the one shard group
  std::unique_ptr<Communicator> replica_;  // null when there is nothing to replicate across
};

}  // namespace zero::comm
