// CollectiveOrder with a host (Gloo) communicator on thread ranks and the host device in its
// threaded-streams mode: before_issue() returns only once the stream's work so far is done (a
// collective on the host reads its buffers at once), after() only once the collective has completed,
// within the timeout; a device whose memory the communicator cannot take is refused by name.
#include "zero/collective_order.h"

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "base/error.h"
#include "memory/device.h"
#include "memory/meta_device.h"
#include "memory/tracker.h"
#include "testing/thread_ranks.h"

namespace zero {
namespace {

using namespace std::chrono_literals;

memory::HostDeviceOptions threaded() {
  memory::HostDeviceOptions o;
  o.threaded_streams = true;
  return o;
}

}  // namespace

TEST_CASE("before_issue waits for the stream's work so far") {
  testing::run_thread_ranks(1, [&](comm::Communicator& comm) {
    memory::MemoryTracker tracker;
    auto device = memory::make_host_device(tracker, threaded());
    auto side = device->create_stream("producer");
    CollectiveOrder order(*device, comm, 10s);
    std::atomic<int> produced{0};
    device->host_task(*side, [&] {
      std::this_thread::sleep_for(100ms);  // a slow producer of the collective's input
      produced = 1;
    });
    order.before_issue(*side);
    CHECK(produced == 1);
    device->synchronize(*side, 10s);
  });
}

TEST_CASE("after waits for the collective, and fails past the timeout naming it") {
  SUBCASE("the result is there when after() returns") {
    testing::run_thread_ranks(2, [&](comm::Communicator& comm) {
      memory::MemoryTracker tracker;
      auto device = memory::make_host_device(tracker, threaded());
      CollectiveOrder order(*device, comm, 10s);
      std::vector<float> x(1024, static_cast<float>(comm.rank() + 1));
      // Rank 1 comes late: without the wait, rank 0 would read its own values.
      if (comm.rank() == 1) std::this_thread::sleep_for(150ms);
      order.before_issue(device->compute_stream());
      auto work = comm.all_reduce(x.data(), x.size(), DType::kFloat32, comm::ReduceOp::kSum);
      order.after(*work, device->compute_stream());
      CHECK(x.front() == 3.0f);
      CHECK(x.back() == 3.0f);
    });
  }
  SUBCASE("a peer that never comes") {
    testing::run_thread_ranks(2, [&](comm::Communicator& comm) {
      memory::MemoryTracker tracker;
      auto device = memory::make_host_device(tracker, threaded());
      CollectiveOrder order(*device, comm, 300ms);
      if (comm.rank() == 1) return;
      float x = 1.0f;
      order.before_issue(device->compute_stream());
      auto work = comm.all_reduce(&x, 1, DType::kFloat32, comm::ReduceOp::kSum);
      const auto t0 = std::chrono::steady_clock::now();
      CHECK_THROWS_AS(order.after(*work, device->compute_stream()), TimeoutError);
      CHECK(std::chrono::steady_clock::now() - t0 < 5s);
    });
  }
}

TEST_CASE("a communicator that cannot take the device's memory is refused, naming both") {
  testing::run_thread_ranks(1, [&](comm::Communicator& comm) {
    memory::MemoryTracker tracker;
    auto gpu = memory::make_meta_device(tracker, memory::Location{memory::DeviceKind::kCuda, 0});
    CHECK_THROWS_WITH_AS(CollectiveOrder(*gpu, comm, 1s),
                         doctest::Contains("does not accept cuda:0 memory"), InvalidArgument);
  });
}

}  // namespace zero
