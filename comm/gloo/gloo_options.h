#pragma once
// The Gloo communicator's options, and the sizing rules every part of it derives from them (which
// calls run as one round of messages, and how large a message can be).
#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

#include "comm/peer_traffic.h"

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
  // Where the bytes sent to each peer are counted (comm/peer_traffic.h), by world rank; shared with
  // the communicators split from this one. nullptr: not counted. Sized to the world.
  std::shared_ptr<PeerTraffic> traffic;

  // Throws InvalidArgument naming the first bad field.
  void validate() const;
};

// A call of at most eager_bytes per message runs as one round of messages (header + payload).
bool runs_as_messages(const GlooOptions& o, size_t payload_bytes);
// One message's room in the message areas: the schedule check's record and the largest payload.
size_t message_capacity(const GlooOptions& o);

}  // namespace zero::comm
