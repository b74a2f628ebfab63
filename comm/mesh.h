#pragma once
// comm::Mesh: the world communicator cut into a (pp, dp, tp) device mesh (comm/mesh_layout.h for the
// layout and the groups), with one communicator per named group, as torchtitan's DeviceMesh and
// Megatron-LM's parallel_state give them. A data-parallel engine takes dp() (with hybrid sharding,
// comm::HybridGroups over dp()); tensor-parallel layers reduce over tp(); pipeline stages send to
// their neighbours over pp(); the global gradient norm sums over model_parallel().
//
//   comm::Mesh mesh(*pg.host, zero::parse_layout("dp=2,tp=2,pp=2,stage=3,shard=1"));
//   zero::Engine engine(zero::parallel::engine_comms(mesh), options);  // parallel/engine_comms.h
//   mesh.tp().all_reduce(partial, n, DType::kFloat32, comm::ReduceOp::kSum);
//
// Built from a run's layout (layout/layout.h), the mesh also holds its hybrid sharding groups (the
// layout's shard) and the layout itself, which the engine's checkpoints record.
#include <memory>
#include <optional>

#include "comm/communicator.h"
#include "comm/hybrid_groups.h"
#include "comm/mesh_layout.h"
#include "layout/layout.h"

namespace zero::comm {

class Mesh {
 public:
  // Collective over `world` (it splits it once per group): every rank must call it with the same
  // shape. Throws InvalidArgument on every rank when the ranks' shapes differ or the shape does not
  // fit the world (MeshLayout's errors). `world` must outlive the mesh.
  Mesh(Communicator& world, const MeshShape& shape);
  // The same from a run's layout, which every rank must give alike (the whole layout is compared:
  // "layout differs across ranks: rank 1 has ..."); validate(layout) runs first. With a shard group
  // size (layout.shard below dp) it also splits dp() into hybrid sharding's groups.
  Mesh(Communicator& world, const Layout& layout);
  ~Mesh();
  Mesh(const Mesh&) = delete;
  Mesh& operator=(const Mesh&) = delete;

  const MeshLayout& mesh_layout() const { return grid_; }
  const MeshShape& shape() const { return grid_.shape(); }
  // The layout the mesh was built from, its dp resolved; nullopt for a mesh built from a MeshShape.
  const std::optional<Layout>& layout() const { return layout_; }
  MeshCoord coord() const { return coord_; }  // this rank's
  int rank_at(const MeshCoord& c) const { return grid_.rank(c); }
  // Hybrid sharding's shard and replica groups over dp(), or nullptr without a shard group size.
  const HybridGroups* hybrid() const { return hybrid_.get(); }

  Communicator& world() const { return world_; }
  Communicator& tp() const { return *tp_; }
  Communicator& dp() const { return *dp_; }
  Communicator& pp() const { return *pp_; }
  Communicator& model_parallel() const { return *model_parallel_; }
  // nullptr on the ranks of the middle pipeline stages.
  Communicator* embedding() const { return embedding_.get(); }
  // The group of this kind (nullptr only for the embedding group off its stages).
  Communicator* group(MeshGroup group) const;

 private:
  // Both public constructors, with what the ranks agreed on: a resolved layout (its shape is the
  // mesh's), or a shape alone.
  Mesh(Communicator& world, std::optional<Layout> layout, std::optional<MeshShape> shape);
  Communicator& world_;
  std::optional<Layout> layout_;
  MeshLayout grid_;
  MeshCoord coord_;
  std::unique_ptr<Communicator> tp_, dp_, pp_, model_parallel_, embedding_;
  std::unique_ptr<HybridGroups> hybrid_;
};

}  // namespace zero::comm
