// The planning device: buffers of any size are accounted like a real device's, large ones take no
// memory and no work is done on them, small ones are real and computed on.
#include "memory/meta_device.h"

#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

#include "memory/tracker.h"

namespace zero::memory {

// 64 GiB, more than this machine has: enough to show nothing is backed, and within what the
// sanitizers leave of the address space (TSan refused a terabyte).
TEST_CASE("64 GiB are accounted without being backed, and operations on them are skipped") {
  MemoryTracker tracker;
  auto meta = make_meta_device(tracker, Location::cuda(0));
  CHECK(meta->kind() == DeviceKind::kCuda);
  const size_t tb = size_t{64} << 30;
  {
    Buffer big = meta->allocate(tb, Category::kOptimizerState);
    CHECK(tracker.usage(Category::kOptimizerState, Location::cuda(0)).current == tb);
    CHECK_FALSE(meta->addressable(big.data(), 1));
    CHECK_FALSE(meta->addressable(static_cast<char*>(big.data()) + tb - 1, 1));
    CHECK(static_cast<const char*>(big.data())[tb / 2] == 0);  // reads as zeros, costs nothing
    meta->fill_zero(big.data(), tb, meta->compute_stream());  // skipped, so it does not fault
    Buffer staging = meta->allocate_host_staging(tb, Category::kCommBuffer, tracker);
    CHECK(tracker.usage(Category::kCommBuffer, Location::pinned_host()).current == tb);
    meta->copy(staging.data(), big.data(), tb, meta->compute_stream());
  }
  CHECK(tracker.current_total() == 0);
  CHECK(tracker.usage(Category::kOptimizerState).peak == tb);
}

TEST_CASE("a released large buffer's address space serves the next of its size, accounted anew") {
  MemoryTracker tracker;
  auto meta = make_meta_device(tracker);
  const size_t big = size_t{64} << 20;
  const void* first = nullptr;
  {
    Buffer a = meta->allocate(big, Category::kGrads);
    first = a.data();
  }
  CHECK(tracker.current_total() == 0);
  CHECK_FALSE(meta->addressable(first, 1));  // still the device's unbacked space, not real memory
  Buffer b = meta->allocate(big, Category::kCommBuffer);
  CHECK(b.data() == first);  // reused, not mapped again
  CHECK(tracker.usage(Category::kCommBuffer, Location::host()).current == big);
  CHECK(static_cast<const char*>(b.data())[big - 1] == 0);
  Buffer c = meta->allocate(big, Category::kCommBuffer);  // the pooled range is taken: a new one
  CHECK(c.data() != b.data());
  Buffer d = meta->allocate(2 * big, Category::kCommBuffer);  // another size: a new one
  CHECK(d.data() != first);
  CHECK_FALSE(meta->addressable(d.data(), 2 * big));
}

TEST_CASE("small buffers are real: copies and kernels run on them") {
  MemoryTracker tracker;
  auto meta = make_meta_device(tracker);
  Buffer a = meta->allocate_elements(4, DType::kFloat32, Category::kOther);
  Buffer b = meta->allocate_elements(4, DType::kFloat32, Category::kOther);
  CHECK(meta->addressable(a.data(), a.size_bytes()));
  const std::vector<float> in = {1, 2, 3, 4};
  meta->copy(a.data(), in.data(), 16, meta->compute_stream());
  meta->accumulate(b.data(), DType::kFloat32, a.data(), DType::kFloat32, 4, meta->compute_stream());
  meta->scale(b.data(), DType::kFloat32, 4, 2.0f, meta->compute_stream());
  std::vector<float> out(4);
  meta->copy(out.data(), b.data(), 16, meta->compute_stream());
  CHECK(out == std::vector<float>{2, 4, 6, 8});
  // User memory the planner registers: address space, not accounted.
  void* user = meta->reserve_unbacked(size_t{1} << 36);
  CHECK_FALSE(meta->addressable(user, 8));
  CHECK(tracker.current_total() == a.size_bytes() + b.size_bytes());
  int ran = 0;
  meta->host_task(meta->compute_stream(), [&] { ++ran; });
  CHECK(ran == 1);
}

}  // namespace zero::memory
