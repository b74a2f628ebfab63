// EngineComms::from_mesh: the engine's groups derived from a rank's place in the device mesh.
#include "base/check.h"
#include "zero/engine.h"

namespace zero {

EngineComms EngineComms::from_mesh(const comm::Mesh& mesh, const comm::HybridGroups* hybrid, memory::Device* device) {
  if (hybrid != nullptr && hybrid->shard_group_size() * hybrid->num_shard_groups() != mesh.dp().size()) {
    ZERO_THROW(InvalidArgument, "EngineComms::from_mesh: the hybrid groups ({}) are not over the mesh's {} data-parallel ranks",
               hybrid->layout(), mesh.dp().size());
  }
  return {.shard = hybrid ? hybrid->shard() : &mesh.dp(),
          .replica = hybrid ? hybrid->replica() : nullptr,
          .device = device,
          .tp = &mesh.tp(),
          .model_parallel = &mesh.model_parallel(),
          .tied = mesh.embedding()};
}

}  // namespace zero
