#pragma once
// The pairing check of point-to-point transfers, for every backend: says why a transfer waits when
// its partner disagrees, without costing a transfer that meets in time anything.
//
// A send and the receive it must meet can disagree (count, dtype, label); the Gloo backend then
// never matches them (its slots differ), NCCL stalls or completes short. Either way the two ranks
// wait. Once a transfer has waited `delay`, the rank publishes its pending calls with that peer
// (through the Exchange, the store in practice) and reads the peer's; when the peer's call of the
// same number and the other direction disagrees, the verdict is find_p2p_mismatch's message, the
// same on both ranks. A partner not posted yet is no verdict (the transfer may still meet it).
//
//   rank 0: send #4 (fp32, 100) ---- pending 250 ms ----> publish {send #4 ...}, read rank 1's
//   rank 1: recv #4 (fp32, 99)  ---- pending 250 ms ----> publish {recv #4 ...}, read rank 0's
//   either: "p2p mismatch: rank 0 called send(fp32, 100, to rank 1) #4 but rank 1 called ..."
//
// look() and next_look() are for one thread at a time (the backend's).
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/schedule_check.h"
#include "comm/store/store.h"

namespace zero::comm {

class P2PStallCheck {
 public:
  using Clock = std::chrono::steady_clock;
  using Bytes = std::vector<uint8_t>;

  // How a rank publishes its calls and reads its peers'. Neither may throw or block for long.
  struct Exchange {
    // This rank's pending calls with `peer` (encoded CallRecords), replacing what it published.
    std::function<void(int peer, const Bytes& records)> publish;
    // What `peer` last published for this rank ({} when nothing).
    std::function<Bytes(int peer)> peer_calls;
  };

  // One pending transfer of this rank: its call (make_p2p_call: kind, number, peer in root) and
  // when it was posted.
  struct Pending {
    CallInfo call;
    Clock::time_point posted;
  };

  struct Verdict {
    size_t index;          // into the pending transfers looked at
    std::string mismatch;  // "p2p mismatch: rank 0 called ... but rank 1 called ..."
  };

  // `delay`: how long a transfer waits before its calls are published.
  P2PStallCheck(int rank, int size, std::chrono::milliseconds delay, Exchange exchange);

  // Publishes, for each peer with a transfer pending `delay` or longer, every pending call with
  // it (when that changed since the last publication), and compares the stalled ones with the
  // peer's. The first disagreement found, if any.
  std::optional<Verdict> look(const std::vector<Pending>& pending, Clock::time_point now);

  // How long until the next look is worth it: soon while stalls are young, less often as the
  // oldest lasts (kFirstLook..kLastLook), so that a long pipeline bubble does not load the store.
  std::chrono::milliseconds next_look() const;

  // The verdict on one transfer (`call`, this rank's) from what its peer published: the mismatch
  // message, or "" when the peer's partner call agrees or is not there. For a rank whose
  // connection broke because the peer found the mismatch first.
  // Touches nothing look() changes: it may run beside look() on another thread.
  std::string compare_with_peer(const CallInfo& call) const;

  static constexpr std::chrono::milliseconds kFirstLook{100};
  static constexpr std::chrono::milliseconds kLastLook{2000};

 private:
  std::string compare(const CallInfo& call, const Bytes& theirs) const;

  const int rank_;
  const std::chrono::milliseconds delay_;
  const Exchange exchange_;
  std::vector<Bytes> published_;  // per peer, what this rank last published
  std::chrono::milliseconds oldest_{0};
};

// The Exchange through a store, under `prefix` (unique to the communicator): rank r's calls for
// peer p at "<prefix>/p2p_pending/<r>/<p>". A failing store publishes nothing and reads {}: the
// stall then ends at the timeout, naming the peer without the two calls.
P2PStallCheck::Exchange store_exchange(std::shared_ptr<Store> store, std::string prefix, int rank);

}  // namespace zero::comm
