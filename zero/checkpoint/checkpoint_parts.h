#pragma once
// What the engine lends the checkpointer, and what every collective checkpoint operation (save,
// load, safetensors export and import) asks of it: the rank in the whole data-parallel group, who
// writes which piece, the frozen parameters, and the agreement that turns one rank's failure into
// the same error on every rank.
#include <chrono>
#include <string>
#include <vector>

#include "comm/communicator.h"
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
  const EngineOptions* options = nullptr;
  DType model_dtype = DType::kFloat32;
  memory::Device* device = nullptr;  // for the ranks' agreement on communicators that take no host memory
};

namespace checkpoint_internal {

int global_rank(const CheckpointParts& p);  // replica-major, as Engine::rank()
int world_size(const CheckpointParts& p);
std::chrono::milliseconds timeout_of(const CheckpointParts& p);
const std::string& tensor_name(const CheckpointParts& p, size_t layout_tensor);
std::vector<int> frozen_ids(const CheckpointParts& p);  // parameters without gradients, in registration order
std::vector<char> frozen_bytes(const CheckpointParts& p, int id);
void set_frozen(const CheckpointParts& p, int id, const std::vector<char>& bytes);
// Whether this rank writes `piece` (each piece is written by exactly one rank).
bool writes(const CheckpointParts& p, const OwnedPiece& piece);
// Collective over every rank (both groups under hybrid sharding): each rank's error, "" for none,
// becomes the same IoError on every rank, naming the ranks that failed.
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
