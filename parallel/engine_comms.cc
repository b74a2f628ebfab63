#include "parallel/engine_comms.h"

#include <memory>

#include "base/check.h"
#include "parallel/pipeline/tied_grads.h"
#include "parallel/tensor/tp_grads.h"

namespace zero::parallel {

GradFinalizers model_parallel_finalizers(comm::Communicator& tp, comm::Communicator* tied) {
  GradFinalizers f{std::make_shared<TpGrads>(tp)};
  if (tied != nullptr) f.push_back(std::make_shared<TiedGrads>(*tied));
  return f;
}

EngineComms engine_comms(const comm::Mesh& mesh, const comm::HybridGroups* hybrid, memory::Device* device) {
  if (hybrid != nullptr && mesh.hybrid() != nullptr) {
    ZERO_THROW(InvalidArgument, "engine_comms: hybrid groups given ({}) beside the mesh's own (its layout's shard={})",
               hybrid->layout(), mesh.layout()->shard);
  }
  if (hybrid == nullptr) hybrid = mesh.hybrid();
  if (hybrid != nullptr && hybrid->shard_group_size() * hybrid->num_shard_groups() != mesh.dp().size()) {
    ZERO_THROW(InvalidArgument, "engine_comms: the hybrid groups ({}) are not over the mesh's {} data-parallel ranks",
               hybrid->layout(), mesh.dp().size());
  }
  return {.shard = hybrid ? hybrid->shard() : &mesh.dp(),
          .replica = hybrid ? hybrid->replica() : nullptr,
          .device = device,
          .model_parallel = &mesh.model_parallel(),
          .finalizers = model_parallel_finalizers(mesh.tp(), mesh.embedding()),
          .layout = mesh.layout()};
}

}  // namespace zero::parallel
