#include "comm/mesh_layout.h"

#include <fmt/format.h>

#include <algorithm>

#include "base/check.h"

namespace zero::comm {

const char* mesh_group_name(MeshGroup group) {
  switch (group) {
    case MeshGroup::kTp: return "tp";
    case MeshGroup::kDp: return "dp";
    case MeshGroup::kPp: return "pp";
    case MeshGroup::kModelParallel: return "model-parallel";
    case MeshGroup::kEmbedding: return "embedding";
  }
  return "?";
}

int MeshShape::size(MeshDim dim) const {
  switch (dim) {
    case MeshDim::kPp: return pp;
    case MeshDim::kDp: return dp;
    case MeshDim::kTp: return tp;
  }
  return 0;
}

std::string MeshShape::describe() const {
  return fmt::format("(pp {}, dp {}, tp {}; order {}, {}, {})", pp, dp, tp, mesh_dim_name(order[0]),
                     mesh_dim_name(order[1]), mesh_dim_name(order[2]));
}

int& MeshCoord::operator[](MeshDim dim) { return dim == MeshDim::kPp ? pp : dim == MeshDim::kDp ? dp : tp; }

int MeshCoord::operator[](MeshDim dim) const { return dim == MeshDim::kPp ? pp : dim == MeshDim::kDp ? dp : tp; }

MeshLayout::MeshLayout(const MeshShape& shape, int world_size) : shape_(shape) {
  if (shape.pp < 1 || shape.dp < 1 || shape.tp < 1) {
    ZERO_THROW(InvalidArgument, "mesh {}: every size must be at least 1", shape.describe());
  }
  std::array<MeshDim, 3> sorted = shape.order;
  std::sort(sorted.begin(), sorted.end());
  if (sorted != std::array<MeshDim, 3>{MeshDim::kPp, MeshDim::kDp, MeshDim::kTp}) {
    ZERO_THROW(InvalidArgument, "mesh {}: the order must name pp, dp and tp once each", shape.describe());
  }
  // Sizes beyond any world would overflow the product; they fail the same check.
  const int64_t product = int64_t{shape.pp} * shape.dp * shape.tp;
  if (product != world_size) {
    ZERO_THROW(InvalidArgument, "mesh {} needs pp x dp x tp = {} ranks, but the world has {}", shape.describe(),
               product, world_size);
  }
}

MeshCoord MeshLayout::coord(int rank) const {
  if (rank < 0 || rank >= world_size()) {
    ZERO_THROW(InvalidArgument, "rank {} is outside the mesh {} of {} ranks", rank, shape_.describe(), world_size());
  }
  MeshCoord c;
  int rest = rank;
  for (int i = 2; i >= 0; --i) {  // fastest-varying last in the order
    const MeshDim d = shape_.order[static_cast<size_t>(i)];
    c[d] = rest % shape_.size(d);
    rest /= shape_.size(d);
  }
  return c;
}

int MeshLayout::rank(const MeshCoord& c) const {
  int r = 0;
  for (const MeshDim d : shape_.order) {
    if (c[d] < 0 || c[d] >= shape_.size(d)) {
      ZERO_THROW(InvalidArgument, "coordinate {} {} is outside the mesh {}", mesh_dim_name(d), c[d],
                 shape_.describe());
    }
    r = r * shape_.size(d) + c[d];
  }
  return r;
}

std::vector<MeshDim> MeshLayout::varying(MeshGroup group) const {
  switch (group) {
    case MeshGroup::kTp: return {MeshDim::kTp};
    case MeshGroup::kDp: return {MeshDim::kDp};
    case MeshGroup::kPp: return {MeshDim::kPp};
    case MeshGroup::kModelParallel: return {MeshDim::kPp, MeshDim::kTp};
    case MeshGroup::kEmbedding: return {MeshDim::kPp};
  }
  return {};
}

bool MeshLayout::in_group(MeshGroup group, int rank) const {
  const MeshCoord c = coord(rank);  // also checks the rank
  return group != MeshGroup::kEmbedding || c.pp == 0 || c.pp == shape_.pp - 1;
}

std::vector<int> MeshLayout::group_ranks(MeshGroup group, int rank) const {
  std::vector<int> ranks;
  if (!in_group(group, rank)) return ranks;
  const MeshCoord mine = coord(rank);
  for (int r = 0; r < world_size(); ++r) {
    if (!in_group(group, r)) continue;
    MeshCoord c = coord(r);
    for (const MeshDim d : varying(group)) c[d] = mine[d];
    if (c == mine) ranks.push_back(r);
  }
  return ranks;
}

int MeshLayout::group_color(MeshGroup group, int rank) const {
  const std::vector<int> ranks = group_ranks(group, rank);
  return ranks.empty() ? -1 : ranks.front();
}

}  // namespace zero::comm
