#include "comm/mesh.h"

#include <cstdint>
#include <vector>

#include "base/check.h"

namespace zero::comm {
namespace {

// `shape`, once every rank is known to hold the same: the ranks agree before anything can throw, as
// a rank that refused alone would leave the others waiting in split(). One all-reduce of each field's
// maximum and negated minimum.
const MeshShape& agreed(Communicator& world, const MeshShape& shape) {
  const std::vector<int64_t> fields = {shape.pp, shape.dp, shape.tp, static_cast<int64_t>(shape.order[0]),
                                       static_cast<int64_t>(shape.order[1]), static_cast<int64_t>(shape.order[2])};
  std::vector<int64_t> extremes;
  for (const int64_t f : fields) extremes.push_back(f);
  for (const int64_t f : fields) extremes.push_back(-f);
  world.all_reduce(extremes.data(), extremes.size(), DType::kInt64, ReduceOp::kMax)->wait();
  for (size_t i = 0; i < fields.size(); ++i) {
    if (extremes[i] != -extremes[fields.size() + i]) {
      ZERO_THROW(InvalidArgument, "mesh shape differs across ranks: rank {} has {}", world.rank(), shape.describe());
    }
  }
  return shape;
}

}  // namespace

Mesh::Mesh(Communicator& world, const MeshShape& shape)
    : world_(world), layout_(agreed(world, shape), world.size()),
      coord_(layout_.coord(world.rank())) {
  // Every rank splits for every group in the same order; a rank's place in a group follows its world
  // rank (the key).
  const int rank = world.rank();
  auto split = [&](MeshGroup g) { return world.split(layout_.group_color(g, rank), rank); };
  tp_ = split(MeshGroup::kTp);
  dp_ = split(MeshGroup::kDp);
  pp_ = split(MeshGroup::kPp);
  model_parallel_ = split(MeshGroup::kModelParallel);
  embedding_ = split(MeshGroup::kEmbedding);
}

Mesh::~Mesh() = default;

Communicator* Mesh::group(MeshGroup group) const {
  switch (group) {
    case MeshGroup::kTp: return tp_.get();
    case MeshGroup::kDp: return dp_.get();
    case MeshGroup::kPp: return pp_.get();
    case MeshGroup::kModelParallel: return model_parallel_.get();
    case MeshGroup::kEmbedding: return embedding_.get();
  }
  return nullptr;
}

}  // namespace zero::comm
