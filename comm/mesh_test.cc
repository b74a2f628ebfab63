// comm::Mesh and its layout: coordinates, the rank at coordinates, and every named group's members,
// written out by hand for world 8 as (2, 2, 2), (1, 2, 4) and (8, 1, 1) under the default order
// (tp fastest) and the reverse one (pp fastest); on thread ranks, each group's communicator has
// exactly those members in that order (an all-gather of world ranks) and an all-reduce over it sums
// exactly them. The errors: sizes that do not fit the world, a bad order, ranks that disagree.
#include "comm/mesh.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "base/error.h"
#include "testing/thread_ranks.h"

namespace zero::comm {
namespace {

using Groups = std::vector<std::vector<int>>;  // world ranks of each group, in group-rank order

constexpr std::array<MeshDim, 3> kDefault = {MeshDim::kPp, MeshDim::kDp, MeshDim::kTp};
constexpr std::array<MeshDim, 3> kReverse = {MeshDim::kTp, MeshDim::kDp, MeshDim::kPp};

Groups singletons(int world) {
  Groups g;
  for (int r = 0; r < world; ++r) g.push_back({r});
  return g;
}

struct Case {
  MeshShape shape;
  std::map<MeshGroup, Groups> groups;  // ranks in no group of a kind are in none of its lists
  std::vector<MeshCoord> coords;       // by world rank
};

std::vector<Case> cases() {
  std::vector<Case> c;
  // rank = pp*4 + dp*2 + tp
  c.push_back({{.pp = 2, .dp = 2, .tp = 2, .order = kDefault},
               {{MeshGroup::kTp, {{0, 1}, {2, 3}, {4, 5}, {6, 7}}},
                {MeshGroup::kDp, {{0, 2}, {1, 3}, {4, 6}, {5, 7}}},
                {MeshGroup::kPp, {{0, 4}, {1, 5}, {2, 6}, {3, 7}}},
                {MeshGroup::kModelParallel, {{0, 1, 4, 5}, {2, 3, 6, 7}}},
                {MeshGroup::kEmbedding, {{0, 4}, {1, 5}, {2, 6}, {3, 7}}}},
               {{0, 0, 0}, {0, 0, 1}, {0, 1, 0}, {0, 1, 1}, {1, 0, 0}, {1, 0, 1}, {1, 1, 0}, {1, 1, 1}}});
  // rank = tp*4 + dp*2 + pp
  c.push_back({{.pp = 2, .dp = 2, .tp = 2, .order = kReverse},
               {{MeshGroup::kTp, {{0, 4}, {1, 5}, {2, 6}, {3, 7}}},
                {MeshGroup::kDp, {{0, 2}, {1, 3}, {4, 6}, {5, 7}}},
                {MeshGroup::kPp, {{0, 1}, {2, 3}, {4, 5}, {6, 7}}},
                {MeshGroup::kModelParallel, {{0, 1, 4, 5}, {2, 3, 6, 7}}},
                {MeshGroup::kEmbedding, {{0, 1}, {2, 3}, {4, 5}, {6, 7}}}},
               {{0, 0, 0}, {1, 0, 0}, {0, 1, 0}, {1, 1, 0}, {0, 0, 1}, {1, 0, 1}, {0, 1, 1}, {1, 1, 1}}});
  // rank = dp*4 + tp
  c.push_back({{.pp = 1, .dp = 2, .tp = 4, .order = kDefault},
               {{MeshGroup::kTp, {{0, 1, 2, 3}, {4, 5, 6, 7}}},
                {MeshGroup::kDp, {{0, 4}, {1, 5}, {2, 6}, {3, 7}}},
                {MeshGroup::kPp, singletons(8)},
                {MeshGroup::kModelParallel, {{0, 1, 2, 3}, {4, 5, 6, 7}}},
                {MeshGroup::kEmbedding, singletons(8)}},
               {{0, 0, 0}, {0, 0, 1}, {0, 0, 2}, {0, 0, 3}, {0, 1, 0}, {0, 1, 1}, {0, 1, 2}, {0, 1, 3}}});
  // rank = tp*2 + dp
  c.push_back({{.pp = 1, .dp = 2, .tp = 4, .order = kReverse},
               {{MeshGroup::kTp, {{0, 2, 4, 6}, {1, 3, 5, 7}}},
                {MeshGroup::kDp, {{0, 1}, {2, 3}, {4, 5}, {6, 7}}},
                {MeshGroup::kPp, singletons(8)},
                {MeshGroup::kModelParallel, {{0, 2, 4, 6}, {1, 3, 5, 7}}},
                {MeshGroup::kEmbedding, singletons(8)}},
               {{0, 0, 0}, {0, 1, 0}, {0, 0, 1}, {0, 1, 1}, {0, 0, 2}, {0, 1, 2}, {0, 0, 3}, {0, 1, 3}}});
  // rank = pp, whatever the order; the embedding group is the first and the last stage.
  for (const auto& order : {kDefault, kReverse}) {
    c.push_back({{.pp = 8, .dp = 1, .tp = 1, .order = order},
                 {{MeshGroup::kTp, singletons(8)},
                  {MeshGroup::kDp, singletons(8)},
                  {MeshGroup::kPp, {{0, 1, 2, 3, 4, 5, 6, 7}}},
                  {MeshGroup::kModelParallel, {{0, 1, 2, 3, 4, 5, 6, 7}}},
                  {MeshGroup::kEmbedding, {{0, 7}}}},
                 {{0, 0, 0}, {1, 0, 0}, {2, 0, 0}, {3, 0, 0}, {4, 0, 0}, {5, 0, 0}, {6, 0, 0}, {7, 0, 0}}});
  }
  return c;
}

constexpr MeshGroup kGroups[] = {MeshGroup::kTp, MeshGroup::kDp, MeshGroup::kPp, MeshGroup::kModelParallel,
                                 MeshGroup::kEmbedding};

// The group of `expected` holding `rank`; empty when none does.
std::vector<int> group_of(const Groups& expected, int rank) {
  for (const auto& g : expected) {
    if (std::find(g.begin(), g.end(), rank) != g.end()) return g;
  }
  return {};
}

TEST_CASE("MeshLayout: coordinates and every group's members, as written out") {
  for (const Case& c : cases()) {
    CAPTURE(c.shape.describe());
    const MeshLayout layout(c.shape, 8);
    for (int r = 0; r < 8; ++r) {
      CAPTURE(r);
      CHECK(layout.coord(r) == c.coords[static_cast<size_t>(r)]);
      CHECK(layout.rank(c.coords[static_cast<size_t>(r)]) == r);
      for (const MeshGroup g : kGroups) {
        CAPTURE(mesh_group_name(g));
        const std::vector<int> expected = group_of(c.groups.at(g), r);
        CHECK(layout.in_group(g, r) == !expected.empty());
        CHECK(layout.group_ranks(g, r) == expected);
        CHECK(layout.group_color(g, r) == (expected.empty() ? -1 : expected.front()));
      }
    }
  }
}

TEST_CASE("MeshLayout: rank and coordinates are inverse for every order of (2, 3, 4)") {
  std::array<MeshDim, 3> order = kDefault;
  std::sort(order.begin(), order.end());
  do {
    const MeshLayout layout({.pp = 2, .dp = 3, .tp = 4, .order = order}, 24);
    std::vector<bool> seen(24);
    for (int r = 0; r < 24; ++r) {
      const MeshCoord c = layout.coord(r);
      CHECK(layout.rank(c) == r);
      // The fastest dimension of the order moves with the rank.
      if (r + 1 < 24 && (r + 1) % layout.shape().size(order[2]) != 0) {
        CHECK(layout.coord(r + 1)[order[2]] == c[order[2]] + 1);
      }
      for (const MeshGroup g : kGroups) {
        for (const int member : layout.group_ranks(g, r)) seen[static_cast<size_t>(member)] = true;
      }
    }
    CHECK(std::all_of(seen.begin(), seen.end(), [](bool b) { return b; }));
  } while (std::next_permutation(order.begin(), order.end()));
}

TEST_CASE("parse_mesh_order: slowest-varying first, each dimension once") {
  CHECK(parse_mesh_order("tp,pp,dp") == std::array<MeshDim, 3>{MeshDim::kTp, MeshDim::kPp, MeshDim::kDp});
  CHECK(parse_mesh_order("pp,dp,tp") == MeshShape{}.order);
  for (const char* bad : {"pp,dp", "pp,dp,tp,pp", "pp,pp,tp", "pp,dp,ep", ""}) {
    CAPTURE(bad);
    const std::string want = "mesh order '" + std::string(bad) + "'";
    CHECK_THROWS_WITH_AS(parse_mesh_order(bad), doctest::Contains(want.c_str()), InvalidArgument);
  }
}

TEST_CASE("MeshLayout: errors name the sizes") {
  CHECK_THROWS_WITH_AS(MeshLayout({.pp = 2, .dp = 2, .tp = 3}, 8),
                       "mesh (pp 2, dp 2, tp 3; order pp, dp, tp) needs pp x dp x tp = 12 ranks, but the world has 8",
                       InvalidArgument);
  CHECK_THROWS_WITH_AS(MeshLayout({.pp = 0, .dp = 8, .tp = 1}, 8),
                       "mesh (pp 0, dp 8, tp 1; order pp, dp, tp): every size must be at least 1", InvalidArgument);
  CHECK_THROWS_WITH_AS(MeshLayout({.pp = 1, .dp = -2, .tp = -4}, 8), doctest::Contains("every size must be at least 1"),
                       InvalidArgument);
  CHECK_THROWS_WITH_AS(MeshLayout({.dp = 8, .order = {MeshDim::kDp, MeshDim::kDp, MeshDim::kTp}}, 8),
                       doctest::Contains("the order must name pp, dp and tp once each"), InvalidArgument);
  const MeshLayout layout({.dp = 2, .tp = 4}, 8);
  CHECK_THROWS_WITH_AS(layout.coord(8), doctest::Contains("rank 8 is outside the mesh"), InvalidArgument);
  CHECK_THROWS_WITH_AS(layout.rank({.pp = 0, .dp = 0, .tp = 4}), doctest::Contains("coordinate tp 4 is outside"),
                       InvalidArgument);
}

// `group` holds exactly `expected` in that order: its size, this rank's place, an all-gather of the
// members' world ranks, and an all-reduce of one bit per member.
void check_group(Communicator* group, int world_rank, const std::vector<int>& expected) {
  if (expected.empty()) {
    CHECK(group == nullptr);
    return;
  }
  REQUIRE(group != nullptr);
  CHECK(group->size() == static_cast<int>(expected.size()));
  CHECK(group->rank() == static_cast<int>(std::find(expected.begin(), expected.end(), world_rank) - expected.begin()));
  const int32_t mine = world_rank;
  std::vector<int32_t> members(static_cast<size_t>(group->size()), -1);
  group->all_gather(&mine, members.data(), 1, DType::kInt32)->wait();
  CHECK(std::vector<int>(members.begin(), members.end()) == expected);
  int64_t bits = int64_t{1} << world_rank;
  group->all_reduce(&bits, 1, DType::kInt64, ReduceOp::kSum)->wait();
  int64_t expected_bits = 0;
  for (const int r : expected) expected_bits |= int64_t{1} << r;
  CHECK(bits == expected_bits);
}

TEST_CASE("Mesh at world 8: every group's communicator holds exactly its members") {
  for (const Case& c : cases()) {
    CAPTURE(c.shape.describe());
    testing::run_thread_ranks(8, [&](Communicator& world) {
      const int r = world.rank();
      CAPTURE(r);
      const Mesh mesh(world, c.shape);
      CHECK(mesh.coord() == c.coords[static_cast<size_t>(r)]);
      CHECK(mesh.rank_at(mesh.coord()) == r);
      CHECK(&mesh.world() == &world);
      CHECK(mesh.group(MeshGroup::kTp) == &mesh.tp());
      CHECK(mesh.group(MeshGroup::kDp) == &mesh.dp());
      CHECK(mesh.group(MeshGroup::kPp) == &mesh.pp());
      CHECK(mesh.group(MeshGroup::kModelParallel) == &mesh.model_parallel());
      CHECK(mesh.group(MeshGroup::kEmbedding) == mesh.embedding());
      for (const MeshGroup g : kGroups) {
        CAPTURE(mesh_group_name(g));
        check_group(mesh.group(g), r, group_of(c.groups.at(g), r));
      }
    });
  }
}

TEST_CASE("Mesh: a shape that does not fit, or differs across ranks, fails on every rank") {
  testing::run_thread_ranks(4, [&](Communicator& world) {
    std::string error;
    try {
      Mesh mesh(world, MeshShape{.pp = 1, .dp = 2, .tp = 4});
    } catch (const InvalidArgument& e) {
      error = e.what();
    }
    CHECK(error == "mesh (pp 1, dp 2, tp 4; order pp, dp, tp) needs pp x dp x tp = 8 ranks, but the world has 4");
    error.clear();
    try {
      // Rank 3 alone asks for another layout: every rank must refuse, none may wait in split().
      const MeshShape shape = world.rank() == 3 ? MeshShape{.dp = 1, .tp = 4} : MeshShape{.dp = 2, .tp = 2};
      Mesh mesh(world, shape);
    } catch (const InvalidArgument& e) {
      error = e.what();
    }
    CHECK(error.find("mesh shape differs across ranks") != std::string::npos);
    // The world still works afterwards.
    int32_t one = 1;
    world.all_reduce(&one, 1, DType::kInt32, ReduceOp::kSum)->wait();
    CHECK(one == 4);
  });
}

}  // namespace
}  // namespace zero::comm

namespace zero::comm {
namespace {

TEST_CASE("Mesh from a layout: dp follows from the world, the shard size gives the hybrid groups") {
  testing::run_thread_ranks(8, [&](Communicator& world) {
    const Mesh mesh(world, parse_layout("dp=0,tp=2,stage=2,shard=2,order=tp,pp,dp"));
    REQUIRE(mesh.layout().has_value());
    CHECK(mesh.layout()->dp == 4);
    CHECK(mesh.shape().dp == 4);
    CHECK(mesh.shape().order == MeshOrder{MeshDim::kTp, MeshDim::kPp, MeshDim::kDp});
    REQUIRE(mesh.hybrid() != nullptr);
    CHECK(mesh.hybrid()->shard()->size() == 2);
    CHECK(mesh.hybrid()->replica()->size() == 2);
    // The shard groups are consecutive dp ranks of one tp column.
    CHECK(mesh.hybrid()->shard()->rank() == mesh.dp().rank() % 2);
    // Without a shard size (or with all of dp): no hybrid groups; a mesh of a shape has no layout.
    CHECK(Mesh(world, parse_layout("dp=0,stage=1,shard=8")).hybrid() == nullptr);
    CHECK_FALSE(Mesh(world, MeshShape{.dp = 8}).layout().has_value());
  });
}

TEST_CASE("Mesh from a layout: one that differs across ranks or does not fit fails on every rank") {
  testing::run_thread_ranks(4, [&](Communicator& world) {
    auto error_of = [&](const Layout& layout) {
      try {
        Mesh mesh(world, layout);
      } catch (const InvalidArgument& e) {
        return std::string(e.what());
      }
      return std::string();
    };
    // Rank 2 alone asks for recompute: the mesh's sizes agree, the run would not.
    const std::string differs = error_of(parse_layout(world.rank() == 2 ? "tp=2,recompute" : "tp=2"));
    CHECK(differs.find("layout differs across ranks (or is refused on some): rank ") != std::string::npos);
    CHECK(error_of(parse_layout("dp=2,tp=4")) == "layout: dp 2 x tp 4 x pp 1 is 8 ranks, but the world has 4 (dp=0: what the world leaves)");
    // Refused on rank 0 alone: every rank throws, none waits in split().
    const std::string some = error_of(world.rank() == 0 ? parse_layout("dp=0,tp=3") : parse_layout("dp=0,tp=2"));
    CHECK(some.find("layout differs across ranks") != std::string::npos);
    int32_t one = 1;
    world.all_reduce(&one, 1, DType::kInt32, ReduceOp::kSum)->wait();
    CHECK(one == 4);
  });
}

}  // namespace
}  // namespace zero::comm
