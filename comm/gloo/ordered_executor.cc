#include "comm/gloo/ordered_executor.h"

#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <utility>

#include <fmt/format.h>

#include "base/check.h"

namespace zero::comm {
namespace {

struct WorkState;

// Lets a waiting caller run its own operation (OrderedWork::wait). Implemented by the executor.
class InlineRunner {
 public:
  // Runs the task of `state` on the calling thread if it is the next one and nothing else runs;
  // returns whether it did.
  virtual bool run_inline(const WorkState* state) = 0;

 protected:
  ~InlineRunner() = default;
};

// Shared by the executor and its works, which may outlive it: `runner` is cleared (under `mu`,
// which an inline run holds) when the executor shuts down.
struct InlineLink {
  std::mutex mu;
  InlineRunner* runner = nullptr;
};

// Fails the executor for a caller whose wait gave up (OrderedWork::wait). Implemented by the
// executor; returns the owner's note (which ranks never reached the collective).
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

class OrderedWork final : public Work {
 public:
  explicit OrderedWork(std::shared_ptr<WorkState> state) : state_(std::move(state)) {}

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

}  // namespace

class OrderedExecutor::Core final : private InlineRunner, private Abandoner {
 public:
  Core(std::chrono::milliseconds default_timeout, Owner& owner)
      : default_timeout_(default_timeout), owner_(owner) {
    link_->runner = this;
    abandon_link_->target = this;
    worker_ = std::thread([this] { worker_loop(); });
  }

  WorkHandle submit(const std::function<Operation(uint64_t seq)>& prepare) {
    auto state = std::make_shared<WorkState>();
    state->default_timeout = default_timeout_;
    state->link = link_;
    {
      std::lock_guard<std::mutex> lock(mu_);
      Operation op = prepare(next_seq_);
      state->what = std::move(op.what);
      state->seq = next_seq_;
      state->abandon = abandon_link_;
      if (!failure_.empty()) {
        ZERO_THROW(CommError, "{} rejected: communicator failed earlier: {}", state->what,
                   failure_);
      }
      // No worker would ever run it.
      if (stopping_) ZERO_THROW(CommError, "{} rejected: communicator destroyed", state->what);
      ++next_seq_;
      queue_.push_back(Task{std::move(op.run), state});
    }
    queue_cv_.notify_one();
    return std::make_shared<OrderedWork>(std::move(state));
  }

  void fail(const std::string& reason) {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    set_failure(reason);
    if (running_) owner_.cut_short(reason);
  }

  void shutdown() {
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
    if (busy) owner_.cut_short("the communicator was destroyed while it ran");
    if (worker_.joinable()) worker_.join();
    {
      std::lock_guard<std::mutex> lock(link_->mu);  // waits out an inline run
      link_->runner = nullptr;
    }
  }

 private:
  struct Task {
    std::function<OpResult(const std::string& what)> run;
    std::shared_ptr<WorkState> state;
  };

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

  // Runs a task taken off the queue with running_ set, on the worker or a waiting caller. A failure
  // fails the executor before the task's handle completes, so a caller who sees the error finds
  // later calls rejected.
  void execute(Task& task) {
    OpResult result = task.run(task.state->what);
    {
      std::lock_guard<std::mutex> lock(mu_);
      running_ = false;
      if (result.outcome != Outcome::kOk) set_failure(result.message);
    }
    queue_cv_.notify_one();  // the worker waits for running_ to clear when a caller ran this
    task.state->finish(result.outcome, std::move(result.message));
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
      set_failure(reason);
      if (running_) owner_.cut_short(reason);
    }
    return owner_.abandoned_note(state->seq);
  }

  // Lock held. The first failure stays, and the owner hears of it.
  void set_failure(const std::string& reason) {
    if (!failure_.empty()) return;
    failure_ = reason;
    owner_.failed(reason);
  }

  const std::chrono::milliseconds default_timeout_;
  Owner& owner_;

  std::mutex mu_;
  std::condition_variable queue_cv_;
  std::deque<Task> queue_;
  bool stopping_ = false;
  bool running_ = false;  // a task runs (on the worker or inline on a waiting caller)
  uint64_t next_seq_ = 0;
  std::string failure_;  // first failure; non-empty once failed

  std::shared_ptr<AbandonLink> abandon_link_ = std::make_shared<AbandonLink>();
  std::shared_ptr<InlineLink> link_ = std::make_shared<InlineLink>();
  std::thread worker_;
};

OrderedExecutor::OrderedExecutor(std::chrono::milliseconds default_timeout, Owner& owner)
    : core_(std::make_unique<Core>(default_timeout, owner)) {}

OrderedExecutor::~OrderedExecutor() { core_->shutdown(); }

WorkHandle OrderedExecutor::submit(const std::function<Operation(uint64_t seq)>& prepare) {
  return core_->submit(prepare);
}

void OrderedExecutor::fail(const std::string& reason) { core_->fail(reason); }

void OrderedExecutor::shutdown() { core_->shutdown(); }

}  // namespace zero::comm
