#include "comm/mesh.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/check.h"

namespace zero::comm {
namespace {

// Every rank holds the same values: one all-reduce of each one's maximum and negated minimum.
bool same_everywhere(Communicator& world, const std::vector<int64_t>& fields) {
  std::vector<int64_t> extremes;
  for (const int64_t f : fields) extremes.push_back(f);
  for (const int64_t f : fields) extremes.push_back(-f);
  world.all_reduce(extremes.data(), extremes.size(), DType::kInt64, ReduceOp::kMax)->wait();
  for (size_t i = 0; i < fields.size(); ++i) {
    if (extremes[i] != -extremes[fields.size() + i]) return false;
  }
  return true;
}

// `shape`, once every rank is known to hold the same: the ranks agree before anything can throw, as
// a rank that refused alone would leave the others waiting in split().
const MeshShape& agreed(Communicator& world, const MeshShape& shape) {
  const std::vector<int64_t> fields = {shape.pp, shape.dp, shape.tp, static_cast<int64_t>(shape.order[0]),
                                       static_cast<int64_t>(shape.order[1]), static_cast<int64_t>(shape.order[2])};
  if (!same_everywhere(world, fields)) {
    ZERO_THROW(InvalidArgument, "mesh shape differs across ranks: rank {} has {}", world.rank(), shape.describe());
  }
  return shape;
}

// The same for a whole layout (its text's FNV-1a digest), checked valid on every rank first, the
// ranks agreeing on whether it is before one throws.
Layout agreed(Communicator& world, const Layout& given, int world_size) {
  std::string invalid;
  Layout layout = given;
  try {
    layout = with_world(given, world_size, "layout");
  } catch (const InvalidArgument& e) {
    invalid = e.what();
  }
  uint64_t digest = 14695981039346656037ull;
  for (const char c : layout_text(layout)) digest = (digest ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  if (!same_everywhere(world, {static_cast<int64_t>(digest >> 1), invalid.empty() ? 0 : 1})) {
    ZERO_THROW(InvalidArgument, "layout differs across ranks (or is refused on some): rank {} has {}{}", world.rank(),
               describe(layout), invalid.empty() ? "" : " (" + invalid + ")");
  }
  if (!invalid.empty()) ZERO_THROW(InvalidArgument, "{}", invalid);
  return layout;
}

}  // namespace

Mesh::Mesh(Communicator& world, const MeshShape& shape) : Mesh(world, std::nullopt, agreed(world, shape)) {}

Mesh::Mesh(Communicator& world, const Layout& layout) : Mesh(world, agreed(world, layout, world.size()), std::nullopt) {}

Mesh::Mesh(Communicator& world, std::optional<Layout> layout, std::optional<MeshShape> shape)
    : world_(world),
      layout_(std::move(layout)),  // declared before grid_, which reads it
      grid_(layout_ ? MeshShape::of(*layout_) : *shape, world.size()),
      coord_(grid_.coord(world.rank())) {
  // Every rank splits for every group in the same order; a rank's place in a group follows its world
  // rank (the key).
  const int rank = world.rank();
  auto split = [&](MeshGroup g) { return world.split(grid_.group_color(g, rank), rank); };
  tp_ = split(MeshGroup::kTp);
  dp_ = split(MeshGroup::kDp);
  pp_ = split(MeshGroup::kPp);
  model_parallel_ = split(MeshGroup::kModelParallel);
  embedding_ = split(MeshGroup::kEmbedding);
  if (layout_ && layout_->shard_group_size() != layout_->dp) hybrid_ = std::make_unique<HybridGroups>(*dp_, layout_->shard);
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
