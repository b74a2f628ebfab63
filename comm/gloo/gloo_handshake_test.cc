// connect_and_handshake with every rank as a thread of this process over one MemoryStore: ranks
// that agree get a connected context; a difference in the schedule check or in any of the three
// message sizes fails every rank with both values and the other rank named; a rank that never comes
// fails the others within the timeout.
#include "comm/gloo/gloo_handshake.h"

#include <doctest/doctest.h>

#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "base/error.h"
#include "comm/store/memory_store.h"

namespace zero::comm {
namespace {

using namespace std::chrono_literals;

struct RankResult {
  bool connected = false;
  int rank = -1, size = -1;
  std::string error;  // a CommError's message
};

// Every rank calls connect_and_handshake with options configure(rank, options) and check(rank).
std::vector<RankResult> meet(int size, const std::function<void(int, GlooOptions&)>& configure,
                             const std::function<bool(int)>& check = [](int) { return true; }) {
  auto store = std::make_shared<MemoryStore>();
  std::vector<RankResult> results(static_cast<size_t>(size));
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      GlooOptions o;
      o.timeout = 10s;
      configure(r, o);
      try {
        auto ctx = connect_and_handshake(store, "gloo/0", r, size, o, check(r));
        results[r].connected = ctx != nullptr;
        results[r].rank = ctx->rank;
        results[r].size = ctx->size;
      } catch (const CommError& e) {
        results[r].error = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return results;
}

}  // namespace

TEST_CASE("ranks that agree get a connected context") {
  const auto results = meet(3, [](int, GlooOptions&) {});
  for (int r = 0; r < 3; ++r) {
    CAPTURE(r);
    CHECK(results[r].error.empty());
    CHECK(results[r].connected);
    CHECK(results[r].rank == r);
    CHECK(results[r].size == 3);
  }
}

TEST_CASE("a different schedule check setting fails every rank, naming both settings") {
  const auto results = meet(2, [](int, GlooOptions&) {}, [](int r) { return r == 0; });
  CHECK(results[0].error ==
        "gloo rank 0: schedule check is on here but off on rank 1 (set ZERO_COMM_CHECK and "
        "GlooOptions.check_schedule the same on every rank)");
  CHECK(results[1].error ==
        "gloo rank 1: schedule check is off here but on on rank 0 (set ZERO_COMM_CHECK and "
        "GlooOptions.check_schedule the same on every rank)");
}

TEST_CASE("a different message size fails every rank, naming both sets of sizes") {
  struct Case {
    const char* field;
    std::function<void(GlooOptions&)> change;
    const char* here_rank0;
    const char* there_rank1;
  };
  const std::vector<Case> cases = {
      {"segment_bytes", [](GlooOptions& o) { o.segment_bytes = 1024; }, "524288/524288/262144",
       "1024/524288/262144"},
      {"gather_segment_bytes", [](GlooOptions& o) { o.gather_segment_bytes = 1024; },
       "524288/524288/262144", "524288/1024/262144"},
      {"eager_bytes", [](GlooOptions& o) { o.eager_bytes = 1024; }, "524288/524288/262144",
       "524288/524288/1024"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.field);
    const auto results = meet(2, [&](int r, GlooOptions& o) {
      if (r == 1) c.change(o);
    });
    CHECK(results[0].error ==
          std::string("gloo rank 0: GlooOptions segment_bytes/gather_segment_bytes/eager_bytes are ") +
              c.here_rank0 + " here but " + c.there_rank1 + " on rank 1 (they must match on every rank)");
    CHECK(results[1].error ==
          std::string("gloo rank 1: GlooOptions segment_bytes/gather_segment_bytes/eager_bytes are ") +
              c.there_rank1 + " here but " + c.here_rank0 + " on rank 0 (they must match on every rank)");
  }
}

TEST_CASE("a rank that never comes fails the others within the timeout") {
  auto store = std::make_shared<MemoryStore>();
  GlooOptions o;
  o.timeout = 300ms;
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_THROWS_AS(connect_and_handshake(store, "gloo/0", 0, 2, o, true), Error);
  CHECK(std::chrono::steady_clock::now() - t0 < 5s);
}

}  // namespace zero::comm
