// ThreadPool: every index runs once per run(), on distinct threads, repeatedly; exceptions propagate.
#include "optim/thread_pool.h"

#include <doctest/doctest.h>

#include <atomic>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "base/error.h"

namespace zero::optim {
namespace {

TEST_CASE("each index once per run, many runs") {
  for (int threads : {1, 2, 5}) {
    ThreadPool pool(threads);
    CHECK(pool.size() == threads);
    std::vector<std::atomic<int>> counts(static_cast<size_t>(threads));
    for (int r = 0; r < 500; ++r) {
      pool.run([&](int i) { counts[static_cast<size_t>(i)].fetch_add(1); });
    }
    for (auto& c : counts) CHECK(c.load() == 500);
  }
}

TEST_CASE("index 0 runs on the caller, the others on distinct threads") {
  ThreadPool pool(4);
  std::vector<std::thread::id> ids(4);
  pool.run([&](int i) { ids[static_cast<size_t>(i)] = std::this_thread::get_id(); });
  CHECK(ids[0] == std::this_thread::get_id());
  CHECK(std::set<std::thread::id>(ids.begin(), ids.end()).size() == 4);
}

TEST_CASE("an exception in any call is rethrown after all calls finish; the pool stays usable") {
  ThreadPool pool(3);
  std::atomic<int> finished{0};
  CHECK_THROWS_AS(pool.run([&](int i) {
                    finished.fetch_add(1);
                    if (i == 2) throw std::runtime_error("boom");
                  }),
                  std::runtime_error);
  CHECK(finished.load() == 3);
  CHECK_THROWS_AS(pool.run([](int i) {
                    if (i == 0) throw std::logic_error("caller");
                  }),
                  std::logic_error);
  std::atomic<int> ok{0};
  pool.run([&](int) { ok.fetch_add(1); });
  CHECK(ok.load() == 3);
}

TEST_CASE("invalid size") { CHECK_THROWS_AS(ThreadPool(0), InvalidArgument); }

}  // namespace
}  // namespace zero::optim
