#pragma once
// The Gloo communicator's point-to-point transfers (Communicator::send/recv) on Gloo's unbound
// buffers, beside the ordered executor rather than in it: a transfer involves two ranks only and
// must not queue behind the collectives (a pipeline stage sends while the data-parallel group
// reduces).
//
// Matching. Every transfer gets the next number of its (peer, direction); the k-th send from a to b
// meets the k-th recv on b from a because their slot carries that number, with the byte size and,
// with the communicator's schedule check on, a fingerprint of the call (dtype, count, label). A
// receive that disagrees is never matched: Gloo aborts the process when a message is larger than
// the receive it lands in, and a smaller one, or one of the same size read as another dtype, would
// complete silently wrong. Each transfer is one Gloo message, as Gloo's own pair transfers are.
//
// The check (with the communicator's schedule check on). Since a disagreeing pair never meets, it
// would only time out; a stall check says why, well before: once a transfer has been pending for a
// moment, this rank's pending calls with that peer go into the store, and it looks at the peer's;
// when the peer's call of the same number disagrees, both ranks fail with the same message naming
// both calls (find_p2p_mismatch). A send nobody receives, or a receive nobody sends to, times out
// naming the peer. Nothing is exchanged for transfers that meet in time. The fingerprint is 12
// bits: a dtype or label disagreement between transfers of the same byte size escapes it once in
// 4096 (sizes and numbers never do).
//
// Waiting. Gloo's waits are only safe on the thread that drives them (a timed-out Gloo wait fails
// the whole context), so a transfer is driven by whoever waits for it: Work::wait runs its Gloo
// waits on the caller's thread, bounded by the caller's deadline; is_completed, which must not
// block, hands the transfer to a helper thread of its own the first time it finds it pending.
//
// Failures. A transfer that fails (the peer died, a mismatch, a deadline) fails the communicator,
// as a collective does: every pending transfer is woken, the connections are closed before any
// failed Work reports (so Gloo touches no caller buffer once the caller sees the error), the
// failure hook fails the collectives, and later calls are rejected. A failed collective fails the
// transfers the same way (fail()).
#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <gloo/context.h>

#include "base/dtype.h"
#include "comm/communicator.h"
#include "comm/p2p_stall_check.h"
#include "comm/peer_traffic.h"

namespace zero::comm {

class GlooP2PCore;

// The largest transfer: its byte size is part of its data slot (36 bits).
constexpr size_t kMaxTransferBytes = (size_t{1} << 36) - 1;

class GlooP2P {
 public:
  // `context`: connected; shared with the collectives. `check`: exchange call records.
  // `tap`: where each sent transfer's bytes are counted (may be nullptr); must outlive this.
  GlooP2P(std::shared_ptr<gloo::Context> context, std::chrono::milliseconds timeout, bool check,
          const TrafficTap* tap = nullptr);
  // shutdown().
  ~GlooP2P();
  GlooP2P(const GlooP2P&) = delete;
  GlooP2P& operator=(const GlooP2P&) = delete;

  // What the communicator does around a failed transfer. Each may be empty; none is called after
  // shutdown() returns.
  struct Hooks {
    // A transfer failed (its message), after the connections closed and before its Work reports:
    // the communicator fails its collectives.
    std::function<void(const std::string& reason)> failed;
    // This rank's first failure, before the connections close, for its peers to read
    // (FailureReport::note_p2p_failure).
    std::function<void(const std::string& reason)> note;
    // Why `peer` closed its connection, if it left a note (FailureReport::p2p_note), else "".
    std::function<std::string(int peer)> peer_note;
    // Where the stall check publishes this rank's pending calls and reads its peers' (with the
    // check on; store_exchange in practice).
    P2PStallCheck::Exchange pending;
  };
  void set_hooks(Hooks hooks);

  // Posts the transfer (arguments already checked: check_p2p_args, at most kMaxTransferBytes). Throws CommError "<what>
  // rejected: communicator failed earlier: ..." once failed.
  WorkHandle send(const void* buf, size_t count, DType dtype, int peer, const std::string& label);
  WorkHandle recv(void* buf, size_t count, DType dtype, int peer, const std::string& label);

  // The communicator failed (the first reason wins): pending transfers fail with it, the
  // connections are closed, later transfers are rejected. Returns once the connections are closed.
  void fail(const std::string& reason);

  // Pending transfers fail ("the communicator was destroyed while it ran") and the connections are
  // closed at once when any was pending, so their peers fail now, not at their timeout; helper
  // threads are joined; the hook is not called after it returns. Idempotent.
  void shutdown();

 private:
  // Shared with the Work handles, which may outlive the communicator.
  std::shared_ptr<GlooP2PCore> core_;
};

}  // namespace zero::comm
