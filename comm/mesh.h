#pragma once
// comm::Mesh: the world communicator cut into a (pp, dp, tp) device mesh (comm/mesh_layout.h for the
// layout and the groups), with one communicator per named group, as torchtitan's DeviceMesh and
// Megatron-LM's parallel_state give them. A data-parallel engine takes dp() (with hybrid sharding,
// comm::HybridGroups over dp()); tensor-parallel layers reduce over tp(); pipeline stages send to
// their neighbours over pp(); the global gradient norm sums over model_parallel().
//
//   comm::Mesh mesh(*pg.host, {.pp = 2, .dp = 2, .tp = 2});
//   zero::Engine engine(zero::parallel::engine_comms(mesh), options);  // parallel/engine_comms.h
//   mesh.tp().all_reduce(partial, n, DType::kFloat32, comm::ReduceOp::kSum);
#include <memory>

#include "comm/communicator.h"
#include "comm/mesh_layout.h"

namespace zero::comm {

class Mesh {
 public:
  // Collective over `world` (it splits it once per group): every rank must call it with the same
  // shape. Throws InvalidArgument on every rank when the ranks' shapes differ or the shape does not
  // fit the world (MeshLayout's errors). `world` must outlive the mesh.
  Mesh(Communicator& world, const MeshShape& shape);
  ~Mesh();
  Mesh(const Mesh&) = delete;
  Mesh& operator=(const Mesh&) = delete;

  const MeshLayout& layout() const { return layout_; }
  const MeshShape& shape() const { return layout_.shape(); }
  MeshCoord coord() const { return coord_; }  // this rank's
  int rank_at(const MeshCoord& c) const { return layout_.rank(c); }

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
  Communicator& world_;
  MeshLayout layout_;
  MeshCoord coord_;
  std::unique_ptr<Communicator> tp_, dp_, pp_, model_parallel_, embedding_;
};

}  // namespace zero::comm
