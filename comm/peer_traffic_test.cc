// The bytes a Gloo communicator and its splits send, counted per world rank at the transport:
// exactly the data each collective puts on the wire (with the schedule check and the message path
// off), a split's peers counted as their world ranks, a point-to-point transfer, and the per-link
// summary of 2 nodes of 2 ranks.
#include "comm/peer_traffic.h"

#include <doctest/doctest.h>

#include <memory>
#include <thread>
#include <vector>

#include "base/error.h"
#include "comm/gloo/gloo_communicator.h"
#include "comm/store/memory_store.h"

namespace zero::comm {
namespace {

using namespace std::chrono_literals;

TEST_CASE("a communicator and its splits count the bytes sent to each world rank") {
  constexpr int kWorld = 4;
  auto store = std::make_shared<MemoryStore>();
  std::vector<std::vector<uint64_t>> sent(kWorld);
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld; ++r) {
    threads.emplace_back([&, r] {
      GlooOptions o;
      o.timeout = 20s;
      o.check_schedule = false;  // no check records: only the data
      o.eager_bytes = 0;         // no message headers either
      o.traffic = std::make_shared<PeerTraffic>(kWorld);
      auto world = make_gloo_communicator(store, r, kWorld, o);
      std::vector<float> send(4 * 1000, 1.0f), recv(4 * 1000);
      world->all_gather(send.data(), recv.data(), 1000, DType::kFloat32)->wait();          // 4000 to each
      world->reduce_scatter(send.data(), recv.data(), 500, DType::kFloat32, ReduceOp::kSum)->wait();  // 2000
      auto pair = world->split(r % 2, r);  // {0, 2} and {1, 3}
      pair->all_to_all(send.data(), recv.data(), 100, DType::kFloat32)->wait();  // 400 to the other
      if (r == 0) world->send(send.data(), 25, DType::kFloat32, 1)->wait();     // 100 more to rank 1
      if (r == 1) world->recv(recv.data(), 25, DType::kFloat32, 0)->wait();
      sent[static_cast<size_t>(r)] = o.traffic->sent();
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kWorld; ++r) {
    CAPTURE(r);
    for (int p = 0; p < kWorld; ++p) {
      CAPTURE(p);
      uint64_t expect = p == r ? 0 : 4000 + 2000;
      if (p == (r + 2) % kWorld) expect += 400;
      if (r == 0 && p == 1) expect += 100;
      CHECK(sent[static_cast<size_t>(r)][static_cast<size_t>(p)] == expect);
    }
  }
  const LinkBytes b = by_link(sent[0], 0, 2);
  CHECK(b.in_node == 6100);
  CHECK(b.between_nodes == 2 * 6000 + 400);
}

TEST_CASE("a traffic counter of another world size is refused, naming the option") {
  auto store = std::make_shared<MemoryStore>();
  GlooOptions o;
  o.traffic = std::make_shared<PeerTraffic>(3);
  CHECK_THROWS_WITH_AS(make_gloo_communicator(store, 0, 1, o),
                       doctest::Contains("GlooOptions.traffic counts a world of 3 ranks, the communicator has 1"),
                       InvalidArgument);
}

}  // namespace
}  // namespace zero::comm
