#pragma once
// Runs one planned call of the Gloo communicator on its context: the schedule check and the data,
// every exception turned into an outcome and a message, and what a failure leaves behind (the call
// cut short, the connections closed, the buffers of failed collectives kept until then).
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include <gloo/context.h>

#include "comm/gloo/gloo_collectives.h"
#include "comm/gloo/gloo_options.h"
#include "comm/gloo/ordered_executor.h"
#include "comm/schedule_check.h"

namespace zero::comm {

// How a call runs. Small calls (payload up to eager_bytes per message) are one round of
// header+payload messages (exchange_messages) that carries the schedule check and the data at
// once; `apply` then finishes the collective locally from the received payloads. Larger calls
// `run` one of our collectives (gloo_collectives.h), which runs the check itself: once its
// receives are posted (DirectOptions::before_sends), or with check_after_sends, while its data
// moves (DirectOptions::after_sends).
struct CallPlan {
  // Each received message is the sender's call record (kHeader bytes), then its payload.
  static constexpr size_t kHeader = kCallRecordBytes;

  std::function<Payload(int peer)> payload;
  // `area`: rank r's message at area + r * stride.
  std::function<void(const uint8_t* area, size_t stride)> apply;
  bool check_after_sends = false;
  // `scratch`: the reduce-scatter's receive segments.
  std::function<void(gloo::Context& ctx, const DirectOptions&, Scratch& scratch)> run;
  bool small() const { return static_cast<bool>(apply); }
};

class GlooCallRunner {
 public:
  // `context`: connected, its ranks agreed on the settings (connect_and_handshake).
  // `tap`: where every message's bytes are counted (may be nullptr); must outlive the runner.
  GlooCallRunner(std::shared_ptr<gloo::Context> context, const GlooOptions& options, bool check,
                 const TrafficTap* tap = nullptr);

  // Runs one call (after the schedule check); turns every exception into an outcome and a message
  // naming the op, its sequence number and the rank (Gloo's own text included). After a failure
  // every connection is closed before it returns. One call at a time (the executor's running task).
  OpResult run(const CallInfo& call, const CallPlan& plan, const std::string& what);

  // Cuts short the call running now, from any thread: its waits are woken and the connections
  // closed, so it fails at once with `reason` (the first one given), and so do the peers' matching
  // collectives. Every later call fails too.
  void cut_short(const std::string& reason);

  // " this rank was waiting for rank P's data" while a reduce-scatter waits on a peer, else "".
  std::string awaited_peer() const;

  // Releases the buffers of failed collectives; once no call runs any more.
  void bury();

 private:
  OpResult run_checked(const CallInfo& call, const CallPlan& plan, const std::string& what);
  size_t capacity() const { return message_capacity(options_); }
  // Releases the buffers of failed collectives once Gloo's loop thread can no longer touch them:
  // closing a connection takes the lock the loop thread holds while it signals that connection's
  // buffers, and a closed connection signals nothing more.
  void close_and_bury();
  std::string abort_reason() const;

  const std::shared_ptr<gloo::Context> context_;
  const GlooOptions options_;
  const bool check_;
  const TrafficTap* tap_;

  // Unbound buffers of failed collectives (touched only by the thread running a collective, or
  // after the worker is joined; see BufferSet in gloo_collectives.cc).
  Graveyard graveyard_;
  AbortSwitch abort_;  // tripped by the destructor, or by a caller's deadline, while a collective runs
  mutable std::mutex abort_mu_;
  std::string abort_reason_;
  std::atomic<int> awaiting_{-1};  // the running reduce-scatter's awaited peer (DirectOptions::awaiting)
  // Touched only by the thread running a collective (one at a time):
  Scratch scratch_;        // reduce-scatter receive segments
  Scratch messages_;       // received header+payload messages
  Scratch message_sends_;  // outgoing header+payload messages
};

}  // namespace zero::comm
