// OrderedExecutor with plain functions as operations: issue order and one operation at a time
// whoever waits (the worker or callers running the next operation inline), sequence numbers, an
// error reaching the handle and failing the executor, a wait past its deadline, and shutdown with
// work queued and running.
#include "comm/gloo/ordered_executor.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/error.h"

namespace zero::comm {
namespace {

using namespace std::chrono_literals;

constexpr auto kDefaultTimeout = 20s;

// Blocks operations until opened (or until a bound, so that a broken executor fails the test
// instead of hanging it).
class Gate {
 public:
  void open() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      open_ = true;
    }
    cv_.notify_all();
  }
  // Whether it was opened within the bound.
  bool wait() {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, 10s, [&] { return open_; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

// Records the executor's calls; cutting short opens `gate` (the running operation's waits woken).
class RecordingOwner final : public OrderedExecutor::Owner {
 public:
  void cut_short(const std::string& reason) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      reasons_.push_back(reason);
    }
    gate.open();
  }
  std::string abandoned_note(uint64_t seq) override { return " (note on #" + std::to_string(seq) + ")"; }
  void failed(const std::string& reason) override {
    std::lock_guard<std::mutex> lock(mu_);
    failures_.push_back(reason);
  }
  std::vector<std::string> reasons() {
    std::lock_guard<std::mutex> lock(mu_);
    return reasons_;
  }
  std::vector<std::string> failures() {
    std::lock_guard<std::mutex> lock(mu_);
    return failures_;
  }

  Gate gate;

 private:
  std::mutex mu_;
  std::vector<std::string> reasons_;
  std::vector<std::string> failures_;
};

// Submits an operation named "op #<seq>" that runs body(seq).
WorkHandle submit(OrderedExecutor& executor, std::function<OpResult(uint64_t seq)> body) {
  return executor.submit([&](uint64_t seq) {
    return OrderedExecutor::Operation{"op #" + std::to_string(seq),
                                      [seq, body](const std::string&) { return body(seq); }};
  });
}

// What operations saw while they ran: the order, how many ran at once, on which threads.
class Trace {
 public:
  OpResult run(uint64_t seq, std::chrono::microseconds duration = 0us) {
    const int now = ++in_flight_;
    int seen = max_in_flight_.load();
    while (now > seen && !max_in_flight_.compare_exchange_weak(seen, now)) {
    }
    std::this_thread::sleep_for(duration);
    {
      std::lock_guard<std::mutex> lock(mu_);
      order_.push_back(seq);
      threads_.push_back(std::this_thread::get_id());
    }
    --in_flight_;
    return {};
  }
  std::vector<uint64_t> order() {
    std::lock_guard<std::mutex> lock(mu_);
    return order_;
  }
  std::vector<std::thread::id> threads() {
    std::lock_guard<std::mutex> lock(mu_);
    return threads_;
  }
  int max_in_flight() const { return max_in_flight_; }

 private:
  std::atomic<int> in_flight_{0};
  std::atomic<int> max_in_flight_{0};
  std::mutex mu_;
  std::vector<uint64_t> order_;
  std::vector<std::thread::id> threads_;
};

std::vector<uint64_t> iota(size_t n) {
  std::vector<uint64_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = i;
  return v;
}

}  // namespace

TEST_CASE("operations nobody waits for run on the worker, one at a time, in issue order") {
  RecordingOwner owner;
  OrderedExecutor executor(kDefaultTimeout, owner);
  Trace trace;
  std::vector<WorkHandle> works;
  for (int i = 0; i < 30; ++i) works.push_back(submit(executor, [&](uint64_t seq) { return trace.run(seq, 100us); }));
  // A wait shorter than the default only blocks: everything runs on the worker.
  for (auto& w : works) w->wait(kDefaultTimeout - 1ms);
  CHECK(trace.order() == iota(30));
  CHECK(trace.max_in_flight() == 1);
  const auto threads = trace.threads();
  CHECK(std::count(threads.begin(), threads.end(), std::this_thread::get_id()) == 0);
  CHECK(std::count(threads.begin(), threads.end(), threads.front()) == 30);  // one worker
}

// Callers waiting with the default timeout run the next operation themselves when it has not
// started; three callers waiting in different orders beside the worker must still see every
// operation run alone and in issue order.
TEST_CASE("waiting in any order, from several threads, keeps issue order and one at a time") {
  RecordingOwner owner;
  OrderedExecutor executor(kDefaultTimeout, owner);
  Trace trace;
  constexpr int kOps = 60;
  std::vector<WorkHandle> works;
  for (int i = 0; i < kOps; ++i) works.push_back(submit(executor, [&](uint64_t seq) { return trace.run(seq, 200us); }));
  std::thread forward([&] {
    for (int i = 0; i < kOps; ++i) works[i]->wait();
  });
  std::thread backward([&] {
    for (int i = kOps - 1; i >= 0; --i) works[i]->wait();
  });
  for (int k = 0; k < kOps; ++k) works[(k * 7) % kOps]->wait();
  forward.join();
  backward.join();
  CHECK(trace.order() == iota(kOps));
  CHECK(trace.max_in_flight() == 1);
}

// Right after issuing, the worker has usually not woken yet, so nothing runs: a caller who waits
// for the last of several operations then must not run it ahead of the others.
TEST_CASE("waiting for a later operation never runs it ahead of those before it") {
  RecordingOwner owner;
  OrderedExecutor executor(kDefaultTimeout, owner);
  Trace trace;
  for (int round = 0; round < 200; ++round) {
    std::vector<WorkHandle> works;
    for (int i = 0; i < 3; ++i) works.push_back(submit(executor, [&](uint64_t seq) { return trace.run(seq); }));
    works[2]->wait();
    for (auto& w : works) w->wait();
  }
  CHECK(trace.order() == iota(600));
}

// The caller may only run the next operation when nothing runs: waiting for it while the one
// before it runs waits its turn (and the worker runs it).
TEST_CASE("an operation waited for while the one before it runs waits its turn") {
  RecordingOwner owner;
  OrderedExecutor executor(kDefaultTimeout, owner);
  Trace trace;
  Gate gate;
  std::atomic<bool> started{false};
  auto first = submit(executor, [&](uint64_t seq) {
    started = true;
    gate.wait();
    return trace.run(seq);
  });
  while (!started) std::this_thread::sleep_for(1ms);
  auto second = submit(executor, [&](uint64_t seq) { return trace.run(seq); });
  std::thread opener([&] {
    std::this_thread::sleep_for(100ms);
    gate.open();
  });
  second->wait();
  opener.join();
  first->wait();
  CHECK(trace.order() == iota(2));
  const auto threads = trace.threads();
  CHECK(threads[1] == threads[0]);  // the worker
  CHECK(threads[1] != std::this_thread::get_id());
}

TEST_CASE("a wait with the default timeout runs the next operation on the caller's thread") {
  RecordingOwner owner;
  OrderedExecutor executor(kDefaultTimeout, owner);
  Trace trace;
  // The worker may take an operation before its caller waits; the caller wins almost every time.
  bool inline_run = false;
  for (int i = 0; i < 1000 && !inline_run; ++i) {
    submit(executor, [&](uint64_t seq) { return trace.run(seq); })->wait();
    inline_run = trace.threads().back() == std::this_thread::get_id();
  }
  CHECK(inline_run);
}

TEST_CASE("sequence numbers follow issue order") {
  RecordingOwner owner;
  OrderedExecutor executor(kDefaultTimeout, owner);
  std::vector<uint64_t> seen;
  for (int i = 0; i < 3; ++i) {
    executor.submit([&](uint64_t seq) {
      seen.push_back(seq);
      return OrderedExecutor::Operation{"op", [](const std::string&) { return OpResult{}; }};
    })->wait();
  }
  CHECK(seen == iota(3));
}

TEST_CASE("an error reaches its handle on every wait, and fails queued and later operations") {
  RecordingOwner owner;
  OrderedExecutor executor(kDefaultTimeout, owner);
  Gate queued;
  std::atomic<bool> later_ran{false};
  auto ok = submit(executor, [](uint64_t) { return OpResult{}; });
  auto failing = submit(executor, [&](uint64_t) {
    queued.wait();  // fails only once the next operation is queued behind it
    return OpResult{Outcome::kCommError, "op #1 broke"};
  });
  auto behind = submit(executor, [&](uint64_t) {
    later_ran = true;
    return OpResult{};
  });
  queued.open();
  ok->wait();
  CHECK_THROWS_WITH_AS(failing->wait(), "op #1 broke", CommError);
  CHECK_THROWS_WITH_AS(failing->wait(), "op #1 broke", CommError);  // thrown afresh
  CHECK_THROWS_WITH_AS(failing->is_completed(), "op #1 broke", CommError);
  CHECK_THROWS_WITH_AS(behind->wait(), "op #2 not run: communicator failed earlier: op #1 broke", CommError);
  CHECK_FALSE(later_ran);
  CHECK_THROWS_WITH_AS(submit(executor, [](uint64_t) { return OpResult{}; }),
                       "op #3 rejected: communicator failed earlier: op #1 broke", CommError);
  CHECK_THROWS_WITH_AS(submit(executor, [](uint64_t) { return OpResult{}; }),
                       "op #3 rejected: communicator failed earlier: op #1 broke", CommError);
  CHECK(owner.reasons().empty());  // nothing was cut short
  CHECK(owner.failures() == std::vector<std::string>{"op #1 broke"});  // heard once
}

TEST_CASE("failing from outside cuts short the running operation and rejects the rest") {
  RecordingOwner owner;
  OrderedExecutor executor(kDefaultTimeout, owner);
  Gate started;
  auto running = submit(executor, [&](uint64_t) {
    started.open();
    // Runs until cut short (the owner's cut_short opens its gate).
    return owner.gate.wait() ? OpResult{Outcome::kCommError, "op #0 cut short"} : OpResult{};
  });
  auto queued = submit(executor, [](uint64_t) { return OpResult{}; });
  REQUIRE(started.wait());
  executor.fail("a transfer failed");
  CHECK_THROWS_WITH_AS(running->wait(), "op #0 cut short", CommError);
  CHECK_THROWS_WITH_AS(queued->wait(), "op #1 not run: communicator failed earlier: a transfer failed",
                       CommError);
  CHECK_THROWS_WITH_AS(submit(executor, [](uint64_t) { return OpResult{}; }),
                       "op #2 rejected: communicator failed earlier: a transfer failed", CommError);
  CHECK(owner.reasons() == std::vector<std::string>{"a transfer failed"});
  CHECK(owner.failures() == std::vector<std::string>{"a transfer failed"});  // the first failure only
  executor.shutdown();
  executor.fail("after shutdown");  // no effect, no owner call
  CHECK(owner.failures().size() == 1);
}

TEST_CASE("a timeout outcome is thrown as TimeoutError") {
  RecordingOwner owner;
  OrderedExecutor executor(kDefaultTimeout, owner);
  auto w = submit(executor, [](uint64_t) { return OpResult{Outcome::kTimeout, "op #0 timed out"}; });
  CHECK_THROWS_WITH_AS(w->wait(), "op #0 timed out", TimeoutError);
  CHECK_THROWS_WITH_AS(submit(executor, [](uint64_t) { return OpResult{}; }),
                       "op #1 rejected: communicator failed earlier: op #0 timed out", CommError);
}

TEST_CASE("a completed handle answers at once, and again") {
  RecordingOwner owner;
  OrderedExecutor executor(kDefaultTimeout, owner);
  Gate gate;
  auto w = submit(executor, [&](uint64_t) {
    gate.wait();
    return OpResult{};
  });
  CHECK_FALSE(w->is_completed());
  gate.open();
  w->wait();
  CHECK(w->is_completed());
  const auto t0 = std::chrono::steady_clock::now();
  w->wait(1ms);
  w->wait();
  CHECK(std::chrono::steady_clock::now() - t0 < 1s);
}

// The caller's deadline bounds the operation: the one running is cut short (here the waited-for
// operation queues behind it), the error names the waited-for one with the owner's note, and the
// executor fails with the reason.
TEST_CASE("a wait past its deadline cuts short the running operation and fails the executor") {
  RecordingOwner owner;
  OrderedExecutor executor(kDefaultTimeout, owner);
  std::atomic<bool> queued_ran{false};
  auto running = submit(executor, [&](uint64_t) {
    const bool cut = owner.gate.wait();
    return OpResult{Outcome::kCommError, cut ? "op #0 aborted" : "op #0 never cut short"};
  });
  auto queued = submit(executor, [&](uint64_t) {
    queued_ran = true;
    return OpResult{};
  });
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH_AS(queued->wait(50ms),
                       "op #1 did not complete within 50 ms (note on #1); the communicator is aborted",
                       TimeoutError);
  CHECK(std::chrono::steady_clock::now() - t0 < 5s);
  const std::string reason = "op #1 was given up on after 50 ms (the caller's deadline)";
  CHECK(owner.reasons() == std::vector<std::string>{reason});
  CHECK_THROWS_WITH_AS(running->wait(), "op #0 aborted", CommError);
  CHECK_THROWS_WITH_AS(queued->wait(), ("op #1 not run: communicator failed earlier: " + reason).c_str(), CommError);
  CHECK_FALSE(queued_ran);
  CHECK_THROWS_WITH_AS(submit(executor, [](uint64_t) { return OpResult{}; }),
                       ("op #2 rejected: communicator failed earlier: " + reason).c_str(), CommError);
}

TEST_CASE("shutdown fails queued operations, cuts short the running one and waits for it") {
  RecordingOwner owner;
  auto executor = std::make_unique<OrderedExecutor>(kDefaultTimeout, owner);
  std::atomic<bool> started{false}, finished{false}, queued_ran{false};
  auto running = submit(*executor, [&](uint64_t) {
    started = true;
    owner.gate.wait();
    std::this_thread::sleep_for(50ms);
    finished = true;
    return OpResult{};
  });
  std::vector<WorkHandle> queued;
  for (int i = 0; i < 3; ++i) {
    queued.push_back(submit(*executor, [&](uint64_t) {
      queued_ran = true;
      return OpResult{};
    }));
  }
  while (!started) std::this_thread::sleep_for(1ms);
  executor->shutdown();
  CHECK(finished);  // waited for
  CHECK(owner.reasons() == std::vector<std::string>{"the communicator was destroyed while it ran"});
  executor.reset();
  // The handles outlive the executor.
  running->wait();
  for (int i = 0; i < 3; ++i) {
    CHECK_THROWS_WITH_AS(queued[i]->wait(),
                         ("op #" + std::to_string(i + 1) + " not run: communicator failed earlier: communicator destroyed").c_str(),
                         CommError);
  }
  CHECK_FALSE(queued_ran);
}

TEST_CASE("shutdown with nothing running cuts nothing short, is idempotent, and rejects later calls") {
  RecordingOwner owner;
  OrderedExecutor executor(kDefaultTimeout, owner);
  submit(executor, [](uint64_t) { return OpResult{}; })->wait();
  executor.shutdown();
  executor.shutdown();
  CHECK(owner.reasons().empty());
  CHECK_THROWS_WITH_AS(submit(executor, [](uint64_t) { return OpResult{}; }), "op #1 rejected: communicator destroyed",
                       CommError);
}

}  // namespace zero::comm
