// Buffer from allocate_host and allocate_pinned: alignment, zero fill, tracking at the right
// location, moves, zero-byte buffers, and impossible allocations that throw AllocationError naming
// the size and category without touching the tracker.
#include "memory/buffer.h"

#include <doctest/doctest.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <utility>

#include "base/error.h"
#include "memory/tracker.h"

namespace zero::memory {
namespace {

bool aligned(const void* p, size_t alignment) {
  return reinterpret_cast<uintptr_t>(p) % alignment == 0;
}

bool all_zero(const void* p, size_t bytes) {
  const auto* b = static_cast<const unsigned char*>(p);
  for (size_t i = 0; i < bytes; ++i) {
    if (b[i] != 0) return false;
  }
  return true;
}

Location device_of(PinnedKind kind) {
  return kind == PinnedKind::kPageable ? Location::host() : Location::pinned_host();
}

// The whole global tracker state for one category, to show that a failed allocation changed nothing.
struct Snapshot {
  Usage host, pinned, all;
  uint64_t total, peak;
  explicit Snapshot(Category c)
      : host(MemoryTracker::global().usage(c, Location::host())),
        pinned(MemoryTracker::global().usage(c, Location::pinned_host())),
        all(MemoryTracker::global().usage(c)),
        total(MemoryTracker::global().current_total()),
        peak(MemoryTracker::global().peak_total()) {}
  bool operator==(const Snapshot& o) const {
    auto same = [](const Usage& a, const Usage& b) {
      return a.current == b.current && a.peak == b.peak && a.allocations == b.allocations;
    };
    return same(host, o.host) && same(pinned, o.pinned) && same(all, o.all) && total == o.total &&
           peak == o.peak;
  }
};

// Runs `allocate`, which must throw AllocationError whose message contains every one of `needles`,
// and checks that the tracker is unchanged for `category`.
template <typename F>
void check_refused(F allocate, Category category, std::initializer_list<std::string> needles) {
  const Snapshot before(category);
  std::string message;
  try {
    allocate();
    FAIL("no AllocationError");
  } catch (const AllocationError& e) {
    message = e.what();
  }
  INFO(message);
  for (const std::string& n : needles) CHECK(message.find(n) != std::string::npos);
  CHECK(Snapshot(category) == before);
}

TEST_CASE("checked_bytes") {
  CHECK(checked_bytes(0, DType::kFloat32, Category::kParams) == 0);
  CHECK(checked_bytes(10, DType::kFloat16, Category::kParams) == 20);
  CHECK(checked_bytes(3, DType::kFloat64, Category::kParams) == 24);
  CHECK(checked_bytes(int64_t{1} << 61, DType::kFloat32, Category::kParams) ==
        size_t{1} << 63);
  CHECK_THROWS_AS(checked_bytes(-1, DType::kFloat32, Category::kParams), AllocationError);
  CHECK_THROWS_AS(checked_bytes(int64_t{1} << 62, DType::kFloat32, Category::kParams),
                  AllocationError);
}

TEST_CASE("allocate_host is 64-byte aligned, zero-filled and tracked") {
  MemoryTracker& g = MemoryTracker::global();
  for (size_t bytes : {size_t{1}, size_t{63}, size_t{64}, size_t{65}, size_t{4096},
                       size_t{(1 << 20) + 3}}) {
    CAPTURE(bytes);
    const Usage before = g.usage(Category::kGrads, Location::host());
    {
      Buffer b = allocate_host(bytes, Category::kGrads);
      REQUIRE(b.data() != nullptr);
      CHECK(b.size_bytes() == bytes);
      CHECK(b.category() == Category::kGrads);
      CHECK(b.location() == Location::host());
      CHECK(aligned(b.data(), kHostAlignment));
      CHECK(all_zero(b.data(), bytes));
      std::memset(b.data(), 0xab, bytes);  // the whole size is writable (ASan checks the bounds)
      const Usage during = g.usage(Category::kGrads, Location::host());
      CHECK(during.current == before.current + bytes);
      CHECK(during.allocations == before.allocations + 1);
    }
    const Usage after = g.usage(Category::kGrads, Location::host());
    CHECK(after.current == before.current);
    CHECK(after.allocations == before.allocations);
  }
}

TEST_CASE("allocate_host_elements, as and span") {
  Buffer b = allocate_host_elements(10, DType::kFloat32, Category::kParams);
  CHECK(b.size_bytes() == 40);
  auto s = b.span<float>();
  CHECK(s.size() == 10);
  for (size_t i = 0; i < s.size(); ++i) s[i] = static_cast<float>(i);
  CHECK(b.as<float>()[9] == 9.0f);
  const Buffer& cb = b;
  CHECK(cb.as<float>()[3] == 3.0f);
}

TEST_CASE("zero-byte and default buffers hold nothing and are not tracked") {
  const Snapshot before(Category::kOther);
  Buffer empty;
  CHECK(empty.data() == nullptr);
  CHECK(empty.size_bytes() == 0);
  CHECK(empty.empty());
  Buffer zero = allocate_host(0, Category::kOther);
  CHECK(zero.data() == nullptr);
  CHECK(zero.size_bytes() == 0);
  Buffer none = allocate_host_elements(0, DType::kFloat16, Category::kOther);
  CHECK(none.data() == nullptr);
  Buffer pinned = allocate_pinned(0, Category::kOther);
  CHECK(pinned.data() == nullptr);
  CHECK(pinned.size_bytes() == 0);
  Buffer pinned_none = allocate_pinned_elements(0, DType::kFloat32, Category::kOther);
  CHECK(pinned_none.data() == nullptr);
  CHECK(Snapshot(Category::kOther) == before);
  Buffer moved = std::move(zero);
  CHECK(moved.data() == nullptr);
  CHECK(Snapshot(Category::kOther) == before);
}

TEST_CASE("Buffer moves transfer ownership and count once") {
  MemoryTracker& g = MemoryTracker::global();
  const uint64_t base = g.usage(Category::kCommBuffer, Location::host()).current;
  const uint64_t base_count = g.usage(Category::kCommBuffer, Location::host()).allocations;
  auto current = [&] { return g.usage(Category::kCommBuffer, Location::host()).current - base; };
  auto count = [&] { return g.usage(Category::kCommBuffer, Location::host()).allocations - base_count; };
  {
    Buffer a = allocate_host(1000, Category::kCommBuffer);
    void* p = a.data();
    Buffer b(std::move(a));
    CHECK(b.data() == p);
    CHECK(b.size_bytes() == 1000);
    CHECK(a.data() == nullptr);  // NOLINT(bugprone-use-after-move): moved-from state is specified
    CHECK(a.size_bytes() == 0);
    CHECK(current() == 1000);
    CHECK(count() == 1);

    Buffer c = allocate_host(300, Category::kCommBuffer);
    CHECK(current() == 1300);
    c = std::move(b);  // c's 300 bytes are freed, b's 1000 move over
    CHECK(c.data() == p);
    CHECK(b.data() == nullptr);  // NOLINT(bugprone-use-after-move)
    CHECK(current() == 1000);
    CHECK(count() == 1);

    Buffer& alias = c;
    c = std::move(alias);  // self-move keeps the buffer
    CHECK(c.data() == p);
    CHECK(current() == 1000);

    a = allocate_host(64, Category::kCommBuffer);  // a moved-from buffer is reusable
    CHECK(current() == 1064);
    CHECK(count() == 2);
  }
  CHECK(current() == 0);
  CHECK(count() == 0);
}

TEST_CASE("allocate_pinned is aligned, zero-filled, tracked by kind, and moves count once") {
  MemoryTracker& g = MemoryTracker::global();
  const long page = sysconf(_SC_PAGESIZE);
  REQUIRE(page > 0);
  for (size_t bytes : {size_t{1}, size_t{100}, size_t{4096}, size_t{65536 + 5}}) {
    CAPTURE(bytes);
    PinnedKind kind = PinnedKind::kCudaHost;
    Buffer b = allocate_pinned(bytes, Category::kOffloadHost, g, &kind);
    REQUIRE(b.data() != nullptr);
    INFO("kind " << pinned_kind_name(kind));
    CHECK(b.size_bytes() == bytes);
    CHECK(aligned(b.data(), 64));
    if (kind != PinnedKind::kPageable) {
      CHECK(aligned(b.data(), static_cast<size_t>(page)));
    }
    if (cuda_device_available()) {
      CHECK(kind == PinnedKind::kCudaHost);
    } else {
      CHECK(kind != PinnedKind::kCudaHost);
    }
    CHECK(all_zero(b.data(), bytes));
    std::memset(b.data(), 0x5a, bytes);

    const Location d = device_of(kind);
    CHECK(b.location() == d);
    const Usage before = g.usage(Category::kOffloadHost, d);
    const void* p = b.data();
    {
      Buffer moved(std::move(b));
      CHECK(moved.data() == p);
      CHECK(moved.location() == d);
      CHECK(moved.size_bytes() == bytes);
      CHECK(b.data() == nullptr);  // NOLINT(bugprone-use-after-move)
      CHECK(g.usage(Category::kOffloadHost, d).current == before.current);
      Buffer other = allocate_pinned(16, Category::kOffloadHost);
      other = std::move(moved);
      CHECK(other.data() == p);
      CHECK(g.usage(Category::kOffloadHost, d).current == before.current);
      CHECK(g.usage(Category::kOffloadHost, d).allocations == before.allocations);
    }
    CHECK(g.usage(Category::kOffloadHost, d).current == before.current - bytes);
    CHECK(g.usage(Category::kOffloadHost, d).allocations == before.allocations - 1);
  }
  CHECK(std::string(pinned_kind_name(PinnedKind::kCudaHost)) == "cuda_host");
  CHECK(std::string(pinned_kind_name(PinnedKind::kLocked)) == "locked");
  CHECK(std::string(pinned_kind_name(PinnedKind::kPageable)) == "pageable");
}

TEST_CASE("impossible allocations throw AllocationError naming size and category") {
  const size_t huge = size_t{1} << 62;
  check_refused([&] { allocate_host(huge, Category::kParams); }, Category::kParams,
                {"4611686018427387904", "params"});
  check_refused([&] { allocate_pinned(huge, Category::kOffloadHost); }, Category::kOffloadHost,
                {"4611686018427387904", "offload_host"});
  // Rounding up to the alignment would overflow.
  const size_t max = std::numeric_limits<size_t>::max();
  check_refused([&] { allocate_host(max, Category::kGatherWindow); }, Category::kGatherWindow,
                {std::to_string(max), "gather_window"});
  check_refused([&] { allocate_pinned(max - 1, Category::kGatherWindow); }, Category::kGatherWindow,
                {std::to_string(max - 1), "gather_window"});
  // Negative element counts.
  check_refused([] { allocate_host_elements(-1, DType::kFloat32, Category::kGrads); },
                Category::kGrads, {"-1", "grads"});
  check_refused([] { allocate_pinned_elements(-7, DType::kBFloat16, Category::kGrads); },
                Category::kGrads, {"-7", "grads"});
  // count * dtype size overflows.
  const int64_t too_many = std::numeric_limits<int64_t>::max();
  check_refused(
      [&] { allocate_host_elements(too_many, DType::kFloat32, Category::kOptimizerState); },
      Category::kOptimizerState, {std::to_string(too_many), "optimizer_state"});
  check_refused(
      [&] { allocate_pinned_elements(int64_t{1} << 62, DType::kFloat64, Category::kMasterParams); },
      Category::kMasterParams, {"4611686018427387904", "master_params"});
  // Within size_t but not satisfiable.
  check_refused(
      [&] { allocate_host_elements(int64_t{1} << 60, DType::kFloat32, Category::kMasterParams); },
      Category::kMasterParams, {"4611686018427387904", "master_params"});
}

TEST_CASE("cuda_device_available") {
#ifdef ZERO_WITH_CUDA
  // Either answer is valid in a CUDA build; it must not throw and must be stable.
  const bool first = cuda_device_available();
  CHECK(cuda_device_available() == first);
#else
  CHECK_FALSE(cuda_device_available());
#endif
}

}  // namespace
}  // namespace zero::memory
