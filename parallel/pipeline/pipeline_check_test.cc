// Hand-broken schedules are refused with errors that name the rank, the micro-batch and the action:
// a missing receive, a W before its B, a swapped pair of sends (which would pair the wrong tensors,
// or deadlock with blocking sends), a real deadlock, a duplicate forward, a bad micro-batch index.
#include "parallel/pipeline/pipeline_check.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <string>

#include "base/error.h"
#include "parallel/pipeline/schedules.h"

namespace zero::parallel {
namespace {

std::vector<Action>::iterator find(Schedule& s, int rank, Action a) {
  auto& v = s.actions[static_cast<size_t>(rank)];
  const auto it = std::find(v.begin(), v.end(), a);
  REQUIRE(it != v.end());
  return it;
}

std::string error_of(const Schedule& s) {
  try {
    check_schedule(s);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "accepted";
}

TEST_CASE("a missing receive") {
  Schedule s = one_f_one_b(2, 4);
  s.actions[1].erase(find(s, 1, {Op::kRecvF, 1, 0}));
  CHECK(error_of(s) ==
        "pipeline schedule '1f1b': rank 1: micro-batch 1 has 0 RecvF where it needs 1 (virtual stage 0 is on rank 0)");
}

TEST_CASE("a W before its B") {
  Schedule s = zb_h1(2, 4);
  const auto w = find(s, 0, {Op::kW, 0, 0});
  s.actions[0].erase(w);
  s.actions[0].insert(find(s, 0, {Op::kB, 0, 0}), Action{Op::kW, 0, 0});
  CHECK(error_of(s) == "pipeline schedule 'zb-h1': rank 0: W of micro-batch 0 comes before its B");
}

TEST_CASE("a swapped pair of sends") {
  // Rank 0 sends micro-batch 2 before 1; rank 1 receives 1 first. With blocking sends this
  // deadlocks; with sends matched in order it would hand micro-batch 2's activations to 1.
  Schedule s = gpipe(2, 4);
  std::iter_swap(find(s, 0, {Op::kSendF, 1, 0}), find(s, 0, {Op::kSendF, 2, 0}));
  const std::string e = error_of(s);
  // The swap also puts SendF 2 before F 2 on rank 0: the order check names it first.
  CHECK(e == "pipeline schedule 'gpipe': rank 0: SendF of micro-batch 2 comes before its F");
  // Swapped with their forwards, the order on rank 0 is valid but differs from rank 1's.
  Schedule t = gpipe(2, 4);
  auto& r0 = t.actions[0];
  const auto f1 = find(t, 0, {Op::kF, 1, 0});
  const auto f2 = find(t, 0, {Op::kF, 2, 0});
  std::iter_swap(f1, f2);
  std::iter_swap(find(t, 0, {Op::kSendF, 1, 0}), find(t, 0, {Op::kSendF, 2, 0}));
  (void)r0;
  CHECK(error_of(t) ==
        "pipeline schedule 'gpipe': rank 0: sends activations to rank 1 in another order than rank 1 receives them "
        "(the k-th send meets the k-th receive): its send #1 is micro-batch 2 of virtual stage 0, rank 1's receive #1 "
        "is micro-batch 1 of virtual stage 0");
}

TEST_CASE("a deadlock") {
  // Rank 0 waits for micro-batch 0's gradient before sending micro-batch 1's activations, which rank
  // 1 needs before it can compute (and send) that gradient.
  Schedule s = gpipe(2, 2);
  auto& r0 = s.actions[0];
  const auto recv = find(s, 0, {Op::kRecvB, 0, 0});
  const Action moved = *recv;
  r0.erase(recv);
  r0.insert(find(s, 0, {Op::kSendF, 1, 0}), moved);
  CHECK(error_of(s) ==
        "pipeline schedule 'gpipe' deadlocks: rank 0 waits at RecvB of micro-batch 0 (from rank 1); rank 1 waits at "
        "RecvF of micro-batch 1 (from rank 0)");
}

TEST_CASE("a duplicate forward, an index out of range, the wrong backward form") {
  Schedule s = one_f_one_b(2, 2);
  s.actions[1].push_back({Op::kF, 1, 0});
  CHECK(error_of(s) == "pipeline schedule '1f1b': rank 1: micro-batch 1 has 2 F where it needs 1");
  Schedule t = one_f_one_b(2, 2);
  t.actions[0][0].mb = 5;
  CHECK(error_of(t).find("rank 0: action #0 (F5) names micro-batch 5 chunk 0, outside 2 micro-batches x 1 chunks") !=
        std::string::npos);
  Schedule u = one_f_one_b(2, 2);
  u.actions[1].push_back({Op::kW, 0, 0});
  CHECK(error_of(u).find("the schedule does not split (BW, not B and W) its backward") != std::string::npos);
}

TEST_CASE("interleaved schedules: the transfers between the last rank and the first") {
  Schedule s = interleaved_1f1b(2, 4, 2);
  // Virtual stage 1 (rank 1, chunk 0) sends to virtual stage 2 (rank 0, chunk 1).
  s.actions[0].erase(find(s, 0, {Op::kRecvF, 3, 1}));
  CHECK(error_of(s) == "pipeline schedule 'interleaved': rank 0: micro-batch 3 (chunk 1) has 0 RecvF where it needs 1 "
                       "(virtual stage 1 is on rank 1)");
}

}  // namespace
}  // namespace zero::parallel
