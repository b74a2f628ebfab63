#pragma once
// Gloo backend: collectives over host memory on Gloo's TCP transport.
//
// Each communicator owns a full-mesh Gloo context (rendezvous through our Store under a unique key
// prefix) and one worker thread. Calls validate their arguments on the caller's thread (throwing
// InvalidArgument naming the op and the argument), get the next sequence number, and queue the
// collective; the worker runs them one at a time in issue order while the caller computes. With the
// schedule check on (default; ZERO_COMM_CHECK=0 or check_schedule=false turns it off) every rank
// sends a 64-byte description of the call to every other rank before any data (comm/schedule_check.h);
// calls of at most eager_bytes per message send it as the header of a single round of data
// messages, larger ones overlap it with posting their receives (docs/comm.md).
//
// Failures: a Gloo error (a peer died, a connection broke, Gloo's own timeout) or a schedule mismatch
// completes the Work with CommError/TimeoutError naming the op, its sequence number and the rank, and
// marks the communicator failed: queued and later calls fail fast with CommError. Work::wait(timeout)
// past its deadline throws TimeoutError (the collective keeps running; waiting again is allowed).
// Every Gloo wait is bounded by `timeout`, so the destructor (which drains the queue) is bounded too.
#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

#include "comm/communicator.h"
#include "comm/schedule_check.h"
#include "comm/store/store.h"

namespace zero::comm {

struct GlooOptions {
  // Address (or network interface name) the TCP device binds and advertises to peers.
  std::string interface_or_host = "127.0.0.1";
  // Rendezvous, every Gloo wait, and the default Work::wait().
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
  // Exchange a description of each call before it runs (also needs ZERO_COMM_CHECK unset or 1).
  bool check_schedule = true;
  // Store key prefix; communicators sharing a store and prefix get distinct instance numbers.
  std::string prefix = "gloo";
  // Reduce-scatter pipelining: message size and messages in flight per peer (scratch memory:
  // size * segment_depth * segment_bytes). docs/comm.md has the sweep behind the defaults.
  size_t segment_bytes = size_t{512} << 10;
  int segment_depth = 2;
  // All-gather message size.
  size_t gather_segment_bytes = size_t{512} << 10;
  // Calls whose per-message payload is at most this many bytes run as one round of messages that
  // carries the schedule check and the data together (0: never). Must match on every rank, as must
  // the two segment sizes (checked at creation).
  size_t eager_bytes = size_t{256} << 10;
  // After a collective fails (or a caller gives up on it), how long to wait for the other ranks to
  // report the same failure in the store, so that the error can name the ranks that never reached
  // the call (0: do not ask).
  std::chrono::milliseconds failure_report_grace{std::chrono::seconds(2)};

  // Throws InvalidArgument naming the first bad field.
  void validate() const;
};

// Collective over `size` processes (each calls it with its own rank). Blocks until every rank has
// connected (or `timeout`). All ranks must agree on the schedule check setting (verified here).
std::unique_ptr<Communicator> make_gloo_communicator(std::shared_ptr<Store> store, int rank,
                                                     int size, const GlooOptions& options = {});

// What a Gloo communicator's scratch memory (accounted process-wide, category comm_buffer) grows to
// over a sequence of calls: the message areas every call uses and the reduce-scatter's receive
// segments, each buffer kept at its largest need. The planner's account of it (zero/plan/), from
// the sizing functions the communicator itself uses.
class GlooScratchPlan {
 public:
  GlooScratchPlan(const GlooOptions& options, int size, int rank);
  // One call; `count` as the Communicator method takes it (all_gather: send_count, ...).
  void add_call(CollectiveKind kind, size_t count, DType dtype);
  uint64_t bytes() const { return messages_ + message_sends_ + scratch_; }

 private:
  GlooOptions options_;
  int size_, rank_;
  uint64_t messages_ = 0, message_sends_ = 0, scratch_ = 0;
};

}  // namespace zero::comm
