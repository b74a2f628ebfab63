#pragma once
// Collectives of our own on a Gloo context, built from Gloo's point-to-point unbound buffers. Gloo's
// library has no reduce-scatter with NCCL's layout and accumulates 16-bit floats in 16 bits, so the
// Gloo communicator runs these instead (docs/comm.md has the measurements behind the choice):
//
// - reduce_scatter_direct: every rank sends chunk p of its input straight to rank p (same bytes on
//   the wire as a ring: (n-1)/n of the buffer per rank), in segments; rank p reduces the n sources in
//   rank order while later segments are still arriving (a few segments per peer in flight). Because
//   the raw 16-bit inputs travel and are summed in fp32 on the receiving rank, fp16/bf16 results are
//   rounded exactly once, and every element is reduced on exactly one rank, so an all-reduce built on
//   it gives identical bits on every rank.
// - all_gather_direct: every rank sends its chunk to every other rank, straight into place.
// - all_reduce_direct: the reduce-scatter, with each reduced segment sent on to every peer as soon
//   as it is ready (the all-gather pipelined into the reduce-scatter).
// - broadcast_direct, all_to_all_direct: straight from the sender into place.
//
// These run on the communicator's worker thread, one at a time per context; `tag` (the sequence
// number) keeps the slots of consecutive collectives apart. Each takes the schedule check as
// callbacks (DirectOptions) so that it runs where it costs least, and registers its buffers with
// an AbortSwitch so that another thread can cut it short.
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <gloo/context.h>
#include <gloo/transport/unbound_buffer.h>

#include "base/dtype.h"
#include "comm/communicator.h"
#include "comm/peer_traffic.h"
#include "comm/store/store.h"
#include "memory/buffer.h"

namespace zero::comm {

using SteadyClock = std::chrono::steady_clock;

// A byte range of a buffer.
struct Region {
  size_t offset = 0;
  size_t bytes = 0;
};

// Where each rank's chunk lives in a flat buffer (elements).
struct ChunkLayout {
  std::vector<size_t> offset;
  std::vector<size_t> count;

  size_t total() const { return offset.empty() ? 0 : offset.back() + count.back(); }
  // `size` chunks of `count` elements each (NCCL's reduce-scatter / all-gather layout).
  static ChunkLayout equal(int size, size_t count);
  // `total` elements split as evenly as possible; the first total % size chunks get one more.
  static ChunkLayout balanced(size_t total, int size);
};

// Scratch memory reused across calls (only ever touched by one thread). Counted as comm_buffer in
// the memory tracker, so that a rank's memory report includes the communicator's share.
class Scratch {
 public:
  uint8_t* get(size_t bytes);

 private:
  memory::Buffer buffer_;
};

// Unbound buffers of failed collectives, kept alive until the owner has closed the context's
// connections (see BufferSet in the .cc).
using Graveyard = std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>>;

// Lets another thread cut short the collective running on a context (the communicator's destructor
// does, so that a collective whose peers never come cannot hold it for the whole timeout). trip()
// wakes every wait on the buffers of the collective in flight, which then throws, and makes every
// later collective throw as soon as it creates a buffer.
class AbortSwitch {
 public:
  void trip();
  bool tripped() const;
  // Called by the collectives for each buffer they create (throws gloo::IoException once tripped)
  // and before each is destroyed or handed to the graveyard.
  void enlist(gloo::transport::UnboundBuffer* buffer);
  void discharge(gloo::transport::UnboundBuffer* buffer);

 private:
  mutable std::mutex mu_;
  bool tripped_ = false;
  std::vector<gloo::transport::UnboundBuffer*> live_;
};

// Closes every connection of the context at once (a reset, not an orderly shutdown), so the
// peers' pending operations with this rank fail now instead of at their timeout.
void abort_connections(gloo::Context& ctx);

struct DirectOptions {
  uint32_t tag = 0;
  // Where the reduce-scatter notes the peer whose data it is waiting for (-1 between waits), so
  // that a caller who gives up can say which rank went silent mid-collective.
  std::atomic<int>* awaiting = nullptr;
  SteadyClock::time_point deadline = SteadyClock::now() + std::chrono::minutes(5);
  // Reduce-scatter pipelining: bytes per message and messages in flight per peer.
  size_t segment_bytes = size_t{512} << 10;
  int depth = 2;
  // All-gather: bytes per message (all posted at once).
  size_t gather_segment_bytes = size_t{512} << 10;
  // Called once after this rank's receives are posted and before any send: the schedule check runs
  // here, so its round trip overlaps the receives' setup. Sending only after it returned keeps a
  // mismatched peer from ever sending data (every rank reaches the same verdict), so the posted
  // receives can never be matched by a message of another shape.
  std::function<void()> before_sends;
  // When set, called after every data send is posted and before any data is used, and used instead
  // of before_sends. The data then moves without waiting for the check's round trip; this is safe
  // because those data messages use slots that encode their exact byte size (see all_gather_eager
  // in the .cc), so they can only ever match receives of exactly their own size, posted by a peer
  // running the same collective code with the same sequence number (mod 256). A mismatch throws
  // from here, before this rank reduces or waits for data that a mismatched peer will never send.
  // Where a call's sizes do not fit those slots, the collective runs it as before_sends instead.
  std::function<void()> after_sends;
  // With after_sends, on the path where data moves before the verdict: called first thing, before
  // any receive or send is posted, to put the check's records on the wire ahead of the data (each
  // record would otherwise wait behind a whole segment on its connection, and its "ready" notice
  // behind the peer's). after_sends then only waits for them. May be empty.
  std::function<void()> check_start;
  // Where a failing collective leaves its unbound buffers (nullptr: destroy them at once).
  Graveyard* graveyard = nullptr;
  // Registers the collective's buffers so that another thread can cut it short (may be nullptr).
  AbortSwitch* abort = nullptr;
  // Counts every message's bytes by peer as it is posted (may be nullptr).
  const TrafficTap* tap = nullptr;
};

// How a reduce-scatter of this rank's `my_count` elements is pipelined: messages of `seg` elements,
// `nseg` of them, `live` in flight per peer, each received into a scratch segment of its own.
struct ReduceScatterSegments {
  size_t seg = 1, nseg = 0, live = 1;
  size_t scratch_bytes(int ranks, size_t element_bytes) const {
    return static_cast<size_t>(ranks) * live * seg * element_bytes;
  }
};
ReduceScatterSegments reduce_scatter_segments(size_t my_count, size_t element_bytes, const DirectOptions& options);


// recv (layout.count[rank] elements) = reduction over ranks of chunk `rank` of send. recv may be the
// rank's own chunk inside send (in place); send is never written.
void reduce_scatter_direct(gloo::Context& ctx, const void* send, void* recv,
                           const ChunkLayout& layout, DType dtype, ReduceOp op,
                           const DirectOptions& options, Scratch& scratch);

// In place: buf (count elements) becomes the reduction over ranks. Reduce-scatter over a balanced
// layout whose reduced segments are all-gathered while later segments are still being reduced.
void all_reduce_direct(gloo::Context& ctx, void* buf, size_t count, DType dtype, ReduceOp op,
                       const DirectOptions& options, Scratch& scratch);

// In place: chunk r of buf (bytes elem_size * layout.count[r]) is filled from rank r. With
// options.after_sends (equal chunks under 1 TiB) the data is sent at once on slots that encode the
// chunk's byte size and the check runs while it moves; otherwise before_sends runs first.
void all_gather_direct(gloo::Context& ctx, void* buf, const ChunkLayout& layout, size_t elem_size,
                       const DirectOptions& options);

// buf (bytes) on every rank becomes root's: root sends it to every peer straight into place (a few
// messages each, options.before_sends first).
void broadcast_direct(gloo::Context& ctx, void* buf, size_t bytes, int root,
                      const DirectOptions& options);

// Chunk p (chunk_bytes) of send goes to chunk `rank` of recv on rank p; send and recv do not overlap.
void all_to_all_direct(gloo::Context& ctx, const void* send, void* recv, size_t chunk_bytes,
                       const DirectOptions& options);

// Small all-gather in one round trip: all (ctx.size * bytes) receives every rank's `mine`. Used for
// the schedule check and the options handshake.
void exchange_records(gloo::Context& ctx, const void* mine, void* all, size_t bytes,
                      const DirectOptions& options);

// After a schedule mismatch, which every rank of the collective detects from the same records: one
// round of one-byte messages, so that a rank closes its connections only once every peer has its
// verdict (closing earlier could reset a connection that still carries this rank's record to a
// slower peer, which would then report a reset instead of the mismatch).
void confirm_verdict(gloo::Context& ctx, const DirectOptions& options);

// One round of "header + payload" messages, the schedule check's transport and the whole of a small
// collective (docs/comm.md, "Small messages"): every rank sends `header` (header_bytes) followed by
// payload(p) to every peer p, and receives each peer's message into slot p of `area` (size *
// capacity bytes; this rank's own header is copied into its slot). Receives are posted with the full
// `capacity`, which every rank must use, so a message is never larger than the receive it lands in
// even when ranks disagree about the call. payload(p) may return {nullptr, 0}.
struct Payload {
  const void* data = nullptr;
  size_t bytes = 0;
};
void exchange_messages(gloo::Context& ctx, const void* header, size_t header_bytes,
                       const std::function<Payload(int peer)>& payload, uint8_t* area,
                       size_t capacity, Scratch& send_scratch, const DirectOptions& options);

// exchange_messages in two halves: the constructor posts the receives and the sends, finish()
// waits for them. Lets the schedule check's records travel ahead of a collective's data
// (DirectOptions::check_start).
class MessageRound {
 public:
  MessageRound(gloo::Context& ctx, const void* header, size_t header_bytes,
               const std::function<Payload(int peer)>& payload, uint8_t* area, size_t capacity,
               Scratch& send_scratch, const DirectOptions& options);
  ~MessageRound();
  MessageRound(const MessageRound&) = delete;
  MessageRound& operator=(const MessageRound&) = delete;
  void finish();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// A full-mesh Gloo TCP context through our store: keys under `prefix`, device bound to
// `interface_or_host` (a network interface name if one exists by that name, else a host/address).
// Sets SIGPIPE to ignored if it still has its default action (see the .cc).
std::shared_ptr<gloo::Context> connect_gloo_context(std::shared_ptr<Store> store,
                                                    const std::string& prefix, int rank, int size,
                                                    const std::string& interface_or_host,
                                                    std::chrono::milliseconds timeout);

}  // namespace zero::comm
