// BufferCache: exact sizes, reuse of the same size, the total held never above the live peak (as
// the tracker reports it), and stream order on reuse (threaded streams: TSan checks the edge).
#include <doctest/doctest.h>

#include <chrono>
#include <cstring>

#include "memory/buffer_cache.h"
#include "memory/device.h"
#include "memory/tracker.h"

namespace zero::memory {
namespace {

TEST_CASE("buffers of exact sizes, reused by size, never more than the live peak") {
  MemoryTracker tracker;
  auto device = make_host_device(tracker);
  Stream& s = device->compute_stream();
  BufferCache cache(*device, Category::kGatherWindow);
  auto held = [&] { return tracker.usage(Category::kGatherWindow).current; };

  Buffer big = cache.take(1000, s);
  Buffer small = cache.take(10, s);
  CHECK(big.size_bytes() == 1000);
  CHECK(small.size_bytes() == 10);
  CHECK(cache.live_bytes() == 1010);
  CHECK(held() == 1010);
  void* big_data = big.data();
  cache.give(std::move(big), s);
  cache.give(std::move(small), s);
  CHECK(cache.live_bytes() == 0);
  CHECK(cache.cached_bytes() == 1010);

  // The same size comes back without an allocation.
  Buffer again = cache.take(1000, s);
  CHECK(again.data() == big_data);
  CHECK(cache.allocations() == 2);
  cache.give(std::move(again), s);

  // A new size frees cached buffers, oldest given first, so the total stays within the peak (1010).
  Buffer mid = cache.take(500, s);
  CHECK(cache.allocations() == 3);
  CHECK(cache.live_bytes() + cache.cached_bytes() <= cache.peak_live_bytes());
  CHECK(held() == cache.live_bytes() + cache.cached_bytes());
  CHECK(tracker.usage(Category::kGatherWindow).peak <= 1010);
  cache.give(std::move(mid), s);

  // A pattern that repeats allocates nothing after its first round.
  const size_t before = cache.allocations();
  for (int round = 0; round < 3; ++round) {
    Buffer a = cache.take(300, s);
    Buffer b = cache.take(200, s);
    cache.give(std::move(a), s);
    Buffer c = cache.take(300, s);
    cache.give(std::move(b), s);
    cache.give(std::move(c), s);
  }
  CHECK(cache.allocations() - before <= 2);
  CHECK(tracker.usage(Category::kGatherWindow).peak <= cache.peak_live_bytes());
  cache.clear();
  CHECK(held() == 0);
}

TEST_CASE("reuse is ordered after the last user's stream work") {
  MemoryTracker tracker;
  auto device = make_host_device(tracker, {.threaded_streams = true});
  auto writer = device->create_stream("writer");
  Stream& compute = device->compute_stream();
  BufferCache cache(*device, Category::kCommBuffer);
  Buffer src = device->allocate(1 << 20, Category::kOther);
  std::memset(src.data(), 7, src.size_bytes());
  Buffer b = cache.take(1 << 20, compute);
  device->copy(b.data(), src.data(), b.size_bytes(), *writer);  // the writer's last use
  cache.give(std::move(b), *writer);
  Buffer again = cache.take(1 << 20, compute);  // compute now waits for the writer's copy
  CHECK(static_cast<unsigned char*>(again.data())[(1 << 20) - 1] == 7);
  cache.give(std::move(again), compute);
  device->synchronize(*writer, std::chrono::seconds(30));
}

}  // namespace
}  // namespace zero::memory
