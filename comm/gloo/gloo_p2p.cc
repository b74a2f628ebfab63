#include "comm/gloo/gloo_p2p.h"

#include <algorithm>
#include <cstddef>
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
#include "comm/p2p_stall_check.h"
#include "comm/schedule_check.h"

namespace zero::comm {
namespace {

using gloo::transport::UnboundBuffer;

// Data slots: 0xB (4 bits) | direction (1) | transfer number mod 2^11 | call fingerprint (12) |
// byte size (36). The top nibble keeps them apart from our collectives' 0xA1..0xA8 and Gloo's own
// 0x01..0x08 (top bytes). Bit 59 says which way the data flows on the pair (1: from the lower rank
// to the higher), so that the transfers a->b and b->a, each numbered from 0, never share a slot.
constexpr uint64_t kSizeBits = 36;
constexpr uint64_t kPrintBits = 12;
constexpr uint64_t kSeqBits = 11;
static_assert(kMaxTransferBytes == (size_t{1} << kSizeBits) - 1);
static_assert(4 + 1 + kSeqBits + kPrintBits + kSizeBits == 64);

// What a transfer and its partner must agree on beyond the byte size: dtype, count and label (with
// the check; 0 without). Both sides compute it from the send's description.
uint64_t fingerprint(const CallInfo& call, int to) {
  CallInfo send = call;
  send.kind = CollectiveKind::kSend;
  send.seq = 0;
  send.root = to;
  return call_hash(send) & ((uint64_t{1} << kPrintBits) - 1);
}

// Transfers of one direction whose numbers differ by a multiple of 2^11 and whose sizes and
// fingerprints agree share a slot, and still meet in order: they are posted in number order on both
// sides, and Gloo matches a slot's messages first in, first out (one TCP connection, one queue per
// slot).
uint64_t data_slot(int from, int to, uint64_t seq, uint64_t print, size_t bytes) {
  const uint64_t direction = from < to ? 1 : 0;
  return (uint64_t{0xB} << 60) | (direction << 59) |
         ((seq & ((uint64_t{1} << kSeqBits) - 1)) << (kPrintBits + kSizeBits)) | (print << kSizeBits) |
         bytes;
}

std::chrono::milliseconds remaining(SteadyClock::time_point deadline) {
  const auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - SteadyClock::now());
  return std::max(left, std::chrono::milliseconds(1));
}

// With the check, how long a transfer waits before the stall check publishes it.
constexpr std::chrono::milliseconds kStallDelay(250);

}  // namespace

// One send or receive: its Gloo buffer and its completion, shared by its Work handles, the core
// (while it is pending) and a helper thread (is_completed).
struct GlooTransfer {
  bool sending = true;
  int rank = 0;
  int peer = 0;
  CallInfo call;
  // "gloo rank 0: send(fp32, 100, to rank 1) #3 [stage 0]", for errors only (formatting it for
  // every transfer would cost a visible share of a small transfer's time).
  std::string what() const { return fmt::format("gloo rank {}: {}", rank, describe_call(call)); }
  SteadyClock::time_point posted;
  uint8_t placeholder = 0;  // what a zero-byte transfer carries
  // Touched by the driving thread (GlooTransfer::take_turn), or by the core once it is retired.
  std::unique_ptr<UnboundBuffer> data;
  std::shared_ptr<GlooP2PCore> core;

  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  Outcome outcome = Outcome::kOk;
  std::string message;
  // The stall check found the partner's call disagreeing: the transfer's error, once the abort that
  // follows wakes its driver.
  std::string mismatch;
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
  std::string found_mismatch() {
    std::lock_guard<std::mutex> lock(mu);
    return mismatch;
  }
  // Lock held.
  void throw_if_failed() const {
    if (outcome == Outcome::kTimeout) throw TimeoutError(message);
    if (outcome == Outcome::kCommError) throw CommError(message);
  }
  void finish(Outcome o, std::string m) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (done) return;  // the first outcome stays
      done = true;
      outcome = o;
      message = std::move(m);
    }
    cv.notify_all();
  }
};

class GlooP2PCore final : public std::enable_shared_from_this<GlooP2PCore> {
 public:
  GlooP2PCore(std::shared_ptr<gloo::Context> context, std::chrono::milliseconds timeout, bool check,
              const TrafficTap* tap)
      : context_(std::move(context)), timeout_(timeout), check_(check), tap_(tap),
        send_seq_(static_cast<size_t>(context_->size), 0),
        recv_seq_(static_cast<size_t>(context_->size), 0),
        stall_check_(context_->rank, context_->size,
                     std::min<std::chrono::milliseconds>(kStallDelay, timeout / 4),
                     {[this](int peer, const Bytes& records) {
                        std::lock_guard<std::mutex> lock(hook_mu_);
                        if (hooks_.pending.publish) hooks_.pending.publish(peer, records);
                      },
                      [this](int peer) {
                        std::lock_guard<std::mutex> lock(hook_mu_);
                        return hooks_.pending.peer_calls ? hooks_.pending.peer_calls(peer) : Bytes();
                      }}) {}

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
    t->posted = SteadyClock::now();
    const size_t bytes = count * dtype_size(dtype);
    std::string error;
    {
      std::lock_guard<std::mutex> post(post_mu_);
      uint64_t& next = (sending ? send_seq_ : recv_seq_)[static_cast<size_t>(peer)];
      t->call = make_p2p_call(next, sending ? CollectiveKind::kSend : CollectiveKind::kRecv, dtype,
                              count, peer);
      t->call.label = label;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (destroyed_) ZERO_THROW(CommError, "{} rejected: communicator destroyed", t->what());
        if (!failure_.empty()) {
          ZERO_THROW(CommError, "{} rejected: communicator failed earlier: {}", t->what(), failure_);
        }
        live_.emplace(t.get(), t);
      }
      ++next;
      try {
        post_locked(*t, buf, bytes);
      } catch (const std::exception& e) {
        const std::string failure = failure_reason();
        error = abort_.tripped() && !failure.empty()
                    ? fmt::format("{} aborted: {}", t->what(), failure)
                    : fmt::format("{} could not be posted: {}", t->what(), e.what());
      }
    }
    if (!error.empty()) {
      fail_transfer(*t, Outcome::kCommError, error);
    } else if (check_) {
      start_stall_check();
    }
    return t;
  }

  // Runs the transfer's Gloo wait until it completes or fails, by `deadline`. The caller has the
  // transfer's turn (GlooTransfer::take_turn).
  void drive(GlooTransfer& t, SteadyClock::time_point deadline) {
    try {
      const bool ok = t.sending ? t.data->waitSend(remaining(deadline)) : t.data->waitRecv(remaining(deadline));
      if (!ok) throw gloo::IoException("transfer aborted");
    } catch (const std::exception& e) {
      // The stall check found the partner disagreeing and aborted this rank's transfers.
      std::string mismatch = t.found_mismatch();
      if (!mismatch.empty()) {
        fail_transfer(t, Outcome::kCommError, std::move(mismatch));
        return;
      }
      std::string failure = failure_reason();
      if (abort_.tripped() && !failure.empty()) {
        fail_transfer(t, Outcome::kCommError, fmt::format("{} aborted: {}", t.what(), failure));
        return;
      }
      const std::string msg = e.what();
      if (msg.find("Application timeout caused pair closure") != std::string::npos) {
        // Another wait on this rank ran into Gloo's timeout, which fails every connection.
        fail_transfer(t, Outcome::kCommError,
                      fmt::format("{} aborted: another operation of this rank timed out in Gloo, "
                                  "which closes every connection: Gloo: {}",
                                  t.what(), msg));
      } else if (msg.find("Timed out") != std::string::npos) {
        fail_transfer(t, Outcome::kTimeout,
                      fmt::format("{} timed out waiting for rank {} (its matching {}; did rank {} "
                                  "post it?): Gloo: {}",
                                  t.what(), t.peer, t.sending ? "recv" : "send", t.peer, msg));
      } else if (std::string mismatch = check_ ? stall_check_.compare_with_peer(t.call) : "";
                 !mismatch.empty()) {
        // The peer's stall check found this transfer's partner disagreeing and closed its
        // connections: the same message on both ranks.
        fail_transfer(t, Outcome::kCommError, fmt::format("{}: {}", t.what(), mismatch));
      } else {
        fail_transfer(t, Outcome::kCommError,
                      fmt::format("{} failed: the connection to rank {} broke (rank {} failed, "
                                  "died or closed its communicator): Gloo: {}{}",
                                  t.what(), t.peer, t.peer, msg, peer_note(t.peer)));
      }
      return;
    } catch (...) {
      fail_transfer(t, Outcome::kCommError, fmt::format("{} failed: unknown exception", t.what()));
      return;
    }
    complete(t);
  }

  // A caller's wait passed its deadline while the transfer was pending: the communicator fails
  // (as for a collective given up on). False when the transfer completed meanwhile.
  bool give_up(GlooTransfer& t, std::chrono::milliseconds waited) {
    if (t.finished()) return false;
    const std::string reason = fmt::format("{} was given up on after {} ms (the caller's deadline)",
                                           t.what(), waited.count());
    fail(reason, true);
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
  // Either way the connections are closed when it returns. `started_here`: the failure started
  // among the transfers, so the peers are told why this rank closes its connections (Hooks::note)
  // and the collectives fail with it (Hooks::failed) before any caller of fail() returns; otherwise
  // the collectives failed first and called it.
  bool fail(const std::string& reason, bool started_here) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (!failure_.empty()) {
        // A transfer's error must not reach its caller before the collectives heard of the failure
        // (the caller's next collective would run on closed connections). The collectives' own
        // call, from inside Hooks::failed, waits for the connections only.
        cv_.wait(lock, [&] { return started_here ? reported_ : closed_; });
        return false;
      }
      failure_ = reason;
    }
    if (started_here) {
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
    if (started_here) {
      std::lock_guard<std::mutex> lock(hook_mu_);
      if (hooks_.failed) hooks_.failed(reason);
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      reported_ = true;
    }
    cv_.notify_all();
    {
      std::lock_guard<std::mutex> lock(stall_mu_);
      stall_stop_ = true;
    }
    stall_cv_.notify_all();
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
    std::thread stall_check;
    {
      std::lock_guard<std::mutex> lock(stall_mu_);
      stall_stop_ = true;
      stall_check.swap(stall_thread_);
    }
    stall_cv_.notify_all();
    if (stall_check.joinable()) stall_check.join();  // before the hooks go: it calls them
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
    // Connections closed (or nothing was pending): the buffers can go.
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
    const uint64_t print = check_ ? fingerprint(t.call, to) : 0;
    // A zero-byte transfer travels as one byte, so that it meets its partner like any other.
    void* p = bytes > 0 ? buf : &t.placeholder;
    const size_t n = std::max<size_t>(bytes, 1);
    t.data = context_->createUnboundBuffer(p, n);
    abort_.enlist(t.data.get());
    const uint64_t slot = data_slot(from, to, t.call.seq, print, bytes);
    if (t.sending) {
      t.data->send(t.peer, slot);
      if (tap_) tap_->sent(t.peer, n);
    } else {
      t.data->recv(t.peer, slot);
    }
  }

  // The stall check (with the check on; comm/p2p_stall_check.h): a transfer whose partner
  // disagrees never meets it (their slots differ), so both ranks would only time out. A thread,
  // started with the first transfer, looks at the pending ones now and then; the store is touched
  // only for transfers pending past the delay.
  void start_stall_check() {
    std::lock_guard<std::mutex> lock(stall_mu_);
    if (stall_thread_.joinable() || stall_stop_) return;
    stall_thread_ = std::thread([this] { run_stall_check(); });
  }

  void run_stall_check() {
    std::unique_lock<std::mutex> lock(stall_mu_);
    while (!stall_stop_) {
      stall_cv_.wait_for(lock, stall_check_.next_look(), [&] { return stall_stop_; });
      if (stall_stop_) break;
      lock.unlock();
      look_at_stalls();
      lock.lock();
    }
  }

  // One look of the stall check over the pending transfers; a disagreement fails the
  // communicator, its transfer reporting the mismatch.
  void look_at_stalls() {
    std::vector<std::shared_ptr<GlooTransfer>> live;
    std::vector<P2PStallCheck::Pending> pending;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!failure_.empty()) return;
      for (const auto& [key, t] : live_) {
        live.push_back(t);
        pending.push_back({t->call, t->posted});
      }
    }
    const auto verdict = stall_check_.look(pending, SteadyClock::now());
    if (!verdict) return;
    GlooTransfer& t = *live[verdict->index];
    const std::string mismatch = fmt::format("{}: {}", t.what(), verdict->mismatch);
    {
      std::lock_guard<std::mutex> lock(t.mu);
      t.mismatch = mismatch;
    }
    // Wakes the transfer's driver, which reports the mismatch; a transfer nobody waits for yet
    // reports it at its first wait.
    fail(mismatch, true);
  }

  std::string failure_reason() {
    std::lock_guard<std::mutex> lock(mu_);
    return failure_;
  }

  std::string peer_note(int peer) {
    std::lock_guard<std::mutex> lock(hook_mu_);
    return hooks_.peer_note ? hooks_.peer_note(peer) : std::string();
  }

  // The transfer's Gloo operation completed: its buffer can go at once.
  void complete(GlooTransfer& t) {
    abort_.discharge(t.data.get());
    t.data.reset();
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
  // reports, so that Gloo touches none of the caller's buffers after), its buffer waits in the
  // graveyard for the core's end (Gloo's loop thread may still hold it; see BufferSet in
  // gloo_collectives.cc).
  void fail_transfer(GlooTransfer& t, Outcome outcome, const std::string& message) {
    ZERO_LOG_ERROR("{}", message);
    fail(message, true);
    std::shared_ptr<GlooTransfer> self;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (t.data) {
        abort_.discharge(t.data.get());
        graveyard_.push_back(std::move(t.data));
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
  const TrafficTap* tap_;

  std::mutex post_mu_;  // numbering and posting; held by fail() while it closes the connections
  std::vector<uint64_t> send_seq_, recv_seq_;  // next transfer number per peer (post_mu_)

  std::mutex mu_;
  std::condition_variable cv_;
  std::string failure_;  // first failure; non-empty once failed
  bool closed_ = false;    // the connections are closed after the failure
  bool reported_ = false;  // ... and the collectives heard of it
  bool destroyed_ = false;
  // Pending transfers, kept here so that their buffers outlive the Gloo operations on them even
  // when every Work handle is dropped.
  std::unordered_map<const GlooTransfer*, std::shared_ptr<GlooTransfer>> live_;
  Graveyard graveyard_;  // buffers of failed transfers, released with the core (connections closed)
  AbortSwitch abort_;

  std::mutex hook_mu_;  // held while a hook runs, so that shutdown waits it out
  GlooP2P::Hooks hooks_;

  std::mutex stall_mu_;
  std::condition_variable stall_cv_;
  bool stall_stop_ = false;
  std::thread stall_thread_;  // started by the first post with the check on
  P2PStallCheck stall_check_;  // the stall thread's (compare_with_peer: any thread's)

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
               t_->what(), timeout.count());
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
                 bool check, const TrafficTap* tap)
    : core_(std::make_shared<GlooP2PCore>(std::move(context), timeout, check, tap)) {}

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
