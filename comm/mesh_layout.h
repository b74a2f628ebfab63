#pragma once
// The arithmetic of a (pp, dp, tp) device mesh, without communication: each rank's coordinates, the
// rank at any coordinates, and the members of every named group. comm::Mesh builds its
// communicators from it; the planner and the tests use it alone.
//
// The world is cut in the shape's order, slowest-varying dimension first. The default order
// (pp, dp, tp) makes tp fastest: tensor-parallel peers are consecutive ranks, which launchers place on
// one node, so the all-reduces of every layer stay on its fast links; then dp, then pp (pipeline
// stages exchange one activation per micro-batch and tolerate slow links). World 8 as (2, 2, 2):
//
//   rank   0 1 2 3 4 5 6 7
//   pp     0 0 0 0 1 1 1 1
//   dp     0 0 1 1 0 0 1 1
//   tp     0 1 0 1 0 1 0 1
//
// Groups (Megatron-LM's parallel_state names): tp, dp, pp (the ranks differing only in that
// coordinate), model-parallel (tp x pp: same dp; the global gradient norm and the overflow check),
// and embedding (the first and the last pipeline stage of one (dp, tp) column: tied input and output
// embeddings; a single rank when pp is 1; ranks of the middle stages belong to none).
// A rank's place in every group follows its world rank.
#include <array>
#include <string>
#include <vector>

#include "layout/layout.h"

namespace zero::comm {

// The dimensions and their order are the run layout's (layout/layout.h).
using ::zero::MeshDim;
using ::zero::mesh_dim_name;
using ::zero::MeshOrder;
using ::zero::parse_mesh_order;

enum class MeshGroup { kTp, kDp, kPp, kModelParallel, kEmbedding };
const char* mesh_group_name(MeshGroup group);  // "tp", "dp", "pp", "model-parallel", "embedding"

struct MeshShape {
  int pp = 1, dp = 1, tp = 1;
  // Slowest-varying first; a permutation of the three dimensions.
  MeshOrder order = Layout{}.order;

  // The mesh of a run's layout: its dp, tp, pp and order.
  static MeshShape of(const Layout& layout) { return {layout.pp, layout.dp, layout.tp, layout.order}; }
  int size(MeshDim dim) const;
  int world_size() const { return pp * dp * tp; }
  std::string describe() const;  // "(pp 2, dp 2, tp 2; order pp, dp, tp)"
};

struct MeshCoord {
  int pp = 0, dp = 0, tp = 0;
  int& operator[](MeshDim dim);
  int operator[](MeshDim dim) const;
  bool operator==(const MeshCoord&) const = default;
};

class MeshLayout {
 public:
  // Throws InvalidArgument naming the sizes when a size is not positive, the order is not a
  // permutation of (pp, dp, tp), or world_size is not pp x dp x tp.
  MeshLayout(const MeshShape& shape, int world_size);

  const MeshShape& shape() const { return shape_; }
  int world_size() const { return shape_.world_size(); }
  MeshCoord coord(int rank) const;     // InvalidArgument for a rank outside the world
  int rank(const MeshCoord& c) const;  // InvalidArgument for a coordinate outside the shape
  // Whether `rank` belongs to a group of this kind (only the embedding group leaves ranks out).
  bool in_group(MeshGroup group, int rank) const;
  // The members of the group of this kind that holds `rank`, in world rank order (empty when
  // in_group is false).
  std::vector<int> group_ranks(MeshGroup group, int rank) const;
  // The split() color of `rank`'s group: the lowest world rank in it, or -1 when it is in none.
  int group_color(MeshGroup group, int rank) const;

 private:
  std::vector<MeshDim> varying(MeshGroup group) const;  // the coordinates that differ within a group
  MeshShape shape_;
};

}  // namespace zero::comm
