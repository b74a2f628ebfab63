#pragma once
// The bytes a process sent to each rank of the world, counted where a backend hands each message to
// its transport (the Gloo communicator: every data message, schedule-check record and point-to-point
// transfer), so that what a step moved over each link is measured, not computed from a formula.
// One PeerTraffic is shared by a communicator and every communicator split from it; each counts
// through a TrafficTap that maps its own ranks to the world's.
//
//   auto traffic = std::make_shared<comm::PeerTraffic>(world_size);   // GlooOptions::traffic
//   ...a step...
//   comm::LinkBytes b = comm::by_link(traffic->sent(), rank, ranks_per_node);
#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

namespace zero::comm {

class PeerTraffic {
 public:
  explicit PeerTraffic(int world_size);
  int world_size() const { return size_; }
  // Thread-safe (every communicator's worker adds). A rank out of range is a caller's bug (checked).
  void add(int world_rank, uint64_t bytes);
  // Bytes sent to each world rank since construction.
  std::vector<uint64_t> sent() const;

 private:
  int size_;
  std::unique_ptr<std::atomic<uint64_t>[]> bytes_;
};

// A communicator's view: its rank `peer` is world rank world_ranks[peer] (the identity when empty).
class TrafficTap {
 public:
  TrafficTap() = default;
  TrafficTap(std::shared_ptr<PeerTraffic> traffic, std::vector<int> world_ranks)
      : traffic_(std::move(traffic)), world_ranks_(std::move(world_ranks)) {}
  void sent(int peer, uint64_t bytes) const {
    if (traffic_) traffic_->add(world_ranks_.empty() ? peer : world_ranks_[static_cast<size_t>(peer)], bytes);
  }

 private:
  std::shared_ptr<PeerTraffic> traffic_;
  std::vector<int> world_ranks_;
};

// Bytes to the ranks of this rank's node and to the others, nodes being `ranks_per_node` consecutive
// world ranks (as launchers number them).
struct LinkBytes {
  uint64_t in_node = 0;
  uint64_t between_nodes = 0;
};
LinkBytes by_link(const std::vector<uint64_t>& sent, int rank, int ranks_per_node);

}  // namespace zero::comm
