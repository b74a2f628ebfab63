// The planning communicator's point-to-point calls: nothing moves, bytes are counted per peer, and
// the arguments are checked as every backend checks them.
#include "comm/planning_communicator.h"

#include <doctest/doctest.h>

#include <vector>

#include "base/error.h"

namespace zero::comm {
namespace {

TEST_CASE("send and recv count bytes per peer and move nothing") {
  PlanningCommunicator comm(1, 4, [](const void*, size_t) { return true; }, memory::DeviceKind::kHost);
  std::vector<float> buf(100, 7.0f);
  comm.send(buf.data(), 100, DType::kFloat32, 2)->wait();
  comm.send(buf.data(), 10, DType::kFloat32, 2)->wait();
  CHECK(comm.recv(buf.data(), 50, DType::kBFloat16, 0)->is_completed());
  CHECK(buf[0] == 7.0f);  // a receive writes nothing: no peer exists to fill it
  REQUIRE(comm.p2p_tallies().size() == 2);
  const P2PTally& to2 = comm.p2p_tallies().at(2);
  CHECK(to2.sends == 2);
  CHECK(to2.bytes_sent == 440);
  CHECK(to2.recvs == 0);
  const P2PTally& from0 = comm.p2p_tallies().at(0);
  CHECK(from0.recvs == 1);
  CHECK(from0.bytes_received == 100);
  CHECK(comm.tallies().empty());  // collectives' tallies untouched
  CHECK(comm.calls().empty());
  comm.reset_tallies();
  CHECK(comm.p2p_tallies().empty());
}

TEST_CASE("planned transfers check their arguments") {
  PlanningCommunicator comm(1, 4, [](const void*, size_t) { return true; }, memory::DeviceKind::kHost);
  float x = 0;
  CHECK_THROWS_WITH_AS(comm.send(&x, 1, DType::kFloat32, 1), doctest::Contains("this rank"), InvalidArgument);
  CHECK_THROWS_WITH_AS(comm.recv(&x, 1, DType::kFloat32, 4), doctest::Contains("out of range"), InvalidArgument);
  CHECK_THROWS_WITH_AS(comm.recv(nullptr, 1, DType::kFloat32, 0), doctest::Contains("buf is null"), InvalidArgument);
  CHECK(comm.p2p_tallies().empty());
}

}  // namespace
TEST_CASE("planned splits: groups of the planned sizes, their collectives tallied apart; an unplanned split is named") {
  PlanningCommunicator comm(3, 4, [](const void*, size_t) { return true; }, memory::DeviceKind::kHost);
  CHECK_THROWS_WITH_AS(comm.split(0, 0), doctest::Contains("split() number 1 was not planned"), InvalidArgument);
  PlanningCommunicator planned(3, 4, [](const void*, size_t) { return true; }, memory::DeviceKind::kHost);
  planned.plan_splits({{1, 2}, {1, 2}});
  auto node = planned.split(1, 3), across = planned.split(1, 3);
  REQUIRE(node != nullptr);
  CHECK(node->rank() == 1);
  CHECK(node->size() == 2);
  std::vector<float> send(4), recv(4);
  node->all_to_all(send.data(), recv.data(), 2, DType::kFloat32)->wait();
  across->all_gather(send.data(), recv.data(), 2, DType::kFloat32)->wait();
  CHECK(planned.tallies().empty());
  CHECK(planned.split_tallies(0).at("all_to_all").wire_bytes == 8);  // (n-1)/n of 16 bytes
  CHECK(planned.split_tallies(1).count("all_to_all") == 0);
  CHECK(planned.split_tallies(1).at("all_gather").calls == 1);
  planned.reset_tallies();
  CHECK(planned.split_tallies(0).empty());
  CHECK_THROWS_WITH_AS(planned.split(0, 0), doctest::Contains("split() number 3 was not planned"), InvalidArgument);
}

}  // namespace zero::comm
