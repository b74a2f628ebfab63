// check_agreement with three ranks as threads: agreement passes; a differing entry, a missing entry
// and a local error are reported on every rank, naming the entry and the ranks.
#include "zero/rank_agreement.h"

#include <doctest/doctest.h>

#include <mutex>
#include <string>
#include <vector>

#include "base/error.h"
#include "testing/thread_ranks.h"

namespace zero {
namespace {

// Runs check_agreement on 3 ranks with entries(rank) / error(rank); returns each rank's error ("" if
// it passed).
std::vector<std::string> run(const std::function<std::vector<AgreementEntry>(int)>& entries,
                             const std::function<std::string(int)>& error) {
  std::vector<std::string> out(3);
  std::mutex mu;
  testing::run_thread_ranks(3, [&](comm::Communicator& c) {
    std::string e;
    try {
      check_agreement(c, {.what = "widget setup", .verb = "has"}, entries(c.rank()), error(c.rank()),
                      std::chrono::seconds(20));
    } catch (const InvalidArgument& x) {
      e = x.what();
    }
    std::lock_guard<std::mutex> lock(mu);
    out[static_cast<size_t>(c.rank())] = e;
  });
  return out;
}

std::string no_error(int) { return ""; }

}  // namespace

TEST_CASE("ranks that agree pass") {
  for (const std::string& e : run([](int) { return std::vector<AgreementEntry>{{"a", "1"}, {"b", "x y"}}; }, no_error)) {
    CHECK(e.empty());
  }
}

TEST_CASE("a differing entry is named on every rank, with every differing rank") {
  const auto errors = run(
      [](int r) {
        return std::vector<AgreementEntry>{{"a", "1"}, {"b", r == 0 ? "2" : "3"}, {"c", "4"}};
      },
      no_error);
  for (const std::string& e : errors) {
    CAPTURE(e);
    CHECK(e.find("widget setup differs across ranks (ranks differing from rank 0: 1, 2)") != std::string::npos);
    CHECK(e.find("b: rank 0 has 2 but rank 1 has 3") != std::string::npos);
  }
}

TEST_CASE("a missing entry and a local error are reported on every rank") {
  for (const std::string& e : run(
           [](int r) {
             std::vector<AgreementEntry> v{{"a", "1"}};
             if (r != 2) v.push_back({"b", "2"});
             return v;
           },
           no_error)) {
    CHECK(e.find("rank 0 has 2 entries, rank 2 only 1; first missing: b 2") != std::string::npos);
  }
  for (const std::string& e : run([](int) { return std::vector<AgreementEntry>{{"a", "1"}}; },
                                  [](int r) { return r == 1 ? std::string("widget 7 is broken") : ""; })) {
    CHECK(e.find("widget setup failed on some ranks:\n  rank 1: widget 7 is broken") != std::string::npos);
  }
}

}  // namespace zero
