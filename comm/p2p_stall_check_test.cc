#include "comm/p2p_stall_check.h"

#include <doctest/doctest.h>

#include <map>
#include <string>
#include <utility>

namespace zero::comm {
namespace {

using namespace std::chrono_literals;
using Clock = P2PStallCheck::Clock;
using Bytes = P2PStallCheck::Bytes;

// The store between ranks: what rank `from` published for rank `to`.
struct Board {
  std::map<std::pair<int, int>, Bytes> published;
  int publications = 0;

  P2PStallCheck::Exchange for_rank(int me) {
    return {[this, me](int peer, const Bytes& records) {
              published[{me, peer}] = records;
              ++publications;
            },
            [this, me](int peer) {
              const auto it = published.find({peer, me});
              return it == published.end() ? Bytes() : it->second;
            }};
  }
};

P2PStallCheck::Pending pending(CollectiveKind kind, uint64_t seq, DType dtype, uint64_t count, int peer,
                               Clock::time_point posted, const std::string& label = "act") {
  CallInfo call = make_p2p_call(seq, kind, dtype, count, peer);
  call.label = label;
  return {call, posted};
}

const std::string kWrongCount =
    "p2p mismatch: rank 0 called send(fp32, 100, to rank 1) #4 [act] but rank 1 called "
    "recv(fp32, 99, from rank 0) #4 [act]";

TEST_CASE("a disagreeing partner is named on both ranks once both transfers stalled") {
  Board board;
  P2PStallCheck rank0(0, 2, 250ms, board.for_rank(0)), rank1(1, 2, 250ms, board.for_rank(1));
  const auto t0 = Clock::now();
  const std::vector<P2PStallCheck::Pending> mine0 = {
      pending(CollectiveKind::kSend, 4, DType::kFloat32, 100, 1, t0)};
  const std::vector<P2PStallCheck::Pending> mine1 = {
      pending(CollectiveKind::kRecv, 3, DType::kFloat32, 7, 0, t0),  // an earlier one, agreeing
      pending(CollectiveKind::kRecv, 4, DType::kFloat32, 99, 0, t0)};
  // Before the delay nothing is published or compared.
  CHECK_FALSE(rank0.look(mine0, t0 + 100ms));
  CHECK_FALSE(rank1.look(mine1, t0 + 100ms));
  CHECK(board.publications == 0);
  // Rank 0 looks first: rank 1 has published nothing yet.
  CHECK_FALSE(rank0.look(mine0, t0 + 300ms));
  const auto v1 = rank1.look(mine1, t0 + 300ms);
  REQUIRE(v1);
  CHECK(v1->index == 1);
  CHECK(v1->mismatch == kWrongCount);
  const auto v0 = rank0.look(mine0, t0 + 400ms);
  REQUIRE(v0);
  CHECK(v0->index == 0);
  CHECK(v0->mismatch == kWrongCount);
  // The rank whose connection broke compares its own call with what the other published.
  CHECK(rank1.compare_with_peer(mine1[1].call) == kWrongCount);
  CHECK(rank1.compare_with_peer(mine1[0].call).empty());
}

TEST_CASE("dtype and label disagreements are named too") {
  Board board;
  P2PStallCheck a(2, 4, 10ms, board.for_rank(2)), b(3, 4, 10ms, board.for_rank(3));
  const auto t0 = Clock::now();
  CHECK_FALSE(a.look({pending(CollectiveKind::kRecv, 0, DType::kFloat32, 8, 3, t0, "grad")}, t0 + 20ms));
  const auto v = b.look({pending(CollectiveKind::kSend, 0, DType::kInt32, 8, 2, t0, "act")}, t0 + 20ms);
  REQUIRE(v);
  CHECK(v->mismatch ==
        "p2p mismatch: rank 3 called send(int32, 8, to rank 2) #0 [act] but rank 2 called "
        "recv(fp32, 8, from rank 3) #0 [grad]");
}

TEST_CASE("a late or agreeing partner is no verdict, and an unchanged set is published once") {
  Board board;
  P2PStallCheck rank0(0, 2, 50ms, board.for_rank(0)), rank1(1, 2, 50ms, board.for_rank(1));
  const auto t0 = Clock::now();
  const std::vector<P2PStallCheck::Pending> sends = {
      pending(CollectiveKind::kSend, 0, DType::kFloat16, 5, 1, t0),
      pending(CollectiveKind::kSend, 1, DType::kFloat16, 6, 1, t0)};
  // Rank 1 has not posted #1 yet, and its #0 agrees.
  const std::vector<P2PStallCheck::Pending> recvs = {pending(CollectiveKind::kRecv, 0, DType::kFloat16, 5, 0, t0)};
  for (int i = 1; i <= 5; ++i) {
    CHECK_FALSE(rank0.look(sends, t0 + i * 60ms));
    CHECK_FALSE(rank1.look(recvs, t0 + i * 60ms));
  }
  CHECK(board.publications == 2);  // once per rank: the sets did not change
  // A send to another peer of the same number is no partner of rank 1's receive.
  Board other;
  P2PStallCheck r0(0, 3, 10ms, other.for_rank(0)), r1(1, 3, 10ms, other.for_rank(1));
  CHECK_FALSE(r0.look({pending(CollectiveKind::kSend, 0, DType::kFloat32, 1, 2, t0)}, t0 + 20ms));
  CHECK_FALSE(r1.look({pending(CollectiveKind::kRecv, 0, DType::kFloat32, 2, 0, t0)}, t0 + 20ms));
}

TEST_CASE("looks grow rarer as a stall lasts, within bounds") {
  Board board;
  P2PStallCheck check(0, 2, 100ms, board.for_rank(0));
  CHECK(check.next_look() == P2PStallCheck::kFirstLook);
  const auto t0 = Clock::now();
  const std::vector<P2PStallCheck::Pending> one = {pending(CollectiveKind::kRecv, 0, DType::kUInt8, 1, 1, t0)};
  check.look(one, t0 + 2s);
  CHECK(check.next_look() == 500ms);
  check.look(one, t0 + 60s);
  CHECK(check.next_look() == P2PStallCheck::kLastLook);
  check.look({}, t0 + 61s);
  CHECK(check.next_look() == P2PStallCheck::kFirstLook);
}

}  // namespace
}  // namespace zero::comm
