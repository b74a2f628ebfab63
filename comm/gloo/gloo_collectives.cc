#include "comm/gloo/gloo_collectives.h"

#include <net/if.h>
#include <signal.h>

#include <algorithm>
#include <cstring>
#include <exception>

#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>

#include "base/fault_injection.h"
#include "base/check.h"
#include "comm/gloo/gloo_store_adapter.h"
#include "comm/gloo/reduce_kernels.h"
#include "comm/store/prefix_store.h"

namespace zero::comm {
namespace {

// Slot prefixes of our collectives; Gloo's own use 0x01..0x08 in the top byte.
constexpr uint8_t kReduceScatterSlot = 0xA1;
constexpr uint8_t kAllGatherSlot = 0xA2;
constexpr uint8_t kRecordSlot = 0xA3;
// All-gather and reduce-scatter data sent before the schedule check's verdict
// (DirectOptions::after_sends); their slots encode each message's byte size.
constexpr uint8_t kEagerGatherSlot = 0xA4;
constexpr uint8_t kEagerReduceSlot = 0xA5;
constexpr uint8_t kBroadcastSlot = 0xA6;
constexpr uint8_t kAllToAllSlot = 0xA7;
constexpr uint8_t kVerdictSlot = 0xA8;
// Eager reduce-scatter slots: 0xA5 | seq mod 256 | segment bytes | segment index.
constexpr uint64_t kEagerLengthBits = 24;
constexpr uint64_t kEagerIndexBits = 24;
constexpr uint64_t kSizeBits = 40;
constexpr uint64_t kSegmentBits = 24;
// All-gather messages per peer (upper bound, for chunks larger than segment_bytes times this).
constexpr size_t kGatherMessages = 4;

uint64_t make_slot(uint8_t prefix, uint32_t tag, size_t segment) {
  ZERO_CHECK_LT(segment, size_t{1} << kSegmentBits, "too many segments in one collective");
  return (uint64_t{prefix} << 56) | (uint64_t{tag} << kSegmentBits) | segment;
}

std::chrono::milliseconds remaining(SteadyClock::time_point deadline) {
  const auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - SteadyClock::now());
  return std::max(left, std::chrono::milliseconds(1));
}

size_t segments(size_t count, size_t seg) { return (count + seg - 1) / seg; }

void wait_recv(gloo::transport::UnboundBuffer& buf, SteadyClock::time_point deadline) {
  if (!buf.waitRecv(remaining(deadline))) throw gloo::IoException("receive aborted");
}

void wait_send(gloo::transport::UnboundBuffer& buf, SteadyClock::time_point deadline) {
  if (!buf.waitSend(remaining(deadline))) throw gloo::IoException("send aborted");
}

// Every data message leaves through here, so that the tap counts what goes on the wire.
void post_send(gloo::transport::UnboundBuffer& buf, int peer, uint64_t slot, size_t offset, size_t bytes,
               const DirectOptions& options) {
  buf.send(peer, slot, offset, bytes);
  if (options.tap) options.tap->sent(peer, bytes);
}

// Owns one collective's unbound buffers. When the collective fails, Gloo's loop thread may still be
// delivering the error to the other buffers of the failed connection (it holds only non-owning
// pointers to them), so destroying them at that moment races with it (ThreadSanitizer showed it
// when a peer died during an all-reduce). A failed collective therefore hands its buffers to the
// graveyard, which the communicator empties only after closing its connections (which waits for
// the loop thread to finish with each connection).
class BufferSet {
 public:
  explicit BufferSet(const DirectOptions& options)
      : graveyard_(options.graveyard), abort_(options.abort),
        uncaught_(std::uncaught_exceptions()) {}
  ~BufferSet() {
    if (abort_ != nullptr) {
      for (auto& b : buffers_) abort_->discharge(b.get());
    }
    if (graveyard_ == nullptr || std::uncaught_exceptions() <= uncaught_) return;
    for (auto& b : buffers_) {
      if (!b) continue;
      try {
        graveyard_->push_back(std::move(b));
      } catch (...) {
        (void)b.release();  // out of memory while unwinding: leak rather than race
      }
    }
  }
  BufferSet(const BufferSet&) = delete;
  BufferSet& operator=(const BufferSet&) = delete;

  gloo::transport::UnboundBuffer* add(std::unique_ptr<gloo::transport::UnboundBuffer> b) {
    buffers_.push_back(std::move(b));
    if (abort_ != nullptr) abort_->enlist(buffers_.back().get());
    return buffers_.back().get();
  }

 private:
  Graveyard* graveyard_;
  AbortSwitch* abort_;
  int uncaught_;
  std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> buffers_;
};

}  // namespace

ChunkLayout ChunkLayout::equal(int size, size_t count) {
  ChunkLayout l;
  for (int r = 0; r < size; ++r) {
    l.offset.push_back(static_cast<size_t>(r) * count);
    l.count.push_back(count);
  }
  return l;
}

ChunkLayout ChunkLayout::balanced(size_t total, int size) {
  ChunkLayout l;
  const size_t base = total / static_cast<size_t>(size);
  const size_t extra = total % static_cast<size_t>(size);
  size_t offset = 0;
  for (int r = 0; r < size; ++r) {
    const size_t c = base + (static_cast<size_t>(r) < extra ? 1 : 0);
    l.offset.push_back(offset);
    l.count.push_back(c);
    offset += c;
  }
  return l;
}

void AbortSwitch::trip() {
  std::lock_guard<std::mutex> lock(mu_);
  tripped_ = true;
  for (auto* b : live_) {
    b->abortWaitRecv();
    b->abortWaitSend();
  }
}

bool AbortSwitch::tripped() const {
  std::lock_guard<std::mutex> lock(mu_);
  return tripped_;
}

void AbortSwitch::enlist(gloo::transport::UnboundBuffer* buffer) {
  std::lock_guard<std::mutex> lock(mu_);
  if (tripped_) throw gloo::IoException("collective aborted");
  live_.push_back(buffer);
}

void AbortSwitch::discharge(gloo::transport::UnboundBuffer* buffer) {
  std::lock_guard<std::mutex> lock(mu_);
  // A collective has a few live buffers, and discharges them in the order it enlisted them.
  const auto it = std::find(live_.begin(), live_.end(), buffer);
  if (it != live_.end()) live_.erase(it);
}

void abort_connections(gloo::Context& ctx) {
  // A hard close (SO_LINGER 0): the peer's pending operations fail with a reset at once. Our own
  // waits on these connections are woken by AbortSwitch::trip, not by this.
  for (int p = 0; p < ctx.size; ++p) {
    if (p != ctx.rank) ctx.getPair(p)->close();
  }
}

ReduceScatterSegments reduce_scatter_segments(size_t my_count, size_t element_bytes, const DirectOptions& options) {
  ReduceScatterSegments rs;
  rs.seg = std::max<size_t>(1, options.segment_bytes / element_bytes);
  rs.nseg = segments(my_count, rs.seg);
  rs.live = std::min(static_cast<size_t>(std::max(1, options.depth)), std::max<size_t>(rs.nseg, 1));
  return rs;
}

uint8_t* Scratch::get(size_t bytes) {
  if (buffer_.size_bytes() < bytes) {
    buffer_ = memory::Buffer();  // release first: the peak is the new size, not both
    buffer_ = memory::allocate_host(bytes, memory::Category::kCommBuffer);
  }
  return static_cast<uint8_t*>(buffer_.data());
}

namespace {

// The reduce-scatter; with `gather_back` (all-reduce: recv is this rank's chunk of send) every
// reduced segment is sent on to all peers at once, and their reduced segments are received straight
// into place, so the all-gather runs inside the reduce-scatter's pipeline instead of after it.
// Receiving into the chunks this rank is still sending from is safe: a peer can only send back
// segment j after it received all of this rank's segment j, i.e. after those bytes left the buffer.
void reduce_scatter_impl(gloo::Context& ctx, const void* send, void* recv,
                         const ChunkLayout& layout, DType dtype, ReduceOp op,
                         const DirectOptions& options, Scratch& scratch, bool gather_back) {
  const int n = ctx.size;
  const int me = ctx.rank;
  const size_t es = dtype_size(dtype);
  const auto* send_bytes = static_cast<const uint8_t*>(send);
  auto* recv_bytes = static_cast<uint8_t*>(recv);
  const size_t my_count = layout.count[me];
  const size_t my_offset = layout.offset[me];
  const ReduceScatterSegments rs = reduce_scatter_segments(my_count, es, options);
  const size_t seg = rs.seg;

  // With options.after_sends the data moves before the schedule check's verdict, on slots that
  // encode each message's exact byte size (all_gather_eager explains why that is safe), and the
  // check runs once the sends are posted; nothing is reduced, and no all-gather segment sent on,
  // before it passed. When the sizes do not fit such a slot, the check runs before the sends.
  size_t most = 0;
  for (size_t c : layout.count) most = std::max(most, c);
  const bool eager = options.after_sends && seg * es < (size_t{1} << kEagerLengthBits) &&
                     segments(most, seg) < (size_t{1} << kEagerIndexBits);
  const std::function<void()>& check_first =
      eager ? nullptr : (options.after_sends ? options.after_sends : options.before_sends);
  auto data_slot = [&](size_t j, size_t len) {
    if (!eager) return make_slot(kReduceScatterSlot, options.tag, j);
    return (uint64_t{kEagerReduceSlot} << 56) | (uint64_t{options.tag & 0xFFu} << 48) |
           (uint64_t{len * es} << kEagerIndexBits) | j;
  };

  if (n == 1) {
    if (options.after_sends) options.after_sends();
    else if (options.before_sends) options.before_sends();
    const void* src = send_bytes + my_offset * es;
    reduce_arrays(dtype, op, &src, 1, recv, my_count);
    return;
  }

  if (eager && options.check_start) options.check_start();
  BufferSet owned(options);
  // All-gather receives (all-reduce only): every segment of every peer's chunk, straight into place.
  // Peers send these only after the check passed, so they keep the plain slots.
  gloo::transport::UnboundBuffer* gather_buf = nullptr;
  size_t gather_recvs = 0;
  size_t gather_sends = 0;
  if (gather_back) {
    gather_buf =
        owned.add(ctx.createUnboundBuffer(const_cast<uint8_t*>(send_bytes), layout.total() * es));
    for (int k = 1; k < n; ++k) {
      const int from = (me - k + n) % n;
      for (size_t j = 0; j < segments(layout.count[from], seg); ++j) {
        const size_t len = std::min(seg, layout.count[from] - j * seg);
        gather_buf->recv(from, make_slot(kAllGatherSlot, options.tag, j),
                         (layout.offset[from] + j * seg) * es, len * es);
        ++gather_recvs;
      }
    }
  }

  // Receives: `depth` segments per peer in flight, each into its own scratch buffer.
  const size_t nseg = rs.nseg;
  const size_t live = rs.live;
  uint8_t* area = scratch.get(rs.scratch_bytes(n, es));
  std::vector<gloo::transport::UnboundBuffer*> bufs(static_cast<size_t>(n) * live, nullptr);
  auto slot_buf = [&](int peer, size_t d) -> gloo::transport::UnboundBuffer*& {
    return bufs[static_cast<size_t>(peer) * live + d];
  };
  auto post = [&](size_t j) {
    const size_t len = std::min(seg, my_count - j * seg);
    for (int p = 0; p < n; ++p) {
      if (p == me) continue;
      auto& b = slot_buf(p, j % live);
      if (!b) {
        b = owned.add(ctx.createUnboundBuffer(
            area + (static_cast<size_t>(p) * live + j % live) * seg * es, seg * es));
      }
      b->recv(p, data_slot(j, len), 0, len * es);
    }
  };
  for (size_t j = 0; j < std::min(live, nseg); ++j) post(j);
  if (check_first) check_first();
  fault::point("collective_sends");

  // Sends: every segment of chunk p to rank p, all posted up front, after our own receives so that
  // the peers' sends find them posted and write at once (Gloo moves each send as soon as the
  // receiver posts the matching receive). Destinations are staggered so that rank r starts with
  // rank r+1 and no rank is everybody's first target.
  auto* send_buf =
      owned.add(ctx.createUnboundBuffer(const_cast<uint8_t*>(send_bytes), layout.total() * es));
  size_t sends = 0;
  for (int k = 1; k < n; ++k) {
    const int p = (me + k) % n;
    for (size_t j = 0; j < segments(layout.count[p], seg); ++j) {
      const size_t len = std::min(seg, layout.count[p] - j * seg);
      post_send(*send_buf, p, data_slot(j, len), (layout.offset[p] + j * seg) * es, len * es, options);
      ++sends;
    }
  }
  if (eager) options.after_sends();

  std::vector<const void*> srcs(static_cast<size_t>(n));
  for (size_t j = 0; j < nseg; ++j) {
    const size_t len = std::min(seg, my_count - j * seg);
    for (int p = 0; p < n; ++p) {
      if (p == me) {
        srcs[p] = send_bytes + (my_offset + j * seg) * es;
      } else {
        if (options.awaiting) options.awaiting->store(p, std::memory_order_relaxed);
        wait_recv(*slot_buf(p, j % live), options.deadline);
        if (options.awaiting) options.awaiting->store(-1, std::memory_order_relaxed);
        srcs[p] = slot_buf(p, j % live)->ptr;
      }
    }
    reduce_arrays(dtype, op, srcs.data(), srcs.size(), recv_bytes + j * seg * es, len);
    if (gather_back) {
      for (int k = 1; k < n; ++k) {
        post_send(*gather_buf, (me + k) % n, make_slot(kAllGatherSlot, options.tag, j), (my_offset + j * seg) * es,
                  len * es, options);
        ++gather_sends;
      }
    }
    if (j + live < nseg) post(j + live);
  }
  for (size_t s = 0; s < sends; ++s) wait_send(*send_buf, options.deadline);
  for (size_t i = 0; i < gather_recvs; ++i) wait_recv(*gather_buf, options.deadline);
  for (size_t i = 0; i < gather_sends; ++i) wait_send(*gather_buf, options.deadline);
}

}  // namespace

void reduce_scatter_direct(gloo::Context& ctx, const void* send, void* recv,
                           const ChunkLayout& layout, DType dtype, ReduceOp op,
                           const DirectOptions& options, Scratch& scratch) {
  reduce_scatter_impl(ctx, send, recv, layout, dtype, op, options, scratch, false);
}

void all_reduce_direct(gloo::Context& ctx, void* buf, size_t count, DType dtype, ReduceOp op,
                       const DirectOptions& options, Scratch& scratch) {
  const ChunkLayout layout = ChunkLayout::balanced(count, ctx.size);
  auto* own = static_cast<uint8_t*>(buf) + layout.offset[ctx.rank] * dtype_size(dtype);
  reduce_scatter_impl(ctx, buf, own, layout, dtype, op, options, scratch, true);
}

namespace {

// One round of point-to-point messages: from every peer p, from(p).bytes into `in` at
// from(p).offset; to every peer p, to(p).bytes of `out` from to(p).offset. Each message travels in
// segments of `seg` bytes (both sides of a message must use the same seg), segment j on slot(j).
// Receives are posted first (a send that finds its receive posted is written at once), then
// options.before_sends runs, then the sends, staggered so that rank r starts with rank r+1. With
// options.after_sends (data before the verdict, see DirectOptions) check_start runs first thing
// and after_sends once the sends are posted. When nothing moves, only the hooks run.
void exchange_regions(gloo::Context& ctx, void* in, size_t in_bytes, const void* out,
                      size_t out_bytes, const std::function<Region(int)>& from,
                      const std::function<Region(int)>& to, size_t seg,
                      const std::function<uint64_t(size_t)>& slot, const DirectOptions& options) {
  const int n = ctx.size;
  const int me = ctx.rank;
  std::vector<Region> source(static_cast<size_t>(n)), dest(static_cast<size_t>(n));
  size_t most = 0;
  bool moves = false;
  for (int k = 1; k < n; ++k) {
    source[k] = from((me - k + n) % n);
    dest[k] = to((me + k) % n);
    most = std::max(most, segments(dest[k].bytes, seg));
    moves = moves || source[k].bytes > 0 || dest[k].bytes > 0;
  }
  if (options.after_sends && options.check_start) options.check_start();
  if (!moves) {
    if (options.before_sends) options.before_sends();
    if (options.after_sends) options.after_sends();
    return;
  }
  BufferSet owned(options);
  auto* rb = owned.add(ctx.createUnboundBuffer(in, in_bytes));
  auto* sb = out == in ? rb
                       : owned.add(ctx.createUnboundBuffer(const_cast<void*>(out), out_bytes));
  size_t recvs = 0;
  size_t sends = 0;
  for (int k = 1; k < n; ++k) {
    const Region& r = source[k];
    for (size_t j = 0; j < segments(r.bytes, seg); ++j) {
      rb->recv((me - k + n) % n, slot(j), r.offset + j * seg, std::min(seg, r.bytes - j * seg));
      ++recvs;
    }
  }
  if (options.before_sends) options.before_sends();
  // Segment-major, so that every peer's first segment leaves before anybody's second.
  for (size_t j = 0; j < most; ++j) {
    for (int k = 1; k < n; ++k) {
      if (j >= segments(dest[k].bytes, seg)) continue;
      post_send(*sb, (me + k) % n, slot(j), dest[k].offset + j * seg, std::min(seg, dest[k].bytes - j * seg),
                options);
      ++sends;
    }
  }
  // With the check after the sends, the verdict decides whether we wait for the data.
  if (options.after_sends) options.after_sends();
  for (size_t i = 0; i < recvs; ++i) wait_recv(*rb, options.deadline);
  for (size_t i = 0; i < sends; ++i) wait_send(*sb, options.deadline);
}

// Bytes per message for a transfer whose largest message is `largest` bytes: at least
// segment_bytes, and at most kGatherMessages messages per peer, so that the receiver copies one
// out of the socket while the sender copies the next one in, without paying per-message costs
// 100 times.
size_t message_bytes(size_t largest, size_t segment_bytes) {
  return std::max<size_t>(
      {size_t{1}, segment_bytes, (largest + kGatherMessages - 1) / kGatherMessages});
}

void all_gather_slots(gloo::Context& ctx, void* buf, const ChunkLayout& layout, size_t elem_size,
                      uint8_t slot_prefix, size_t segment_bytes, const DirectOptions& options) {
  size_t largest = 0;
  for (size_t c : layout.count) largest = std::max(largest, c * elem_size);
  auto chunk = [&](int p) { return Region{layout.offset[p] * elem_size, layout.count[p] * elem_size}; };
  exchange_regions(ctx, buf, layout.total() * elem_size, buf, layout.total() * elem_size, chunk,
                   [&](int) { return chunk(ctx.rank); }, message_bytes(largest, segment_bytes),
                   [&](size_t j) { return make_slot(slot_prefix, options.tag, j); }, options);
}

// The all-gather with the schedule check running after the sends were posted (after_sends). Every
// chunk has the same byte size; its messages are cut from the byte size alone (never from the
// dtype), and their slots are 0xA4 | seq mod 256 | chunk bytes (40 bits) | segment (8 bits), so a
// message can only land in a receive posted by this same code for the same chunk size, i.e. of
// exactly its own size: a peer that called anything else never posts a receive it matches, and
// Gloo writes a send only once the matching receive is posted. Consecutive collectives differ in
// seq mod 256 and a collective consumes all its receives before the next starts (after a failure
// the communicator runs nothing more), so the truncated sequence number cannot mix calls up.
void all_gather_eager(gloo::Context& ctx, void* buf, size_t chunk_bytes,
                      const DirectOptions& options) {
  const size_t total = static_cast<size_t>(ctx.size) * chunk_bytes;
  auto chunk = [&](int p) { return Region{static_cast<size_t>(p) * chunk_bytes, chunk_bytes}; };
  exchange_regions(ctx, buf, total, buf, total, chunk, [&](int) { return chunk(ctx.rank); },
                   message_bytes(chunk_bytes, options.gather_segment_bytes),
                   [&](size_t j) {
                     return (uint64_t{kEagerGatherSlot} << 56) |
                            (uint64_t{options.tag & 0xFFu} << 48) |
                            (uint64_t{chunk_bytes} << 8) | j;
                   },
                   options);
}

}  // namespace

void all_gather_direct(gloo::Context& ctx, void* buf, const ChunkLayout& layout, size_t elem_size,
                       const DirectOptions& options) {
  if (options.after_sends) {
    const size_t chunk_bytes = layout.count.empty() ? 0 : layout.count[0] * elem_size;
    const bool equal = std::all_of(layout.count.begin(), layout.count.end(),
                                   [&](size_t c) { return c == layout.count[0]; });
    // At most kGatherMessages segments, so the 8-bit segment field always suffices.
    if (ctx.size > 1 && chunk_bytes > 0 && equal && chunk_bytes < (uint64_t{1} << kSizeBits)) {
      all_gather_eager(ctx, buf, chunk_bytes, options);
      return;
    }
    // Not representable in the eager slots: check first, then move the data.
    DirectOptions o = options;
    o.before_sends = options.after_sends;
    o.after_sends = nullptr;
    all_gather_slots(ctx, buf, layout, elem_size, kAllGatherSlot, o.gather_segment_bytes, o);
    return;
  }
  all_gather_slots(ctx, buf, layout, elem_size, kAllGatherSlot, options.gather_segment_bytes,
                   options);
}

void exchange_records(gloo::Context& ctx, const void* mine, void* all, size_t bytes,
                      const DirectOptions& options) {
  std::memcpy(static_cast<uint8_t*>(all) + static_cast<size_t>(ctx.rank) * bytes, mine, bytes);
  all_gather_slots(ctx, all, ChunkLayout::equal(ctx.size, bytes), 1, kRecordSlot, bytes, options);
}

void confirm_verdict(gloo::Context& ctx, const DirectOptions& options) {
  std::vector<uint8_t> all(static_cast<size_t>(ctx.size), 1);
  all_gather_slots(ctx, all.data(), ChunkLayout::equal(ctx.size, 1), 1, kVerdictSlot, 1, options);
}

void broadcast_direct(gloo::Context& ctx, void* buf, size_t bytes, int root,
                      const DirectOptions& options) {
  const bool is_root = ctx.rank == root;
  exchange_regions(
      ctx, buf, bytes, buf, bytes, [&](int p) { return p == root ? Region{0, bytes} : Region{}; },
      [&](int) { return is_root ? Region{0, bytes} : Region{}; },
      message_bytes(bytes, options.gather_segment_bytes),
      [&](size_t j) { return make_slot(kBroadcastSlot, options.tag, j); }, options);
}

void all_to_all_direct(gloo::Context& ctx, const void* send, void* recv, size_t chunk_bytes,
                       const DirectOptions& options) {
  const size_t total = static_cast<size_t>(ctx.size) * chunk_bytes;
  auto chunk = [&](int p) { return Region{static_cast<size_t>(p) * chunk_bytes, chunk_bytes}; };
  exchange_regions(ctx, recv, total, send, total, chunk, chunk,
                   message_bytes(chunk_bytes, options.gather_segment_bytes),
                   [&](size_t j) { return make_slot(kAllToAllSlot, options.tag, j); }, options);
  if (chunk_bytes > 0) {
    std::memcpy(static_cast<uint8_t*>(recv) + ctx.rank * chunk_bytes,
                static_cast<const uint8_t*>(send) + ctx.rank * chunk_bytes, chunk_bytes);
  }
}

struct MessageRound::State {
  explicit State(const DirectOptions& options) : owned(options), deadline(options.deadline) {}
  BufferSet owned;
  SteadyClock::time_point deadline;
  gloo::transport::UnboundBuffer* in = nullptr;
  int recvs = 0;
  std::vector<gloo::transport::UnboundBuffer*> sends;
};

MessageRound::MessageRound(gloo::Context& ctx, const void* header, size_t header_bytes,
                           const std::function<Payload(int peer)>& payload, uint8_t* area,
                           size_t capacity, Scratch& send_scratch, const DirectOptions& options) {
  const int n = ctx.size;
  const int me = ctx.rank;
  std::memcpy(area + static_cast<size_t>(me) * capacity, header, header_bytes);
  if (n == 1) return;
  state_ = std::make_unique<State>(options);
  const uint64_t slot = make_slot(kRecordSlot, options.tag, 0);
  auto* in = state_->owned.add(ctx.createUnboundBuffer(area, static_cast<size_t>(n) * capacity));
  state_->in = in;
  for (int k = 1; k < n; ++k) {
    const int from = (me - k + n) % n;
    in->recv(from, slot, static_cast<size_t>(from) * capacity, capacity);
    ++state_->recvs;
  }
  // One message per distinct payload; peers with the same payload share it.
  uint8_t* out = send_scratch.get(static_cast<size_t>(n) * capacity);
  const void* last_data = nullptr;
  size_t last_bytes = 0;
  size_t last_len = 0;
  uint8_t* last_msg = nullptr;
  for (int k = 1; k < n; ++k) {
    const int to = (me + k) % n;
    const Payload p = payload ? payload(to) : Payload{};
    ZERO_CHECK_LE(header_bytes + p.bytes, capacity, "message larger than the receive capacity");
    if (last_msg == nullptr || p.data != last_data || p.bytes != last_bytes) {
      last_msg = out + static_cast<size_t>(to) * capacity;
      std::memcpy(last_msg, header, header_bytes);
      if (p.bytes > 0) std::memcpy(last_msg + header_bytes, p.data, p.bytes);
      last_data = p.data;
      last_bytes = p.bytes;
      last_len = header_bytes + p.bytes;
    }
    state_->sends.push_back(state_->owned.add(ctx.createUnboundBuffer(last_msg, last_len)));
    post_send(*state_->sends.back(), to, slot, 0, last_len, options);
  }
}

MessageRound::~MessageRound() = default;

void MessageRound::finish() {
  if (!state_) return;
  for (int k = 0; k < state_->recvs; ++k) wait_recv(*state_->in, state_->deadline);
  for (auto* b : state_->sends) wait_send(*b, state_->deadline);
  state_->recvs = 0;
  state_->sends.clear();
}

void exchange_messages(gloo::Context& ctx, const void* header, size_t header_bytes,
                       const std::function<Payload(int peer)>& payload, uint8_t* area,
                       size_t capacity, Scratch& send_scratch, const DirectOptions& options) {
  MessageRound(ctx, header, header_bytes, payload, area, capacity, send_scratch, options).finish();
}

std::shared_ptr<gloo::Context> connect_gloo_context(std::shared_ptr<Store> store,
                                                    const std::string& prefix, int rank, int size,
                                                    const std::string& interface_or_host,
                                                    std::chrono::milliseconds timeout) {
  // Gloo writes to its sockets without MSG_NOSIGNAL: a peer that died would kill this process with
  // SIGPIPE instead of failing the collective with EPIPE. Ignore SIGPIPE unless the program installed
  // its own handler (then it is the program's choice).
  struct sigaction current {};
  if (sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
    signal(SIGPIPE, SIG_IGN);
  }
  gloo::transport::tcp::attr attr;
  if (if_nametoindex(interface_or_host.c_str()) != 0) {
    attr.iface = interface_or_host;
  } else {
    attr.hostname = interface_or_host;
  }
  auto device = gloo::transport::tcp::CreateDevice(attr);
  auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
  context->setTimeout(timeout);
  GlooStoreAdapter adapter(std::make_shared<PrefixStore>(prefix, std::move(store)), timeout);
  context->connectFullMesh(adapter, device);
  return context;
}

}  // namespace zero::comm
