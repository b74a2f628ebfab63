#include "comm/gloo/gloo_p2p.h"

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <gloo/common/error.h>
#include <gloo/transport/unbound_buffer.h>

#include "base/check.h"
#include "base/logging.h"
#include "comm/gloo/gloo_collectives.h"
#include "comm/gloo/ordered_executor.h"
#include "comm/schedule_check.h"

namespace zero::comm {
namespace {

using gloo::transport::UnboundBuffer;

// Slot prefixes (top byte), apart from our collectives' 0xA1..0xA8 and Gloo's own 0x01..0x08.
constexpr uint8_t kDataSlot = 0xB1;
constexpr uint8_t kRecordSlot = 0xB2;  // the sender's record, ahead of its data
constexpr uint8_t kAckSlot = 0xB3;     // the receiver's record, back to the sender
// After a mismatch, one byte each way (sender's, receiver's) before the connections close.
constexpr uint8_t kVerdictSlot = 0xB4;
constexpr uint8_t kVerdictBackSlot = 0xB5;
// Data slots: prefix (8) | direction (1) | transfer number mod 2^15 | byte size (40 bits).
constexpr uint64_t kSizeBits = 40;
constexpr uint64_t kDataSeqBits = 15;
static_assert(kMaxTransferBytes == (size_t{1} << kSizeBits) - 1);

// Bit 55: which way the data flows on the pair (1: from the lower rank to the higher), so that the
// transfers a->b and b->a, each numbered from 0, never share a slot.
uint64_t direction_bit(int from, int to) { return uint64_t{from < to ? 1u : 0u} << 55; }

// The number is cut to 15 bits to make room for the size. Transfers of one direction whose
// numbers differ by a multiple of 2^15 and whose sizes agree share a slot, and still meet in
// order: they are posted in number order on both sides, and Gloo matches a slot's messages first
// in, first out (one TCP connection, one queue per slot).
uint64_t data_slot(int from, int to, uint64_t seq, size_t bytes) {
  return (uint64_t{kDataSlot} << 56) | direction_bit(from, to) |
         ((seq & ((uint64_t{1} << kDataSeqBits) - 1)) << kSizeBits) | bytes;
}

uint64_t record_slot(uint8_t prefix, int from, int to, uint64_t seq) {
  return (uint64_t{prefix} << 56) | direction_bit(from, to) | (seq & ((uint64_t{1} << 55) - 1));
}

std::chrono::milliseconds remaining(SteadyClock::time_point deadline) {
  const auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - SteadyClock::now());
  return std::max(left, std::chrono::milliseconds(1));
}

// Thrown by drive() when the records disagree (the message is built there).
struct Mismatch {};

}  // namespace

// One send or receive: its Gloo buffers and its completion, shared by its Work handles, the core
// (while it is pending) and a helper thread (is_completed).
struct GlooTransfer {
  bool sending = true;
  int rank = 0;
  int peer = 0;
  CallInfo call;
  std::string what;  // "gloo rank 0: send(fp32, 100, to rank 1) #3 [stage 0]"
  CallRecord mine{};
  // The peer's record. A send takes it, with its receive already posted, from the core's
  // acknowledgements posted ahead (GlooP2PCore::take_ack).
  std::unique_ptr<CallRecord> theirs = std::make_unique<CallRecord>();
  uint8_t verdict_out = 1, verdict_in = 0;  // confirm_verdict's bytes
  // Touched by the driving thread (GlooTransfer::take_turn), or by the core once it is retired.
  std::unique_ptr<UnboundBuffer> data, record_out, record_in;
  std::shared_ptr<GlooP2PCore> core;

  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  Outcome outcome = Outcome::kOk;
  std::string message;
  bool helper = false;  // a helper thread was started for it
  // A thread runs the transfer's Gloo waits (one at a time: a Gloo buffer takes one waiter). A flag
  // under `mu`, not a timed mutex: ThreadSanitizer does not see pthread_mutex_clocklock, which
  // std::timed_mutex uses, and reports its unlock as an unlock of an unlocked mutex.
  bool driving = false;

  enum class Turn { kDrive, kDone, kTimedOut };
  // Makes the caller the transfer's driver unless it finished, waiting (until `deadline`) for the
  // thread driving it now.
  Turn take_turn(SteadyClock::time_point deadline) {
    std::unique_lock<std::mutex> lock(mu);
    if (!cv.wait_until(lock, deadline, [&] { return done || !driving; })) return Turn::kTimedOut;
    if (done) return Turn::kDone;
    driving = true;
    return Turn::kDrive;
  }
  void end_turn() {
    {
      std::lock_guard<std::mutex> lock(mu);
      driving = false;
    }
    cv.notify_all();
  }

  bool finished() {
    std::lock_guard<std::mutex> lock(mu);
    return done;
  }
  // Lock held.
  void throw_if_failed() const {
    if (outcome == Outcome::kTimeout) throw TimeoutError(message);
    if (outcome == Outcome::kCommError) throw CommError(message);
  }
  void finish(Outcome o, std::string m) {
    {
      std::lock_guard<std::mutex> lock(mu);
      done = true;
      outcome = o;
      message = std::move(m);
    }
    cv.notify_all();
  }
};

class GlooP2PCore final : public std::enable_shared_from_this<GlooP2PCore> {
 public:
  GlooP2PCore(std::shared_ptr<gloo::Context> context, std::chrono::milliseconds timeout, bool check)
      : context_(std::move(context)), timeout_(timeout), check_(check),
        send_seq_(static_cast<size_t>(context_->size), 0),
        recv_seq_(static_cast<size_t>(context_->size), 0),
        ack_ahead_(static_cast<size_t>(context_->size)) {}

  ~GlooP2PCore() {
    for (auto& ahead : ack_ahead_) {
      if (ahead.buf) abort_.discharge(ahead.buf.get());
    }
  }
  GlooP2PCore(const GlooP2PCore&) = delete;
  GlooP2PCore& operator=(const GlooP2PCore&) = delete;

  std::chrono::milliseconds timeout() const { return timeout_; }

  void set_hooks(GlooP2P::Hooks hooks) {
    std::lock_guard<std::mutex> lock(hook_mu_);
    hooks_ = std::move(hooks);
  }

  std::shared_ptr<GlooTransfer> post(bool sending, void* buf, size_t count, DType dtype, int peer,
                                     const std::string& label) {
    auto t = std::make_shared<GlooTransfer>();
    t->sending = sending;
    t->rank = context_->rank;
    t->peer = peer;
    t->core = shared_from_this();
    const size_t bytes = count * dtype_size(dtype);
    std::string error;
    {
      std::lock_guard<std::mutex> post(post_mu_);
      uint64_t& next = (sending ? send_seq_ : recv_seq_)[static_cast<size_t>(peer)];
      t->call = make_p2p_call(next, sending ? CollectiveKind::kSend : CollectiveKind::kRecv, dtype,
                              count, peer);
      t->call.label = label;
      t->what = fmt::format("gloo rank {}: {}", t->rank, describe_call(t->call));
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (destroyed_) ZERO_THROW(CommError, "{} rejected: communicator destroyed", t->what);
        if (!failure_.empty()) {
          ZERO_THROW(CommError, "{} rejected: communicator failed earlier: {}", t->what, failure_);
        }
        live_.emplace(t.get(), t);
      }
      ++next;
      try {
        post_locked(*t, buf, bytes);
      } catch (const std::exception& e) {
        const std::string failure = failure_reason();
        error = abort_.tripped() && !failure.empty()
                    ? fmt::format("{} aborted: {}", t->what, failure)
                    : fmt::format("{} could not be posted: {}", t->what, e.what());
      }
    }
    if (!error.empty()) fail_transfer(*t, Outcome::kCommError, error);
    return t;
  }

  // Runs the transfer's Gloo waits until it completes or fails, by `deadline`. The caller has the
  // transfer's turn (GlooTransfer::take_turn).
  void drive(GlooTransfer& t, SteadyClock::time_point deadline) {
    std::string mismatch;
    const char* waiting_for = "";
    try {
      if (t.record_in) {
        waiting_for = t.sending ? "its matching recv" : "its matching send";
        if (!t.record_in->waitRecv(remaining(deadline))) throw gloo::IoException("record receive aborted");
        mismatch = t.sending ? find_p2p_mismatch(t.mine, t.rank, *t.theirs, t.peer)
                             : find_p2p_mismatch(*t.theirs, t.peer, t.mine, t.rank);
        if (!mismatch.empty()) throw Mismatch{};
      }
      waiting_for = t.sending ? "a matching recv of this size" : "a matching send of this size";
      if (t.sending) {
        if (t.record_out && !t.record_out->waitSend(remaining(deadline))) throw gloo::IoException("record send aborted");
        if (t.data && !t.data->waitSend(remaining(deadline))) throw gloo::IoException("send aborted");
      } else {
        if (t.data && !t.data->waitRecv(remaining(deadline))) throw gloo::IoException("receive aborted");
        if (t.record_out && !t.record_out->waitSend(remaining(deadline))) throw gloo::IoException("record send aborted");
      }
    } catch (const Mismatch&) {
      confirm_verdict(t, deadline);
      fail_transfer(t, Outcome::kCommError, fmt::format("{}: {}", t.what, mismatch));
      return;
    } catch (const std::exception& e) {
      std::string failure = failure_reason();
      if (abort_.tripped() && !failure.empty()) {
        fail_transfer(t, Outcome::kCommError, fmt::format("{} aborted: {}", t.what, failure));
        return;
      }
      const std::string msg = e.what();
      if (msg.find("Application timeout caused pair closure") != std::string::npos) {
        // Another wait on this rank ran into Gloo's timeout, which fails every connection.
        fail_transfer(t, Outcome::kCommError,
                      fmt::format("{} aborted: another operation of this rank timed out in Gloo, "
                                  "which closes every connection: Gloo: {}",
                                  t.what, msg));
      } else if (msg.find("Timed out") != std::string::npos) {
        fail_transfer(t, Outcome::kTimeout,
                      fmt::format("{} timed out waiting for rank {} ({}; did rank {} post it?): "
                                  "Gloo: {}",
                                  t.what, t.peer, waiting_for, t.peer, msg));
      } else {
        fail_transfer(t, Outcome::kCommError,
                      fmt::format("{} failed: the connection to rank {} broke (rank {} failed, "
                                  "died or closed its communicator): Gloo: {}{}",
                                  t.what, t.peer, t.peer, msg, peer_note(t.peer)));
      }
      return;
    } catch (...) {
      fail_transfer(t, Outcome::kCommError, fmt::format("{} failed: unknown exception", t.what));
      return;
    }
    complete(t);
  }

  // A caller's wait passed its deadline while the transfer was pending: the communicator fails
  // (as for a collective given up on). False when the transfer completed meanwhile.
  bool give_up(GlooTransfer& t, std::chrono::milliseconds waited) {
    if (t.finished()) return false;
    const std::string reason = fmt::format("{} was given up on after {} ms (the caller's deadline)",
                                           t.what, waited.count());
    if (fail(reason, true)) call_failed(reason);
    return true;
  }

  void start_helper(std::shared_ptr<GlooTransfer> t) {
    std::lock_guard<std::mutex> lock(helpers_mu_);
    if (stopping_) return;  // shutdown fails it
    helpers_.emplace_back([t = std::move(t), timeout = timeout_] {
      const auto deadline = SteadyClock::now() + timeout;
      if (t->take_turn(deadline) != GlooTransfer::Turn::kDrive) return;
      t->core->drive(*t, deadline);
      t->end_turn();
    });
  }

  // Returns whether this call failed the transfers (the first reason), or they had failed already.
  // Either way the connections are closed when it returns. `leave_note`: the failure started here,
  // so the peers are told why this rank closes its connections (Hooks::note).
  bool fail(const std::string& reason, bool leave_note) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (!failure_.empty()) {
        cv_.wait(lock, [&] { return closed_; });
        return false;
      }
      failure_ = reason;
    }
    if (leave_note) {
      std::lock_guard<std::mutex> lock(hook_mu_);
      if (hooks_.note) hooks_.note(reason);
    }
    abort_.trip();  // wakes every pending wait; no buffer can be enlisted after it
    {
      // No post is in flight while the pairs close (a post to a closed pair would never fail).
      std::lock_guard<std::mutex> post(post_mu_);
      context_->closeConnections();
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      closed_ = true;
    }
    cv_.notify_all();
    return true;
  }

  void shutdown() {
    bool pending;
    {
      std::lock_guard<std::mutex> lock(mu_);
      pending = !live_.empty();
      destroyed_ = true;
    }
    if (pending) fail("the communicator was destroyed while it ran", true);
    {
      std::lock_guard<std::mutex> lock(hook_mu_);  // waits out a hook call in progress
      hooks_ = {};
    }
    std::vector<std::thread> helpers;
    {
      std::lock_guard<std::mutex> lock(helpers_mu_);
      stopping_ = true;
      helpers.swap(helpers_);
    }
    for (auto& h : helpers) h.join();
    {
      // The receive posted ahead for each peer's next acknowledgement is still pending on its pair,
      // and Gloo's loop thread signals it when the peer closes its side: destroying it then would
      // race with that signal. Closed connections signal nothing more (closing takes the lock the
      // loop holds while it signals), so they close before the buffers go; the communicator is
      // going away.
      std::lock_guard<std::mutex> post(post_mu_);
      const bool ahead =
          std::any_of(ack_ahead_.begin(), ack_ahead_.end(), [](const AckAhead& a) { return a.buf != nullptr; });
      if (ahead) context_->closeConnections();
    }
    // Connections closed (or nothing was pending): their buffers can go.
    std::unordered_map<const GlooTransfer*, std::shared_ptr<GlooTransfer>> live;
    {
      std::lock_guard<std::mutex> lock(mu_);
      live.swap(live_);
    }
  }

 private:
  // post_mu_ held.
  void post_locked(GlooTransfer& t, void* buf, size_t bytes) {
    ZERO_CHECK_LE(bytes, kMaxTransferBytes, "transfer too large for its slot (checked by the caller)");
    const int from = t.sending ? t.rank : t.peer;
    const int to = t.sending ? t.peer : t.rank;
    const uint64_t seq = t.call.seq;
    auto create = [&](void* p, size_t n) {
      std::unique_ptr<UnboundBuffer> b = context_->createUnboundBuffer(p, n);
      abort_.enlist(b.get());
      return b;
    };
    if (check_) t.mine = encode_call(t.call);
    if (t.sending) {
      // The acknowledgement's receive first, so that it is posted before the receiver can answer.
      if (check_) {
        take_ack(t, create);
        t.record_out = create(t.mine.data(), t.mine.size());
        t.record_out->send(t.peer, record_slot(kRecordSlot, from, to, seq));
      }
      if (bytes > 0) {
        t.data = create(buf, bytes);
        t.data->send(t.peer, data_slot(from, to, seq, bytes));
      }
    } else {
      if (check_) {
        t.record_in = create(t.theirs->data(), t.theirs->size());
        t.record_in->recv(t.peer, record_slot(kRecordSlot, from, to, seq));
      }
      if (bytes > 0) {
        t.data = create(buf, bytes);
        t.data->recv(t.peer, data_slot(from, to, seq, bytes));
      }
      if (check_) {
        t.record_out = create(t.mine.data(), t.mine.size());
        t.record_out->send(t.peer, record_slot(kAckSlot, from, to, seq));
      }
    }
  }

  // The receive of the acknowledgement of send `t` (post_mu_ held), posted ahead: each send to a
  // peer also posts the receive for the next one's, so that the receiver's record, which it sends
  // when it posts its receive, can be written at once instead of waiting for the sender to ask. A
  // sender that finds the receive posted is done as soon as its data left (one round trip less).
  template <typename Create>
  void take_ack(GlooTransfer& t, Create& create) {
    AckAhead& ahead = ack_ahead_[static_cast<size_t>(t.peer)];
    auto post = [&](uint64_t seq) {
      ahead.seq = seq;
      ahead.record = std::make_unique<CallRecord>();
      ahead.buf = create(ahead.record->data(), ahead.record->size());
      ahead.buf->recv(t.peer, record_slot(kAckSlot, t.rank, t.peer, seq));
    };
    if (!ahead.buf) post(t.call.seq);  // the first send to this peer
    ZERO_CHECK_EQ(ahead.seq, t.call.seq, "acknowledgement posted ahead for another send");
    t.theirs = std::move(ahead.record);
    t.record_in = std::move(ahead.buf);
    post(t.call.seq + 1);
  }

  // After a mismatch, which both ranks of the transfer find from the same two records: one byte
  // each way, so that neither closes its connections (a reset, which may drop what is still in
  // flight) before the other has its verdict. Best effort and bounded; the caller reports the
  // mismatch whatever becomes of it.
  void confirm_verdict(GlooTransfer& t, SteadyClock::time_point deadline) {
    const int from = t.sending ? t.rank : t.peer;
    const int to = t.sending ? t.peer : t.rank;
    const auto until = std::min(deadline, SteadyClock::now() + std::chrono::seconds(10));
    std::unique_ptr<UnboundBuffer> send_buf, recv_buf;
    try {
      send_buf = context_->createUnboundBuffer(&t.verdict_out, 1);
      recv_buf = context_->createUnboundBuffer(&t.verdict_in, 1);
      abort_.enlist(send_buf.get());
      abort_.enlist(recv_buf.get());
      recv_buf->recv(t.peer, record_slot(t.sending ? kVerdictBackSlot : kVerdictSlot, from, to, t.call.seq));
      send_buf->send(t.peer, record_slot(t.sending ? kVerdictSlot : kVerdictBackSlot, from, to, t.call.seq));
      if (recv_buf->waitRecv(remaining(until))) send_buf->waitSend(remaining(until));
    } catch (...) {
    }
    std::lock_guard<std::mutex> lock(mu_);
    for (auto* b : {&send_buf, &recv_buf}) {
      if (!*b) continue;
      abort_.discharge(b->get());
      graveyard_.push_back(std::move(*b));  // released once the connections are closed
    }
  }

  std::string failure_reason() {
    std::lock_guard<std::mutex> lock(mu_);
    return failure_;
  }

  void call_failed(const std::string& reason) {
    std::lock_guard<std::mutex> lock(hook_mu_);
    if (hooks_.failed) hooks_.failed(reason);
  }

  std::string peer_note(int peer) {
    std::lock_guard<std::mutex> lock(hook_mu_);
    return hooks_.peer_note ? hooks_.peer_note(peer) : std::string();
  }

  // Every Gloo operation of the transfer completed: its buffers can go at once.
  void complete(GlooTransfer& t) {
    for (auto* b : {&t.data, &t.record_out, &t.record_in}) {
      if (*b) abort_.discharge(b->get());
      b->reset();
    }
    std::shared_ptr<GlooTransfer> self;  // released after the lock: it may be the last reference
    {
      std::lock_guard<std::mutex> lock(mu_);
      const auto it = live_.find(&t);
      if (it != live_.end()) {
        self = std::move(it->second);
        live_.erase(it);
      }
    }
    t.finish(Outcome::kOk, {});
  }

  // The transfer failed: the communicator fails with it (connections closed before the Work
  // reports, so that Gloo touches none of the caller's buffers after), its buffers wait in the
  // graveyard for the core's end (Gloo's loop thread may still hold them; see BufferSet in
  // gloo_collectives.cc).
  void fail_transfer(GlooTransfer& t, Outcome outcome, const std::string& message) {
    ZERO_LOG_ERROR("{}", message);
    if (fail(message, true)) call_failed(message);
    std::shared_ptr<GlooTransfer> self;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto* b : {&t.data, &t.record_out, &t.record_in}) {
        if (!*b) continue;
        abort_.discharge(b->get());
        graveyard_.push_back(std::move(*b));
      }
      const auto it = live_.find(&t);
      if (it != live_.end()) {
        self = std::move(it->second);
        live_.erase(it);
      }
    }
    t.finish(outcome, message);
  }

  const std::shared_ptr<gloo::Context> context_;
  const std::chrono::milliseconds timeout_;
  const bool check_;

  std::mutex post_mu_;  // numbering and posting; held by fail() while it closes the connections
  std::vector<uint64_t> send_seq_, recv_seq_;  // next transfer number per peer (post_mu_)
  // Per peer, the acknowledgement receive posted ahead for the next send (take_ack; post_mu_).
  // Released with the core, after its connections closed or with nothing pending.
  struct AckAhead {
    uint64_t seq = 0;
    std::unique_ptr<CallRecord> record;
    std::unique_ptr<UnboundBuffer> buf;
  };
  std::vector<AckAhead> ack_ahead_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::string failure_;  // first failure; non-empty once failed
  bool closed_ = false;  // the connections are closed after the failure
  bool destroyed_ = false;
  // Pending transfers, kept here so that their buffers outlive the Gloo operations on them even
  // when every Work handle is dropped.
  std::unordered_map<const GlooTransfer*, std::shared_ptr<GlooTransfer>> live_;
  Graveyard graveyard_;  // buffers of failed transfers, released with the core (connections closed)
  AbortSwitch abort_;

  std::mutex hook_mu_;  // held while a hook runs, so that shutdown waits it out
  GlooP2P::Hooks hooks_;

  std::mutex helpers_mu_;
  bool stopping_ = false;
  std::vector<std::thread> helpers_;  // is_completed's drivers, joined by shutdown
};

namespace {

class P2PWork final : public Work {
 public:
  explicit P2PWork(std::shared_ptr<GlooTransfer> t) : t_(std::move(t)) {}

  // Drives the transfer on this thread (unless another thread does), bounded by `timeout`; past
  // it the communicator fails, as for a collective given up on.
  void wait(std::chrono::milliseconds timeout) override {
    const auto deadline = SteadyClock::now() + timeout;
    if (t_->take_turn(deadline) == GlooTransfer::Turn::kDrive) {
      t_->core->drive(*t_, deadline);
      t_->end_turn();
    }
    {
      std::unique_lock<std::mutex> lock(t_->mu);
      if (t_->cv.wait_until(lock, deadline, [&] { return t_->done; })) {
        t_->throw_if_failed();
        return;
      }
    }
    if (!t_->core->give_up(*t_, timeout)) {
      std::lock_guard<std::mutex> lock(t_->mu);
      t_->throw_if_failed();
      return;
    }
    ZERO_THROW(TimeoutError, "{} did not complete within {} ms; the communicator is aborted",
               t_->what, timeout.count());
  }
  void wait() override { wait(t_->core->timeout()); }

  // Never blocks: the first call on a pending transfer starts a helper thread that drives it.
  bool is_completed() override {
    bool start = false;
    {
      std::lock_guard<std::mutex> lock(t_->mu);
      if (t_->done) {
        t_->throw_if_failed();
        return true;
      }
      if (!t_->helper) start = t_->helper = true;
    }
    if (start) t_->core->start_helper(t_);
    return false;
  }

 private:
  std::shared_ptr<GlooTransfer> t_;
};

}  // namespace

GlooP2P::GlooP2P(std::shared_ptr<gloo::Context> context, std::chrono::milliseconds timeout,
                 bool check)
    : core_(std::make_shared<GlooP2PCore>(std::move(context), timeout, check)) {}

GlooP2P::~GlooP2P() { shutdown(); }

void GlooP2P::set_hooks(Hooks hooks) { core_->set_hooks(std::move(hooks)); }

WorkHandle GlooP2P::send(const void* buf, size_t count, DType dtype, int peer,
                         const std::string& label) {
  return std::make_shared<P2PWork>(
      core_->post(true, const_cast<void*>(buf), count, dtype, peer, label));
}

WorkHandle GlooP2P::recv(void* buf, size_t count, DType dtype, int peer, const std::string& label) {
  return std::make_shared<P2PWork>(core_->post(false, buf, count, dtype, peer, label));
}

void GlooP2P::fail(const std::string& reason) { core_->fail(reason, false); }

void GlooP2P::shutdown() { core_->shutdown(); }

}  // namespace zero::comm
