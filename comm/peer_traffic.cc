#include "comm/peer_traffic.h"

#include "base/check.h"

namespace zero::comm {

PeerTraffic::PeerTraffic(int world_size)
    : size_(world_size), bytes_(std::make_unique<std::atomic<uint64_t>[]>(static_cast<size_t>(world_size))) {
  ZERO_CHECK_GE(world_size, 1, "a world of no ranks");
  for (int r = 0; r < size_; ++r) bytes_[static_cast<size_t>(r)].store(0, std::memory_order_relaxed);
}

void PeerTraffic::add(int world_rank, uint64_t bytes) {
  ZERO_CHECK(world_rank >= 0 && world_rank < size_, "peer {} outside a world of {}", world_rank, size_);
  bytes_[static_cast<size_t>(world_rank)].fetch_add(bytes, std::memory_order_relaxed);
}

std::vector<uint64_t> PeerTraffic::sent() const {
  std::vector<uint64_t> out(static_cast<size_t>(size_));
  for (int r = 0; r < size_; ++r) out[static_cast<size_t>(r)] = bytes_[static_cast<size_t>(r)].load(std::memory_order_relaxed);
  return out;
}

LinkBytes by_link(const std::vector<uint64_t>& sent, int rank, int ranks_per_node) {
  ZERO_CHECK_GE(ranks_per_node, 1, "nodes of no ranks");
  LinkBytes b;
  for (size_t r = 0; r < sent.size(); ++r) {
    (static_cast<int>(r) / ranks_per_node == rank / ranks_per_node ? b.in_node : b.between_nodes) += sent[r];
  }
  return b;
}

}  // namespace zero::comm
