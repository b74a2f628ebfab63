// HybridGroups on thread ranks: who is in each rank's shard and replica group (sizes, ranks, and an
// all-reduce that sums exactly those members), the plain-sharding and one-rank-group edges, and the
// errors. The expected groups are written out, not computed, so a swapped split key fails.
#include "comm/hybrid_groups.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "base/error.h"
#include "testing/thread_ranks.h"

namespace zero::comm {
namespace {

using Groups = std::vector<std::vector<int>>;  // world ranks of each group, in group-rank order

// `group` is world rank `world_rank`'s communicator of the partition `expected`: same size, the
// rank's place in its group, and an all-reduce of one bit per world rank summing exactly its members.
void check_group(Communicator* group, int world_rank, const Groups& expected) {
  REQUIRE(group != nullptr);
  const auto mine = std::find_if(expected.begin(), expected.end(), [&](const std::vector<int>& g) {
    return std::find(g.begin(), g.end(), world_rank) != g.end();
  });
  REQUIRE(mine != expected.end());
  CHECK(group->size() == static_cast<int>(mine->size()));
  CHECK(group->rank() == static_cast<int>(std::find(mine->begin(), mine->end(), world_rank) - mine->begin()));
  int64_t members = int64_t{1} << world_rank;
  group->all_reduce(&members, 1, DType::kInt64, ReduceOp::kSum)->wait();
  int64_t expected_members = 0;
  for (int r : *mine) expected_members |= int64_t{1} << r;
  CHECK(members == expected_members);
}

void check_layout(int world, int size, const Groups& shard, const Groups& replica) {
  testing::run_thread_ranks(world, [&](Communicator& c) {
    CAPTURE(c.rank());
    const HybridGroups g(c, size);
    CHECK(g.shard_group_size() == size);
    CHECK(g.num_shard_groups() == static_cast<int>(shard.size()));
    check_group(g.shard(), c.rank(), shard);
    check_group(g.replica(), c.rank(), replica);
  });
}

// The message of the InvalidArgument HybridGroups(c, size) throws ("no error" when it throws none).
std::string error_of(Communicator& c, int size) {
  try {
    HybridGroups g(c, size);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace

TEST_CASE("4 ranks in shard groups of 2: shard groups {0, 1}, {2, 3}; replica groups {0, 2}, {1, 3}") {
  check_layout(4, 2, {{0, 1}, {2, 3}}, {{0, 2}, {1, 3}});
}

TEST_CASE("6 ranks: groups of 3 and groups of 2 (shard and replica groups of different sizes)") {
  SUBCASE("groups of 3") { check_layout(6, 3, {{0, 1, 2}, {3, 4, 5}}, {{0, 3}, {1, 4}, {2, 5}}); }
  SUBCASE("groups of 2") { check_layout(6, 2, {{0, 1}, {2, 3}, {4, 5}}, {{0, 2, 4}, {1, 3, 5}}); }
}

TEST_CASE("one rank per shard group: every rank holds the whole state, replicated over the world") {
  check_layout(3, 1, {{0}, {1}, {2}}, {{0, 1, 2}});
}

TEST_CASE("a shard group of the whole world is plain sharding: the world, no replica group") {
  testing::run_thread_ranks(4, [&](Communicator& c) {
    const HybridGroups g(c, 4);
    CHECK(g.shard() == &c);
    CHECK(g.replica() == nullptr);
    CHECK(g.num_shard_groups() == 1);
    CHECK(g.layout() == "1 shard group of 4 ranks");
    check_group(g.shard(), c.rank(), {{0, 1, 2, 3}});
  });
}

TEST_CASE("layout names the groups and their size") {
  testing::run_thread_ranks(4, [&](Communicator& c) { CHECK(HybridGroups(c, 2).layout() == "2 shard groups of 2 ranks"); });
}

TEST_CASE("a size the world is not a multiple of, a size < 1 and sizes that differ across ranks fail on every rank") {
  testing::run_thread_ranks(4, [&](Communicator& c) {
    CHECK(error_of(c, 3) == "world size 4 is not a multiple of the shard group size 3");
    CHECK(error_of(c, 8) == "world size 4 is not a multiple of the shard group size 8");
    CHECK(error_of(c, 0) == "shard group size must be >= 1, got 0 (world size 4)");
    CHECK(error_of(c, -2) == "shard group size must be >= 1, got -2 (world size 4)");
    const int size = c.rank() == 1 ? 4 : 2;
    const std::string e = error_of(c, size);
    CHECK(e.find("shard group size differs across ranks: rank " + std::to_string(c.rank()) + " has " +
                 std::to_string(size) + ", the ranks' sizes range from 2 to 4") == 0);
    // The communicator is still usable: nothing was split, no collective left half done.
    CHECK(error_of(c, 2) == "no error");
  });
}

}  // namespace zero::comm
