#pragma once
// What the engine lends the checkpointer, and what every collective checkpoint operation (save,
// load, safetensors export and import) asks of it: the rank in the whole data-parallel group, who
// writes which piece, the frozen parameters, and the agreement that turns one rank's failure into
// the same error on every rank.
#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "layout/layout.h"
#include "memory/device.h"
#include "zero/engine_options.h"
#include "zero/param_registry.h"
#include "zero/param_writeback.h"
#include "zero/shard_layout.h"
#include "zero/shard_ownership.h"
#include "zero/update_applier.h"

namespace zero {

// What the engine lends the checkpointer.
struct CheckpointParts {
  const ParamRegistry* registry = nullptr;
  const std::vector<int>* tensor_param = nullptr;  // layout tensor -> parameter id
  const ShardLayout* layout = nullptr;
  const ShardOwnership* ownership = nullptr;
  UpdateApplier* applier = nullptr;
  ParamWriteback* writeback = nullptr;
  comm::Communicator* shard = nullptr;
  comm::Communicator* replica = nullptr;  // hybrid sharding; nullptr otherwise
  // Model parallelism: the registered parameters are this rank's tensor-parallel parts (tp), and the
  // engines of the other (tp, pp) coordinates (model_parallel) save into sibling directories of one
  // checkpoint. nullptr without.
  comm::Communicator* tp = nullptr;
  comm::Communicator* model_parallel = nullptr;
  const EngineOptions* options = nullptr;
  // The registered dtype of the trainable parameters, when they share one (else each piece says its own).
  std::optional<DType> model_dtype = DType::kFloat32;
  memory::Device* device = nullptr;  // for the ranks' agreement on communicators that take no host memory
  const Layout* run_layout = nullptr;  // the run's whole layout (EngineComms::layout), when it has one
};

namespace checkpoint_internal {

int global_rank(const CheckpointParts& p);  // replica-major, as Engine::rank()
int world_size(const CheckpointParts& p);
int tp_size(const CheckpointParts& p);
int tp_rank(const CheckpointParts& p);
// Whether the engines of other (tp, pp) coordinates hold the rest of the model.
bool is_model_parallel(const CheckpointParts& p);
// The whole tensor's shape of a registered parameter (its tp part's times tp along the split).
std::vector<int64_t> whole_shape(const CheckpointParts& p, const ParamSpec& spec);
std::chrono::milliseconds timeout_of(const CheckpointParts& p);
const ParamSpec& tensor_spec(const CheckpointParts& p, size_t layout_tensor);
const std::string& tensor_name(const CheckpointParts& p, size_t layout_tensor);
std::vector<int> frozen_ids(const CheckpointParts& p);  // parameters without gradients, in registration order
std::vector<char> frozen_bytes(const CheckpointParts& p, int id);
void set_frozen(const CheckpointParts& p, int id, const std::vector<char>& bytes);
// Whether this engine's checkpoint holds `spec`: a tensor-parallel part, or a tp-replicated parameter
// on tp rank 0 (the other tp ranks hold the same values).
bool saves(const CheckpointParts& p, const ParamSpec& spec);
// Whether this rank writes `piece` (each piece is written by exactly one rank).
bool writes(const CheckpointParts& p, const OwnedPiece& piece);
// Collective over every rank (both groups under hybrid sharding, then the model-parallel group, so
// every engine of the job): each rank's error, "" for none, becomes an IoError on every rank,
// naming the ranks that failed.
void agree(const CheckpointParts& p, const std::string& what, std::string error);
std::vector<std::string> state_names(const CheckpointParts& p);
ShardOptimizer& shard_optimizer(const CheckpointParts& p);

// Runs `fn` and returns its error message ("" on success), so that a rank's failure can be agreed on.
template <typename Fn>
std::string attempt(Fn&& fn) {
  try {
    fn();
    return {};
  } catch (const std::exception& e) {
    return e.what();
  }
}

}  // namespace checkpoint_internal
}  // namespace zero
