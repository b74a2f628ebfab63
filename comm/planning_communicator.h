#pragma once
// A communicator for planning (zero/plan/): rank `rank` of `size` ranks that all do exactly what this
// one does, in one process, with nothing sent. Every collective completes at once, counts its bytes,
// and gives on the memory it can address (memory::MetaDevice::addressable) the result identical
// ranks would get: an all-gather repeats this rank's chunk, a sum multiplies by `size`, so the
// engine's agreements across ranks (registration hashes, options) pass. Memory it cannot address
// (a meta device's unbacked buffers) is left alone.
//
// The tally per operation: calls, the payload (the bytes of the operation's largest buffer, as
// nccl-tests report "size"), and the bytes each rank sends on a ring (nccl-tests' bus bytes):
// all-reduce 2(N-1)/N of the payload, reduce-scatter, all-gather and all-to-all (N-1)/N of it, a
// broadcast the payload.
//
// Point-to-point calls move nothing (a plan runs one rank: its peers' buffers do not exist here) and
// complete at once; they are tallied per peer (p2p_tallies), apart from the collectives (a pipeline
// stage's traffic is its sends and receives, not a ring's).
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/schedule_check.h"

namespace zero::comm {

// One call as issued: `count` as the Communicator method takes it.
struct PlannedCall {
  CollectiveKind kind;
  size_t count;
  DType dtype;
};

struct CollectiveTally {
  uint64_t calls = 0;
  uint64_t payload_bytes = 0;
  uint64_t wire_bytes = 0;  // sent per rank
};

// A rank's point-to-point traffic with one peer.
struct P2PTally {
  uint64_t sends = 0;
  uint64_t recvs = 0;
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;
};

class PlanningCommunicator final : public Communicator {
 public:
  using Addressable = std::function<bool(const void* p, size_t bytes)>;
  // `accepts`: the memory kind the engine's device uses (host or CUDA), so that the engine takes it.
  PlanningCommunicator(int rank, int size, Addressable addressable, memory::DeviceKind accepts);

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend_name() const override { return "planning"; }
  std::chrono::milliseconds default_timeout() const override { return std::chrono::minutes(5); }
  bool accepts(memory::DeviceKind kind) const override { return kind == accepts_ || kind == memory::DeviceKind::kPinnedHost; }

  WorkHandle all_reduce(void* buf, size_t count, DType dtype, ReduceOp op) override;
  WorkHandle reduce_scatter(const void* send, void* recv, size_t recv_count, DType dtype, ReduceOp op) override;
  WorkHandle all_gather(const void* send, void* recv, size_t send_count, DType dtype) override;
  WorkHandle broadcast(void* buf, size_t count, DType dtype, int root) override;
  WorkHandle all_to_all(const void* send, void* recv, size_t count, DType dtype) override;
  WorkHandle barrier() override;
  // Argument errors as every backend reports them (check_p2p_args); then counted, nothing moved.
  WorkHandle send(const void* buf, size_t count, DType dtype, int peer) override;
  WorkHandle recv(void* buf, size_t count, DType dtype, int peer) override;
  // What the other ranks bring to a kMax all-reduce of int64s, where the planner knows it and this
  // rank's value is not the group's (a pipeline stage's unit count against the other stages'): the
  // result is the larger of the two. By default the other ranks hold this rank's values.
  void set_peer_int64_max(int64_t value) { peer_int64_max_ = value; }
  // The groups the next split() calls cut, in order: this rank's place in each and its size (a plan
  // runs one rank, which cannot see the other ranks' colors; the planner knows the groups the engine
  // cuts, e.g. hpZ's and qgZ's nodes). Each split returns a PlanningCommunicator of that group, whose
  // collectives this one tallies apart (split_tallies). A split beyond them throws InvalidArgument.
  struct PlannedSplit {
    int rank = 0;
    int size = 1;
  };
  void plan_splits(std::vector<PlannedSplit> splits) { planned_splits_ = std::move(splits); }
  std::unique_ptr<Communicator> split(int color, int key) override;
  // The collectives of the i-th split's group, by operation name, since the last reset.
  const std::map<std::string, CollectiveTally>& split_tallies(size_t i) const { return *split_tallies_.at(i); }
  size_t splits() const { return split_tallies_.size(); }

  // By operation name ("all_reduce", ...), since construction or the last reset.
  const std::map<std::string, CollectiveTally>& tallies() const { return tallies_; }
  const std::vector<PlannedCall>& calls() const { return calls_; }
  // By peer rank, since construction or the last reset.
  const std::map<int, P2PTally>& p2p_tallies() const { return p2p_tallies_; }
  void reset_tallies() {
    tallies_.clear();
    calls_.clear();
    p2p_tallies_.clear();
    for (auto& t : split_tallies_) t->clear();
  }

 private:
  void count(CollectiveKind kind, size_t count, DType dtype, uint64_t payload, uint64_t wire);
  bool real(const void* p, size_t bytes) const { return bytes == 0 || addressable_(p, bytes); }

  int rank_, size_;
  Addressable addressable_;
  memory::DeviceKind accepts_;
  std::map<std::string, CollectiveTally> tallies_;
  std::vector<PlannedCall> calls_;
  std::map<int, P2PTally> p2p_tallies_;
  std::optional<int64_t> peer_int64_max_;
  std::vector<PlannedSplit> planned_splits_;
  std::vector<std::shared_ptr<std::map<std::string, CollectiveTally>>> split_tallies_;
  // A split's: where its collectives are tallied for the communicator it was split from (null: none).
  std::shared_ptr<std::map<std::string, CollectiveTally>> parent_tally_;
};

}  // namespace zero::comm
