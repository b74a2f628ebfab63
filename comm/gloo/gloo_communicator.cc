#include "comm/gloo/gloo_communicator.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <limits>
#include <mutex>
#include <optional>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include <gloo/common/error.h>
#include <gloo/context.h>

#include "base/check.h"
#include "base/logging.h"
#include "comm/gloo/failure_report.h"
#include "comm/gloo/gloo_collectives.h"
#include "comm/gloo/reduce_kernels.h"
#include "comm/schedule_check.h"

namespace zero::comm {

namespace {

// Thrown out of a collective by the schedule check (the message is built by the caller).
struct ScheduleMismatch {};

// How a collective ended.
enum class Outcome { kOk, kCommError, kTimeout };

struct WorkState;

// Lets a waiting caller run its own collective (GlooWork::wait). Implemented by the communicator.
class InlineRunner {
 public:
  // Runs the task of `state` on the calling thread if it is the next one and nothing else runs;
  // returns whether it did.
  virtual bool run_inline(const WorkState* state) = 0;

 protected:
  ~InlineRunner() = default;
};

// Shared by the communicator and its works, which may outlive it: `runner` is cleared (under `mu`,
// which an inline run holds) when the communicator is destroyed.
struct InlineLink {
  std::mutex mu;
  InlineRunner* runner = nullptr;
};

// Fails the communicator for a caller whose wait gave up (GlooWork::wait). Implemented by the
// communicator; returns a note on which ranks never reached the collective.
class Abandoner {
 public:
  virtual std::string abandon(const WorkState* state, std::chrono::milliseconds waited) = 0;

 protected:
  ~Abandoner() = default;
};

// As InlineLink, but its lock is only held for the call: an inline run does not hold it, so a
// caller that gives up on a collective running on another thread is not stuck behind it.
struct AbandonLink {
  std::mutex mu;
  Abandoner* target = nullptr;
};

// Completion state shared by the worker and every copy of the handle. Failures are kept as a kind
// and a message and thrown afresh by each wait, so no exception object is shared across threads.
struct WorkState {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  Outcome outcome = Outcome::kOk;
  std::string message;
  std::string what;  // "gloo rank 1: all_reduce(fp32, 1024, sum) #7"
  uint64_t seq = 0;
  std::chrono::milliseconds default_timeout;
  std::shared_ptr<InlineLink> link;
  std::shared_ptr<AbandonLink> abandon;

  void finish(Outcome o, std::string m) {
    {
      std::lock_guard<std::mutex> lock(mu);
      done = true;
      outcome = o;
      message = std::move(m);
    }
    cv.notify_all();
  }
  // Lock held.
  void throw_if_failed() const {
    if (outcome == Outcome::kTimeout) throw TimeoutError(message);
    if (outcome == Outcome::kCommError) throw CommError(message);
  }
};

class GlooWork final : public Work {
 public:
  explicit GlooWork(std::shared_ptr<WorkState> state) : state_(std::move(state)) {}

  // A caller that waits with at least the communicator's own timeout for a collective that is next
  // in line and not started yet runs it on its own thread, as Gloo's synchronous calls do: handing
  // it to the worker thread and the result back costs two cross-core wake-ups, which measured 38 us
  // per round trip on the 2-core VM these figures come from (4.5 us on one core) — more than a
  // third of a 1 MB all-gather there. Issue order is kept (only the queue's front runs, and never
  // beside another task), and the worker still starts anything nobody waits for. A shorter wait
  // only blocks, so that it can give up at its deadline while the collective goes on.
  //
  // A wait that gives up fails the collective and the communicator (as NCCL's abort does): the
  // caller's deadline bounds the collective itself, so a silent peer cannot keep it running into
  // Gloo's own timeout, and every later call fails at once instead of queueing behind it.
  void wait(std::chrono::milliseconds timeout) override {
    if (timeout >= state_->default_timeout) try_inline();
    {
      std::unique_lock<std::mutex> lock(state_->mu);
      if (state_->cv.wait_for(lock, timeout, [&] { return state_->done; })) {
        state_->throw_if_failed();
        return;
      }
    }
    std::string note;
    {
      std::lock_guard<std::mutex> lock(state_->abandon->mu);
      if (state_->abandon->target != nullptr) note = state_->abandon->target->abandon(state_.get(), timeout);
    }
    ZERO_THROW(TimeoutError, "{} did not complete within {} ms{}; the communicator is aborted", state_->what,
               timeout.count(), note);
  }
  void wait() override { wait(state_->default_timeout); }
  bool is_completed() override {
    std::lock_guard<std::mutex> lock(state_->mu);
    if (state_->done) state_->throw_if_failed();
    return state_->done;
  }

 private:
  void try_inline() {
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      if (state_->done) return;
    }
    // Another thread running a collective inline: just wait.
    std::unique_lock<std::mutex> lock(state_->link->mu, std::try_to_lock);
    if (lock && state_->link->runner != nullptr) state_->link->runner->run_inline(state_.get());
  }

  std::shared_ptr<WorkState> state_;
};

// Byte ranges [a, a + an) and [b, b + bn) intersect.
bool overlaps(const void* a, size_t an, const void* b, size_t bn) {
  if (an == 0 || bn == 0) return false;
  const auto pa = reinterpret_cast<uintptr_t>(a);
  const auto pb = reinterpret_cast<uintptr_t>(b);
  return pa < pb + bn && pb < pa + an;
}

size_t checked_bytes(const char* op, const char* what, size_t count, size_t elem, size_t times) {
  const size_t max = std::numeric_limits<size_t>::max();
  if (elem != 0 && times != 0 && count > max / elem / times) {
    ZERO_THROW(InvalidArgument, "{}: {} of {} elements overflows the address space", op, what,
               count);
  }
  return count * elem * times;
}

void require_buffer(const char* op, const char* name, const void* p, size_t count) {
  if (p == nullptr && count > 0) {
    ZERO_THROW(InvalidArgument, "{}: {} is null with count {}", op, name, count);
  }
}

class GlooCommunicator final : public Communicator, private InlineRunner, private Abandoner {
 public:
  GlooCommunicator(std::shared_ptr<Store> store, std::string prefix, int rank, int size,
                   GlooOptions options, bool check)
      : store_(std::move(store)),
        prefix_(std::move(prefix)),
        rank_(rank),
        size_(size),
        options_(std::move(options)),
        check_(check) {
    try {
      context_ = connect_gloo_context(store_, prefix_, rank_, size_, options_.interface_or_host,
                                      options_.timeout);
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      ZERO_THROW(CommError, "gloo rank {}: connecting {} ranks under '{}' failed: {}", rank_,
                 size_, prefix_, e.what());
    }
    handshake();
    link_->runner = this;
    abandon_link_->target = this;
    worker_ = std::thread([this] { worker_loop(); });
  }

  // Queued work fails with "communicator destroyed". A collective still running is cut short
  // rather than left to run into its timeout (its peers may never come): its waits are woken and
  // the connections closed, so it fails at once and so do the peers' matching collectives.
  ~GlooCommunicator() override {
    bool busy;
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
      busy = running_;
    }
    queue_cv_.notify_all();
    {
      std::lock_guard<std::mutex> lock(abandon_link_->mu);
      abandon_link_->target = nullptr;
    }
    if (busy) trip("the communicator was destroyed while it ran");
    if (worker_.joinable()) worker_.join();
    {
      std::lock_guard<std::mutex> lock(link_->mu);  // waits out an inline run
      link_->runner = nullptr;
    }
    bury();
  }

  int rank() const override { return rank_; }
  void set_call_label(std::string_view label) override {
    std::lock_guard<std::mutex> lock(mu_);
    call_label_ = fit_call_label(label);
  }
  int size() const override { return size_; }
  std::string backend_name() const override { return "gloo"; }
  std::chrono::milliseconds default_timeout() const override { return options_.timeout; }

  WorkHandle all_reduce(void* buf, size_t count, DType dtype, ReduceOp op) override {
    const char* name = "all_reduce";
    const size_t es = dtype_size(dtype);
    checked_bytes(name, "buf", count, es, 1);
    require_buffer(name, "buf", buf, count);
    check_reduce_op(name, op);
    Plan plan;
    if (small(count * es)) {
      // Every rank sends its whole buffer to every peer and reduces all n in rank order.
      plan.payload = [=](int) { return Payload{buf, count * es}; };
      plan.apply = [=, this](const uint8_t* area, size_t stride) {
        std::vector<const void*> srcs(static_cast<size_t>(size_));
        for (int r = 0; r < size_; ++r) srcs[r] = r == rank_ ? buf : area + r * stride + kHeader;
        reduce_arrays(dtype, op, srcs.data(), srcs.size(), buf, count);
      };
    } else {
      plan.check_after_sends = true;
      plan.run = [=, this](const DirectOptions& d) {
        all_reduce_direct(*context_, buf, count, dtype, op, d, scratch_);
      };
    }
    return enqueue(CollectiveKind::kAllReduce, dtype, count, op, -1, std::move(plan));
  }

  WorkHandle reduce_scatter(const void* send, void* recv, size_t recv_count, DType dtype,
                            ReduceOp op) override {
    const char* name = "reduce_scatter";
    const size_t es = dtype_size(dtype);
    const size_t send_bytes = checked_bytes(name, "send", recv_count, es, size_);
    const size_t recv_bytes = recv_count * es;
    require_buffer(name, "send", send, recv_count);
    require_buffer(name, "recv", recv, recv_count);
    check_reduce_op(name, op);
    const auto* own = static_cast<const uint8_t*>(send) + rank_ * recv_bytes;
    if (recv != own && overlaps(send, send_bytes, recv, recv_bytes)) {
      ZERO_THROW(InvalidArgument,
                 "{}: recv overlaps send but is not the in-place position send + rank() * "
                 "recv_count (rank {}, recv_count {})",
                 name, rank_, recv_count);
    }
    Plan plan;
    if (small(recv_bytes)) {
      plan.payload = [=](int p) {
        return Payload{static_cast<const uint8_t*>(send) + p * recv_bytes, recv_bytes};
      };
      plan.apply = [=, this](const uint8_t* area, size_t stride) {
        std::vector<const void*> srcs(static_cast<size_t>(size_));
        for (int r = 0; r < size_; ++r) srcs[r] = r == rank_ ? own : area + r * stride + kHeader;
        reduce_arrays(dtype, op, srcs.data(), srcs.size(), recv, recv_count);
      };
    } else {
      plan.check_after_sends = true;
      plan.run = [=, this](const DirectOptions& d) {
        reduce_scatter_direct(*context_, send, recv, ChunkLayout::equal(size_, recv_count), dtype,
                              op, d, scratch_);
      };
    }
    return enqueue(CollectiveKind::kReduceScatter, dtype, recv_count, op, -1, std::move(plan));
  }

  WorkHandle all_gather(const void* send, void* recv, size_t send_count, DType dtype) override {
    const char* name = "all_gather";
    const size_t es = dtype_size(dtype);
    const size_t recv_bytes = checked_bytes(name, "recv", send_count, es, size_);
    const size_t send_bytes = send_count * es;
    require_buffer(name, "send", send, send_count);
    require_buffer(name, "recv", recv, send_count);
    auto* own = static_cast<uint8_t*>(recv) + rank_ * send_bytes;
    if (send != own && overlaps(send, send_bytes, recv, recv_bytes)) {
      ZERO_THROW(InvalidArgument,
                 "{}: send overlaps recv but is not the in-place position recv + rank() * "
                 "send_count (rank {}, send_count {})",
                 name, rank_, send_count);
    }
    Plan plan;
    if (small(send_bytes)) {
      plan.payload = [=](int) { return Payload{send, send_bytes}; };
      plan.apply = [=, this](const uint8_t* area, size_t stride) {
        for (int r = 0; r < size_; ++r) {
          uint8_t* to = static_cast<uint8_t*>(recv) + r * send_bytes;
          if (r != rank_) {
            std::memcpy(to, area + r * stride + kHeader, send_bytes);
          } else if (send != own && send_bytes > 0) {
            std::memcpy(own, send, send_bytes);
          }
        }
      };
    } else {
      plan.check_after_sends = true;
      plan.run = [=, this](const DirectOptions& d) {
        if (send != own && send_bytes > 0) std::memcpy(own, send, send_bytes);
        all_gather_direct(*context_, recv, ChunkLayout::equal(size_, send_count), es, d);
      };
    }
    return enqueue(CollectiveKind::kAllGather, dtype, send_count, std::nullopt, -1,
                   std::move(plan));
  }

  WorkHandle broadcast(void* buf, size_t count, DType dtype, int root) override {
    const char* name = "broadcast";
    const size_t bytes = checked_bytes(name, "buf", count, dtype_size(dtype), 1);
    require_buffer(name, "buf", buf, count);
    if (root < 0 || root >= size_) {
      ZERO_THROW(InvalidArgument, "{}: root {} is out of range [0, {})", name, root, size_);
    }
    Plan plan;
    if (small(bytes)) {
      plan.payload = [=, this](int) {
        return rank_ == root ? Payload{buf, bytes} : Payload{};
      };
      plan.apply = [=, this](const uint8_t* area, size_t stride) {
        if (rank_ != root && bytes > 0) std::memcpy(buf, area + root * stride + kHeader, bytes);
      };
    } else {
      plan.run = [=, this](const DirectOptions& d) {
        broadcast_direct(*context_, buf, bytes, root, d);
      };
    }
    return enqueue(CollectiveKind::kBroadcast, dtype, count, std::nullopt, root, std::move(plan));
  }

  WorkHandle all_to_all(const void* send, void* recv, size_t count, DType dtype) override {
    const char* name = "all_to_all";
    const size_t bytes = checked_bytes(name, "send", count, dtype_size(dtype), size_);
    require_buffer(name, "send", send, count);
    require_buffer(name, "recv", recv, count);
    if (overlaps(send, bytes, recv, bytes)) {
      ZERO_THROW(InvalidArgument, "{}: send and recv overlap (all_to_all is not in place)", name);
    }
    const size_t chunk = count * dtype_size(dtype);
    Plan plan;
    if (small(chunk)) {
      plan.payload = [=](int p) {
        return Payload{static_cast<const uint8_t*>(send) + p * chunk, chunk};
      };
      plan.apply = [=, this](const uint8_t* area, size_t stride) {
        for (int r = 0; r < size_ && chunk > 0; ++r) {
          const uint8_t* from = r == rank_ ? static_cast<const uint8_t*>(send) + r * chunk
                                           : area + r * stride + kHeader;
          std::memcpy(static_cast<uint8_t*>(recv) + r * chunk, from, chunk);
        }
      };
    } else {
      plan.run = [=, this](const DirectOptions& d) {
        all_to_all_direct(*context_, send, recv, chunk, d);
      };
    }
    return enqueue(CollectiveKind::kAllToAll, dtype, count, std::nullopt, -1, std::move(plan));
  }

  WorkHandle barrier() override {
    // The message round itself is the barrier: nobody finishes before everybody's header arrived.
    Plan plan;
    plan.payload = [](int) { return Payload{}; };
    plan.apply = [](const uint8_t*, size_t) {};
    return enqueue(CollectiveKind::kBarrier, DType::kUInt8, 0, std::nullopt, -1, std::move(plan));
  }

  std::unique_ptr<Communicator> split(int color, int key) override;

 private:
  // How a call runs. Small calls (payload up to eager_bytes per message) are one round of
  // header+payload messages (exchange_messages) that carries the schedule check and the data at
  // once; `apply` then finishes the collective locally from the received payloads. Larger calls
  // `run` one of our collectives (gloo_collectives.h), which runs the check itself: once its
  // receives are posted (DirectOptions::before_sends), or with check_after_sends, while its data
  // moves (DirectOptions::after_sends).
  struct Plan {
    std::function<Payload(int peer)> payload;
    std::function<void(const uint8_t* area, size_t stride)> apply;
    bool check_after_sends = false;
    std::function<void(const DirectOptions&)> run;
    bool small() const { return static_cast<bool>(apply); }
  };
  struct Task {
    CallInfo call;
    Plan plan;
    std::shared_ptr<WorkState> state;
  };
  static constexpr size_t kHeader = kCallRecordBytes;

  bool small(size_t payload_bytes) const { return runs_as_messages(options_, payload_bytes); }
  size_t capacity() const { return message_capacity(options_); }

  static void check_reduce_op(const char* name, ReduceOp op) {
    if (static_cast<int>(op) < 0 || static_cast<int>(op) > static_cast<int>(ReduceOp::kMin)) {
      ZERO_THROW(InvalidArgument, "{}: unknown reduce op value {}", name, static_cast<int>(op));
    }
  }

  std::string label(const CallInfo& call) const {
    return fmt::format("gloo rank {}: {}", rank_, describe_call(call));
  }

  WorkHandle enqueue(CollectiveKind kind, DType dtype, size_t count, std::optional<ReduceOp> op,
                     int root, Plan plan) {
    auto state = std::make_shared<WorkState>();
    state->default_timeout = options_.timeout;
    state->link = link_;
    {
      std::lock_guard<std::mutex> lock(mu_);
      CallInfo call = op ? make_reduce_call(next_seq_, kind, dtype, count, *op)
                         : make_call(next_seq_, kind, dtype, count);
      call.root = root;
      call.label = call_label_;
      state->what = label(call);
      state->seq = call.seq;
      state->abandon = abandon_link_;
      if (!failure_.empty()) {
        ZERO_THROW(CommError, "{} rejected: communicator failed earlier: {}", state->what,
                   failure_);
      }
      ++next_seq_;
      queue_.push_back(Task{call, std::move(plan), state});
    }
    queue_cv_.notify_one();
    return std::make_shared<GlooWork>(std::move(state));
  }

  // Runs queued tasks in issue order, one at a time, except while a caller runs the next one
  // itself (run_inline).
  void worker_loop() {
    for (;;) {
      Task task;
      std::string failure;
      {
        std::unique_lock<std::mutex> lock(mu_);
        queue_cv_.wait(lock, [&] { return stopping_ || (!queue_.empty() && !running_); });
        if (queue_.empty()) return;
        task = std::move(queue_.front());
        queue_.pop_front();
        failure = failure_;
        if (stopping_ && failure.empty()) failure = "communicator destroyed";
        if (failure.empty()) running_ = true;
      }
      if (!failure.empty()) {
        task.state->finish(Outcome::kCommError,
                           fmt::format("{} not run: communicator failed earlier: {}",
                                       task.state->what, failure));
        continue;
      }
      execute(task);
    }
  }

  bool run_inline(const WorkState* state) override {
    Task task;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_ || running_ || !failure_.empty() || queue_.empty() ||
          queue_.front().state.get() != state) {
        return false;
      }
      task = std::move(queue_.front());
      queue_.pop_front();
      running_ = true;
    }
    execute(task);
    return true;
  }

  // Runs a task taken off the queue with running_ set, on the worker or a waiting caller.
  void execute(Task& task) {
    auto [outcome, message] = run_task(task);
    if (outcome != Outcome::kOk) {
      // The communicator is done for. Gloo may still be moving data of the failed collective
      // (a healthy peer's late "ready" notice starts a send from our caller's buffer; a late
      // message lands in it), and the caller may free those buffers as soon as it sees the
      // error, so every connection is closed before the work completes; after that Gloo touches
      // none of our buffers, and the peers fail at once instead of at their timeout.
      close_and_bury();
      message += absent_ranks(task.call.seq);
      ZERO_LOG_ERROR("{}", message);
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      running_ = false;
      if (outcome != Outcome::kOk && failure_.empty()) failure_ = message;
    }
    queue_cv_.notify_one();  // the worker waits for running_ to clear when a caller ran this
    task.state->finish(outcome, std::move(message));
  }

  // Runs one collective (after the schedule check); turns every exception into an outcome and a
  // message naming the op, its sequence number and the rank (Gloo's own text included).
  std::pair<Outcome, std::string> run_task(Task& task) {
    DirectOptions d;
    d.tag = static_cast<uint32_t>(task.call.seq);
    d.deadline = SteadyClock::now() + options_.timeout;
    d.segment_bytes = options_.segment_bytes;
    d.depth = options_.segment_depth;
    d.gather_segment_bytes = options_.gather_segment_bytes;
    d.graveyard = &graveyard_;
    d.abort = &abort_;
    d.awaiting = &awaiting_;
    awaiting_.store(-1, std::memory_order_relaxed);
    const std::string& what = task.state->what;
    std::string mismatch;
    // Compares the headers in the message area (one per rank, `capacity()` apart).
    auto compare = [&](const uint8_t* area) {
      std::vector<CallRecord> all(static_cast<size_t>(size_));
      for (int r = 0; r < size_; ++r) std::memcpy(all[r].data(), area + r * capacity(), kHeader);
      mismatch = find_schedule_mismatch(all);
      if (!mismatch.empty()) throw ScheduleMismatch{};
    };
    const CallRecord mine = encode_call(task.call);
    uint8_t* area = messages_.get(static_cast<size_t>(size_) * capacity());
    try {
      if (task.plan.small()) {
        exchange_messages(*context_, mine.data(), kHeader, task.plan.payload, area, capacity(),
                          message_sends_, d);
        if (check_) compare(area);
        task.plan.apply(area, capacity());
        return {Outcome::kOk, {}};
      }
      // The check's records: posted by check_start (or by `check` itself when the collective
      // has no use for an early start), waited for and compared by `check`.
      std::optional<MessageRound> round;
      DirectOptions c = d;
      auto check_start = [&] {
        round.emplace(*context_, mine.data(), kHeader, nullptr, area, capacity(), message_sends_,
                      c);
      };
      auto check = [&] {
        if (!round) check_start();
        round->finish();
        compare(area);
      };
      if (check_ && task.plan.check_after_sends) {
        d.check_start = check_start;
        d.after_sends = check;
      } else if (check_) {
        d.before_sends = check;
      }
      task.plan.run(d);
      return {Outcome::kOk, {}};
    } catch (const ScheduleMismatch&) {
      // Best effort, bounded: the mismatch is reported whatever becomes of this round.
      try {
        DirectOptions v;
        v.tag = d.tag;
        v.deadline = std::min(d.deadline, SteadyClock::now() + std::chrono::seconds(10));
        v.graveyard = &graveyard_;
        v.abort = &abort_;
        confirm_verdict(*context_, v);
      } catch (...) {
      }
      return {Outcome::kCommError, fmt::format("{}: {}", what, mismatch)};
    } catch (...) {
      if (abort_.tripped()) return {Outcome::kCommError, fmt::format("{} aborted: {}", what, abort_reason())};
      return classify_failure(what);
    }
  }

  // The outcome of the exception in flight (called from a catch block).
  static std::pair<Outcome, std::string> classify_failure(const std::string& what) {
    try {
      throw;
    } catch (const TimeoutError& e) {
      return {Outcome::kTimeout, fmt::format("{}: {}", what, e.what())};
    } catch (const gloo::IoException& e) {
      const std::string msg = e.what();
      if (msg.find("Timed out") != std::string::npos) {
        return {Outcome::kTimeout, fmt::format("{} timed out in Gloo: {}", what, msg)};
      }
      return {Outcome::kCommError, fmt::format("{} failed in Gloo: {}", what, msg)};
    } catch (const std::exception& e) {
      return {Outcome::kCommError, fmt::format("{} failed: {}", what, e.what())};
    } catch (...) {
      return {Outcome::kCommError, fmt::format("{} failed: unknown exception", what)};
    }
  }

  // Abandoner: a caller gave up waiting for `state`. Unless it completed meanwhile, the
  // communicator fails with that reason, and a collective running now (this one, or the one it
  // queues behind) is cut short: its waits woken, its connections closed, so the peers fail too.
  std::string abandon(const WorkState* state, std::chrono::milliseconds waited) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      {
        std::lock_guard<std::mutex> done_lock(const_cast<WorkState*>(state)->mu);
        if (state->done) return {};
      }
      const std::string reason =
          fmt::format("{} was given up on after {} ms (the caller's deadline)", state->what, waited.count());
      if (failure_.empty()) failure_ = reason;
      if (running_) trip(reason);
    }
    return absent_ranks(state->seq);
  }

  // " this rank was waiting for rank P's data" while a reduce-scatter waits on a peer, else "".
  std::string awaited_peer() const {
    const int p = awaiting_.load(std::memory_order_relaxed);
    return p < 0 ? std::string() : fmt::format("; this rank was waiting for rank {}'s data", p);
  }

  void trip(const std::string& reason) {
    {
      std::lock_guard<std::mutex> lock(abort_mu_);
      if (abort_reason_.empty()) abort_reason_ = reason;
    }
    abort_.trip();
    abort_connections(*context_);
  }
  std::string abort_reason() const {
    std::lock_guard<std::mutex> lock(abort_mu_);
    return abort_reason_;
  }

  // Which ranks never reached collective `seq`, for the failure's message (failure_report.h).
  std::string absent_ranks(uint64_t seq) { return failure_report_.absent_ranks(seq, awaited_peer()); }

  // Releases the buffers of failed collectives once Gloo's loop thread can no longer touch them:
  // closing a connection takes the lock the loop thread holds while it signals that connection's
  // buffers, and a closed connection signals nothing more.
  void bury() {
    if (!graveyard_.empty()) close_and_bury();
  }
  void close_and_bury() {
    context_->closeConnections();
    graveyard_.clear();
  }

  // Verifies that every rank agrees on the settings that shape the messages: the schedule check (a
  // rank checking alone would wait for headers nobody sends) and the message sizes (a receive
  // smaller than the message that lands in it aborts Gloo).
  void handshake() {
    DirectOptions d;
    d.tag = 0xffffffffu;
    d.deadline = SteadyClock::now() + options_.timeout;
    struct Settings {
      uint64_t check, segment_bytes, gather_segment_bytes, eager_bytes;
    };
    const Settings mine{check_ ? 1u : 0u, options_.segment_bytes, options_.gather_segment_bytes,
                        options_.eager_bytes};
    std::vector<Settings> all(static_cast<size_t>(size_));
    d.graveyard = &graveyard_;
    try {
      exchange_records(*context_, &mine, all.data(), sizeof(Settings), d);
    } catch (const std::exception& e) {
      bury();
      ZERO_THROW(CommError, "gloo rank {}: handshake under '{}' failed: {}", rank_, prefix_,
                 e.what());
    }
    for (int r = 0; r < size_; ++r) {
      if (all[r].check != mine.check) {
        ZERO_THROW(CommError,
                   "gloo rank {}: schedule check is {} here but {} on rank {} (set "
                   "ZERO_COMM_CHECK and GlooOptions.check_schedule the same on every rank)",
                   rank_, check_ ? "on" : "off", all[r].check ? "on" : "off", r);
      }
      if (all[r].segment_bytes != mine.segment_bytes ||
          all[r].gather_segment_bytes != mine.gather_segment_bytes ||
          all[r].eager_bytes != mine.eager_bytes) {
        ZERO_THROW(CommError,
                   "gloo rank {}: GlooOptions segment_bytes/gather_segment_bytes/eager_bytes are "
                   "{}/{}/{} here but {}/{}/{} on rank {} (they must match on every rank)",
                   rank_, mine.segment_bytes, mine.gather_segment_bytes, mine.eager_bytes,
                   all[r].segment_bytes, all[r].gather_segment_bytes, all[r].eager_bytes, r);
      }
    }
  }

  std::shared_ptr<Store> store_;
  const std::string prefix_;  // unique to this communicator instance
  const int rank_;
  const int size_;
  const GlooOptions options_;
  const bool check_;
  const FailureReport failure_report_{store_, prefix_, rank_, size_, options_.failure_report_grace};
  std::shared_ptr<gloo::Context> context_;

  std::mutex mu_;
  std::condition_variable queue_cv_;
  std::deque<Task> queue_;
  bool stopping_ = false;
  bool running_ = false;  // a collective runs (on the worker or inline on a waiting caller)
  uint64_t next_seq_ = 0;
  std::string call_label_;  // set_call_label; guarded by mu_
  uint64_t splits_ = 0;
  std::string failure_;  // first failure; non-empty once failed

  // Unbound buffers of failed collectives (touched only by the thread running a collective, or
  // after the worker is joined; see BufferSet in gloo_collectives.cc).
  Graveyard graveyard_;
  AbortSwitch abort_;  // tripped by the destructor, or by a caller's deadline, while a collective runs
  mutable std::mutex abort_mu_;
  std::string abort_reason_;
  std::atomic<int> awaiting_{-1};  // the running reduce-scatter's awaited peer (DirectOptions::awaiting)
  std::shared_ptr<AbandonLink> abandon_link_ = std::make_shared<AbandonLink>();
  std::shared_ptr<InlineLink> link_ = std::make_shared<InlineLink>();
  // Touched only by the thread running a collective (running_):
  Scratch scratch_;        // reduce-scatter receive segments
  Scratch messages_;       // received header+payload messages
  Scratch message_sends_;  // outgoing header+payload messages
  std::thread worker_;
};

Bytes encode_color_key(int color, int key) {
  Bytes b(8);
  std::memcpy(b.data(), &color, 4);
  std::memcpy(b.data() + 4, &key, 4);
  return b;
}

std::unique_ptr<Communicator> GlooCommunicator::split(int color, int key) {
  uint64_t index;
  {
    std::lock_guard<std::mutex> lock(mu_);
    index = splits_++;
  }
  const std::string base = fmt::format("{}/split{}", prefix_, index);
  store_->set(fmt::format("{}/{}", base, rank_), encode_color_key(color, key));
  std::vector<std::tuple<int, int>> members;  // (key, rank) of ranks with my color
  for (int r = 0; r < size_; ++r) {
    const Bytes b = store_->get(fmt::format("{}/{}", base, r), options_.timeout);
    if (b.size() != 8) {
      ZERO_THROW(CommError, "gloo rank {}: split record of rank {} has {} bytes", rank_, r,
                 b.size());
    }
    int c, k;
    std::memcpy(&c, b.data(), 4);
    std::memcpy(&k, b.data() + 4, 4);
    if (c == color) members.emplace_back(k, r);
  }
  if (color < 0) return nullptr;
  std::sort(members.begin(), members.end());
  int new_rank = -1;
  for (size_t i = 0; i < members.size(); ++i) {
    if (std::get<1>(members[i]) == rank_) new_rank = static_cast<int>(i);
  }
  ZERO_CHECK_GE(new_rank, 0, "own rank missing from its split group");
  return std::make_unique<GlooCommunicator>(store_, fmt::format("{}/color{}", base, color),
                                            new_rank, static_cast<int>(members.size()), options_,
                                            check_);
}

}  // namespace

std::unique_ptr<Communicator> make_gloo_communicator(std::shared_ptr<Store> store, int rank,
                                                     int size, const GlooOptions& options) {
  options.validate();
  if (!store) ZERO_THROW(InvalidArgument, "make_gloo_communicator: store is null");
  if (size < 1) ZERO_THROW(InvalidArgument, "make_gloo_communicator: size {} < 1", size);
  if (rank < 0 || rank >= size) {
    ZERO_THROW(InvalidArgument, "make_gloo_communicator: rank {} is out of range [0, {})", rank,
               size);
  }
  const bool check = options.check_schedule && schedule_check_from_env(true);
  // Every rank creates its communicators in the same order, so the per-rank instance counter gives
  // all ranks the same fresh prefix even when the store already holds an older group's keys.
  const int64_t instance = store->add(fmt::format("{}/instances/{}", options.prefix, rank), 1);
  return std::make_unique<GlooCommunicator>(
      store, fmt::format("{}/{}", options.prefix, instance), rank, size, options, check);
}

}  // namespace zero::comm
