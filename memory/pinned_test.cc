// allocate_pinned's fallback order without a CUDA device: pages are locked (mlock) while RLIMIT_MEMLOCK
// leaves room, else the buffer is pageable and ONE warning is logged per process. The soft limit is
// lowered for the test (always permitted) so the outcome does not depend on the machine's limit.
//
// Kept in its own binary, first test case, so that no earlier fallback has used up the one warning.
#include <doctest/doctest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "base/logging.h"
#include "memory/buffer.h"
#include "memory/tracker.h"

namespace zero::memory {
namespace {

// VmLck from /proc/self/status in bytes (-1 if unreadable, or meaningless: ASan and TSan intercept
// mlock and make it a successful no-op).
int64_t locked_bytes() {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)  // GCC's spelling
  return -1;
#endif
#if defined(__clang__)  // clang's (GCC 12's preprocessor cannot parse __has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
  return -1;
#endif
#endif
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("VmLck:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  }
  return -1;
}

size_t count(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

// Lowers the soft RLIMIT_MEMLOCK for a scope and restores it.
class MemlockLimit {
 public:
  explicit MemlockLimit(rlim_t soft) {
    REQUIRE(getrlimit(RLIMIT_MEMLOCK, &saved_) == 0);
    rlimit lowered = saved_;
    lowered.rlim_cur = std::min(soft, saved_.rlim_max);
    REQUIRE(setrlimit(RLIMIT_MEMLOCK, &lowered) == 0);
    soft_ = lowered.rlim_cur;
  }
  ~MemlockLimit() { setrlimit(RLIMIT_MEMLOCK, &saved_); }
  rlim_t soft() const { return soft_; }

 private:
  rlimit saved_{};
  rlim_t soft_ = 0;
};

// Captures the library logger's output for a scope at level warn.
class LogCapture {
 public:
  LogCapture() : sink_(std::make_shared<spdlog::sinks::ostream_sink_mt>(out_)) {
    level_ = logger().level();
    logger().set_level(spdlog::level::warn);
    logger().sinks().push_back(sink_);
  }
  ~LogCapture() {
    auto& sinks = logger().sinks();
    sinks.erase(std::remove(sinks.begin(), sinks.end(), sink_), sinks.end());
    logger().set_level(level_);
  }
  std::string text() const { return out_.str(); }

 private:
  std::ostringstream out_;
  std::shared_ptr<spdlog::sinks::ostream_sink_mt> sink_;
  spdlog::level::level_enum level_;
};

TEST_CASE("pinned fallback: locked within RLIMIT_MEMLOCK, else pageable with one warning") {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  MemoryTracker& g = MemoryTracker::global();
  LogCapture log;
  MemlockLimit limit(16 * page);

  if (cuda_device_available()) {
    PinnedKind kind = PinnedKind::kPageable;
    Buffer big = allocate_pinned(1 << 20, Category::kOffloadHost, g, &kind);
    CHECK(kind == PinnedKind::kCudaHost);
    CHECK(count(log.text(), "pinned memory unavailable") == 0);
    return;
  }

  const Usage pinned_before = g.usage(Category::kOffloadHost, Location::pinned_host());
  const Usage host_before = g.usage(Category::kOffloadHost, Location::host());
  const int64_t vm_locked_before = locked_bytes();

  {
    // Fits under the lowered limit (if the hard limit allows even that much).
    PinnedKind small_kind = PinnedKind::kCudaHost;
    Buffer small = allocate_pinned(page + 1, Category::kOffloadHost, g, &small_kind);
    if (limit.soft() >= 2 * page) {
      REQUIRE(small_kind == PinnedKind::kLocked);
      CHECK(small.location() == Location::pinned_host());
      CHECK(reinterpret_cast<uintptr_t>(small.data()) % page == 0);
      CHECK(g.usage(Category::kOffloadHost, Location::pinned_host()).current ==
            pinned_before.current + page + 1);
      if (vm_locked_before >= 0) CHECK(locked_bytes() >= vm_locked_before + int64_t(2 * page));
    }

    // Beyond the limit: pageable, reported as host memory, and one warning for both.
    PinnedKind kind1 = PinnedKind::kCudaHost, kind2 = PinnedKind::kCudaHost;
    Buffer big1 = allocate_pinned(1 << 20, Category::kOffloadHost, g, &kind1);
    Buffer big2 = allocate_pinned(1 << 20, Category::kOffloadHost, g, &kind2);
    CHECK(kind1 == PinnedKind::kPageable);
    CHECK(kind2 == PinnedKind::kPageable);
    CHECK(big1.location() == Location::host());
    CHECK(reinterpret_cast<uintptr_t>(big1.data()) % 64 == 0);
    CHECK(g.usage(Category::kOffloadHost, Location::host()).current ==
          host_before.current + (2u << 20));
    const std::string text = log.text();
    INFO(text);
    CHECK(count(text, "pinned memory unavailable") == 1);
    CHECK(count(text, "RLIMIT_MEMLOCK") == 1);
  }
  CHECK(g.usage(Category::kOffloadHost, Location::pinned_host()).current == pinned_before.current);
  CHECK(g.usage(Category::kOffloadHost, Location::host()).current == host_before.current);
  if (vm_locked_before >= 0) CHECK(locked_bytes() == vm_locked_before);

  // Freed locked pages count against the limit no more: the full limit can be locked again.
  if (limit.soft() >= 2 * page) {
    PinnedKind again_kind = PinnedKind::kCudaHost, one_more_kind = PinnedKind::kCudaHost;
    Buffer again = allocate_pinned(limit.soft(), Category::kOffloadHost, g, &again_kind);
    CHECK(again_kind == PinnedKind::kLocked);
    Buffer one_more = allocate_pinned(1, Category::kOffloadHost, g, &one_more_kind);
    CHECK(one_more_kind == PinnedKind::kPageable);
  }
  CHECK(count(log.text(), "pinned memory unavailable") == 1);
}

TEST_CASE("locked pinned buffers under concurrent allocation stay within the limit") {
  if (cuda_device_available()) return;  // cudaHostAlloc path: covered by the case above
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  MemlockLimit limit(32 * page);
  if (limit.soft() < 32 * page) return;  // the hard limit is too low to say anything here
  // 8 threads each hold 8 one-page buffers at once: 64 pages wanted, 32 allowed.
  std::vector<std::vector<Buffer>> held(8);
  std::vector<std::vector<PinnedKind>> kinds(8, std::vector<PinnedKind>(8, PinnedKind::kCudaHost));
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&held, &kinds, t, page] {
      for (size_t i = 0; i < 8; ++i) {
        held[t].push_back(allocate_pinned(page, Category::kOther, MemoryTracker::global(), &kinds[t][i]));
      }
    });
  }
  for (auto& th : threads) th.join();
  size_t locked = 0, pinned_location = 0;
  for (int t = 0; t < 8; ++t) {
    for (size_t i = 0; i < 8; ++i) {
      locked += kinds[t][i] == PinnedKind::kLocked;
      pinned_location += held[t][i].location() == Location::pinned_host();
    }
  }
  CHECK(pinned_location == 32);
  CHECK(locked == 32);
}

}  // namespace
}  // namespace zero::memory
