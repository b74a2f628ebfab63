// BufferCache: exact sizes carved from one slab, the slab sized at settle() to the plan of the
// step's trace, nothing allocated once a pattern repeats (sizes that take turns included), a step
// that departs from the plan, the limit, what it holds as the tracker reports it, and stream order
// on reuse (threaded streams: TSan checks the edge).
#include <doctest/doctest.h>

#include <chrono>
#include <cstring>
#include <vector>

#include "base/error.h"
#include "memory/buffer_cache.h"
#include "memory/device.h"
#include "memory/tracker.h"

namespace zero::memory {
namespace {

TEST_CASE("exact sizes from one slab, sized at settle() to the first step's placements") {
  MemoryTracker tracker;
  auto device = make_host_device(tracker);
  Stream& s = device->compute_stream();
  BufferCache cache(*device, Category::kGatherWindow);
  auto held = [&] { return tracker.usage(Category::kGatherWindow).current; };

  // The first step: no slab yet, so each range has memory of its own, freed when given back.
  Buffer big = cache.take(1000, s);
  Buffer small = cache.take(10, s);
  CHECK(big.size_bytes() == 1000);
  CHECK(small.size_bytes() == 10);
  CHECK(cache.live_bytes() == 1010);
  CHECK(held() == 1010);
  CHECK(cache.allocations() == 2);
  cache.give(std::move(big), s);
  cache.give(std::move(small), s);
  CHECK(held() == 0);
  // Placed at offsets 0 and 1024 (64-byte boundaries): the slab holds both.
  cache.settle();
  CHECK(cache.capacity_bytes() == 1088);
  CHECK(held() == 1088);
  CHECK(cache.allocations() == 3);

  // The step again: both ranges in the slab, nothing allocated, the same addresses every time.
  std::vector<void*> first;
  for (int step = 0; step < 3; ++step) {
    Buffer a = cache.take(1000, s);
    Buffer b = cache.take(10, s);
    if (step == 0) first = {a.data(), b.data()};
    CHECK(a.data() == first[0]);
    CHECK(b.data() == first[1]);
    CHECK(static_cast<char*>(b.data()) - static_cast<char*>(a.data()) == 1024);
    cache.give(std::move(a), s);
    cache.give(std::move(b), s);
    cache.settle();
  }
  CHECK(cache.allocations() == 3);
  CHECK(held() == 1088);
  cache.clear();
  CHECK(held() == 0);
}

TEST_CASE("sizes that take turns, two live at a time, are allocated in the first step only") {
  // The stage 3 window's units (an embedding, blocks, a final norm): separate buffers kept within
  // the live peak would free and allocate one on every turn.
  MemoryTracker tracker;
  auto device = make_host_device(tracker);
  Stream& s = device->compute_stream();
  BufferCache cache(*device, Category::kGatherWindow);
  const std::vector<size_t> order = {2048, 512, 512, 512, 256, 256, 512, 512, 512, 2048};
  size_t after_first = 0;
  for (int step = 0; step < 4; ++step) {
    Buffer prev;
    for (size_t bytes : order) {
      Buffer next = cache.take(bytes, s);
      if (!prev.empty()) cache.give(std::move(prev), s);
      prev = std::move(next);
    }
    cache.give(std::move(prev), s);
    cache.settle();
    if (step == 0) after_first = cache.allocations();
  }
  CHECK(after_first == order.size() + 1);  // each range on its own, then the slab
  CHECK(cache.allocations() == after_first);
  CHECK(cache.peak_live_bytes() == 2048 + 512);
  // First fit would have needed 3072 bytes (the last 2048 finds no hole at 0); the plan packs the
  // step at its live peak.
  CHECK(cache.capacity_bytes() == 2048 + 512);
  CHECK(tracker.usage(Category::kGatherWindow).current == cache.capacity_bytes());
}

TEST_CASE("a step that departs from the plan falls back to first fit and is planned at its end") {
  MemoryTracker tracker;
  auto device = make_host_device(tracker);
  Stream& s = device->compute_stream();
  BufferCache cache(*device, Category::kCommBuffer);
  auto run = [&](const std::vector<size_t>& sizes) {  // two live at a time
    Buffer prev;
    for (size_t bytes : sizes) {
      Buffer next = cache.take(bytes, s);
      std::memset(next.data(), 1, bytes);  // the range is memory of its own (ASan checks)
      if (!prev.empty()) cache.give(std::move(prev), s);
      prev = std::move(next);
    }
    cache.give(std::move(prev), s);
    cache.settle();
  };
  const std::vector<size_t> a = {1024, 256, 512, 256}, b = {2048, 512, 1024};
  run(a);
  const size_t planned = cache.allocations();
  run(a);
  CHECK(cache.allocations() == planned);
  CHECK(cache.capacity_bytes() == 1024 + 256);  // the live peak
  run(b);  // larger: past the slab, then a larger slab
  CHECK(cache.allocations() > planned);
  CHECK(cache.capacity_bytes() == 2048 + 512);
  const size_t replanned = cache.allocations();
  run(b);
  run(a);  // fits the larger slab: first fit inside it, then its own plan
  run(a);
  CHECK(cache.allocations() == replanned);
  CHECK(tracker.usage(Category::kCommBuffer).current == 2048 + 512);
}

TEST_CASE("settle() with a buffer out, and a buffer from elsewhere") {
  MemoryTracker tracker;
  auto device = make_host_device(tracker);
  Stream& s = device->compute_stream();
  BufferCache cache(*device, Category::kCommBuffer);
  Buffer a = cache.take(300, s);
  cache.settle();  // a is out: nothing changes
  CHECK(cache.capacity_bytes() == 0);
  Buffer foreign = device->allocate(300, Category::kCommBuffer);
  CHECK_THROWS_AS(cache.give(std::move(foreign), s), Error);
  cache.give(std::move(a), s);
  cache.settle();
  CHECK(cache.capacity_bytes() == 320);
}

TEST_CASE("a limit bounds the slab; fits() says whether a request lands within it") {
  MemoryTracker tracker;
  auto device = make_host_device(tracker);
  Stream& s = device->compute_stream();
  BufferCache cache(*device, Category::kGatherWindow);
  cache.limit_to(1024);
  Buffer a = cache.take(512, s);
  CHECK(cache.fits(512));
  Buffer b = cache.take(512, s);
  CHECK_FALSE(cache.fits(64));
  cache.give(std::move(a), s);
  CHECK(cache.fits(512));
  CHECK_FALSE(cache.fits(576));  // the hole at 0 holds 512; past b is past the limit
  Buffer c = cache.take(576, s);  // placed past the limit anyway, on memory of its own
  cache.give(std::move(b), s);
  cache.give(std::move(c), s);
  cache.settle();
  CHECK(cache.capacity_bytes() == 1024);
  CHECK(tracker.usage(Category::kGatherWindow).current == 1024);
}

TEST_CASE("reuse is ordered after the last user's stream work") {
  MemoryTracker tracker;
  auto device = make_host_device(tracker, {.threaded_streams = true});
  auto writer = device->create_stream("writer");
  Stream& compute = device->compute_stream();
  BufferCache cache(*device, Category::kCommBuffer);
  cache.give(cache.take(1 << 20, compute), compute);
  cache.settle();  // the slab: the buffers below share its memory
  Buffer src = device->allocate(1 << 20, Category::kOther);
  std::memset(src.data(), 7, src.size_bytes());
  Buffer b = cache.take(1 << 20, compute);
  device->copy(b.data(), src.data(), b.size_bytes(), *writer);  // the writer's last use
  void* where = b.data();
  cache.give(std::move(b), *writer);
  Buffer again = cache.take(1 << 20, compute);  // compute now waits for the writer's copy
  CHECK(again.data() == where);
  CHECK(static_cast<unsigned char*>(again.data())[(1 << 20) - 1] == 7);
  cache.give(std::move(again), compute);
  device->synchronize(*writer, std::chrono::seconds(30));
}

}  // namespace
}  // namespace zero::memory
