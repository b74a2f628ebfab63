// The deferred schedule check's ledger: equal digests exactly for the same calls in the same order;
// a mismatch found among the recent records named with both calls (a different call, a call one
// rank did not issue, a divergence older than the records kept); and the comparison through a store
// on ranks as threads, naming a rank that never publishes.
#include "comm/schedule_ledger.h"

#include <doctest/doctest.h>

#include <string>
#include <thread>
#include <vector>

#include "comm/store/memory_store.h"

namespace zero::comm {
namespace {

// `n` calls: all-reduces of 1024 floats, except call `odd` (if any), an all-gather of 512.
ScheduleLedger calls(uint64_t n, uint64_t odd = UINT64_MAX, size_t history = 256) {
  ScheduleLedger l(history);
  for (uint64_t seq = 0; seq < n; ++seq) {
    l.record(seq == odd ? make_call(seq, CollectiveKind::kAllGather, DType::kFloat32, 512)
                        : make_reduce_call(seq, CollectiveKind::kAllReduce, DType::kFloat32, 1024, ReduceOp::kSum));
  }
  return l;
}

TEST_CASE("the digest is equal exactly for the same calls in the same order") {
  CHECK(calls(10).digest() == calls(10).digest());
  CHECK(calls(10).calls() == 10);
  CHECK(calls(10, 5).digest() != calls(10).digest());
  CHECK(calls(9).digest() != calls(10).digest());
  ScheduleLedger a = calls(3);
  a.mark();
  CHECK(a.digest() == ScheduleLedger().digest());
  CHECK(a.calls() == 0);
  CHECK(a.recent().size() == 3);  // the records stay for a later diagnosis
}

TEST_CASE("the first differing call is named with both ranks' calls") {
  CHECK(find_ledger_mismatch({calls(10).recent(), calls(10).recent(), calls(10).recent()}).empty());
  CHECK(find_ledger_mismatch({calls(10).recent(), calls(10).recent(), calls(10, 5).recent()}) ==
        "schedule mismatch: rank 0 called all_reduce(fp32, 1024, sum) #5 but rank 2 called all_gather(fp32, 512) #5");
  // One rank issued a call more (the others are hung waiting for a partner, or finished).
  CHECK(find_ledger_mismatch({calls(10).recent(), calls(11).recent()}) ==
        "schedule mismatch: rank 1 called all_reduce(fp32, 1024, sum) #10 but rank 0 issued no call #10");
  // The difference is older than the 4 calls each keeps.
  CHECK(find_ledger_mismatch({calls(10, 2, 4).recent(), calls(10, UINT64_MAX, 4).recent()}).empty());
  CHECK(find_ledger_mismatch({calls(12, 2, 4).recent(), calls(10, UINT64_MAX, 4).recent()}).find("rank 1 issued no call #10") !=
        std::string::npos);
}

TEST_CASE("through a store: every rank gets the same message; a rank that never publishes is named") {
  MemoryStore store;
  std::vector<std::string> got(3);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 3; ++r) {
    ranks.emplace_back([&, r] {
      got[static_cast<size_t>(r)] =
          compare_through_store(store, "check/1", r, 3, calls(8, r == 1 ? 3 : UINT64_MAX), std::chrono::seconds(10));
    });
  }
  for (std::thread& t : ranks) t.join();
  for (const std::string& g : got) {
    CHECK(g == "schedule mismatch: rank 0 called all_reduce(fp32, 1024, sum) #3 but rank 1 called all_gather(fp32, 512) #3");
  }
  // Rank 2 never comes.
  const std::string alone = compare_through_store(store, "check/2", 0, 3, calls(8), std::chrono::milliseconds(50));
  CHECK(alone == "rank(s) 1, 2 did not publish their calls within 50 ms");
}

}  // namespace
}  // namespace zero::comm
