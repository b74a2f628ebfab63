// FailureReport on an in-memory store: the ranks that never reported are named, a rank that failed
// at an earlier collective is named as having failed first, a report that arrives within the grace
// is counted, only a rank's first failure stays, and a store that fails before any poll is said to
// have failed, never thrown.
#include "comm/gloo/failure_report.h"

#include <doctest/doctest.h>

#include <chrono>
#include <memory>
#include <stdexcept>
#include <thread>

#include "comm/store/memory_store.h"

namespace zero::comm {
namespace {

using namespace std::chrono_literals;

FailureReport report(const std::shared_ptr<Store>& store, int rank, std::chrono::milliseconds grace = 200ms) {
  return FailureReport(store, "gloo/0", rank, 3, grace);
}

// A store whose every call fails (its host rank has exited).
class LostStore final : public MemoryStore {
 public:
  Bytes compare_set(const std::string&, const Bytes&, const Bytes&) override {
    throw std::runtime_error("connection to the server lost");
  }
};

}  // namespace

TEST_CASE("the silent ranks are named; a rank that reports an earlier collective failed first") {
  auto store = std::make_shared<MemoryStore>();
  const auto t0 = std::chrono::steady_clock::now();
  CHECK(report(store, 2).absent_ranks(11) == " (ranks 0, 1 did not reach it: exited, stalled, or stuck before it)");
  CHECK(std::chrono::steady_clock::now() - t0 >= 200ms);  // waited the grace for them
  // Rank 0 reports later, from the collective before: it failed first; rank 1 stays silent.
  CHECK(report(store, 0).absent_ranks(10) == " (rank 1 did not reach it: exited, stalled, or stuck before it)");
  CHECK(report(store, 2).absent_ranks(11, "; this rank was waiting for rank 1's data") ==
        " (rank 1 did not reach it: exited, stalled, or stuck before it; rank 0 failed first, in #10; this rank was "
        "waiting for rank 1's data)");
}

TEST_CASE("a report that arrives within the grace is counted, and the poll ends when every rank reported") {
  auto store = std::make_shared<MemoryStore>();
  std::thread late([&] {
    std::this_thread::sleep_for(100ms);
    report(store, 1, 1ms).absent_ranks(4);  // records its failure, polls once
    report(store, 2, 1ms).absent_ranks(4);
  });
  const auto t0 = std::chrono::steady_clock::now();
  CHECK(report(store, 0, 10s).absent_ranks(4) == " (every rank reached it)");
  CHECK(std::chrono::steady_clock::now() - t0 < 5s);
  late.join();
}

TEST_CASE("only a rank's first failure stays") {
  auto store = std::make_shared<MemoryStore>();
  report(store, 1, 1ms).absent_ranks(5);
  report(store, 1, 1ms).absent_ranks(8);
  report(store, 2, 1ms).absent_ranks(8);
  CHECK(report(store, 0, 50ms).absent_ranks(8) == " (rank 1 failed first, in #5)");
}

TEST_CASE("one rank, no grace, or a lost store: no report, and nothing thrown") {
  auto store = std::make_shared<MemoryStore>();
  CHECK(FailureReport(store, "p", 0, 1, 1s).absent_ranks(3).empty());
  CHECK(report(store, 0, 0ms).absent_ranks(3).empty());
  CHECK(report(std::make_shared<LostStore>(), 0).absent_ranks(3) ==
        " (the store could not tell which ranks reached it: connection to the server lost)");
}

}  // namespace zero::comm
