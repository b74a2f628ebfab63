#pragma once
// What a checkpoint carries besides the tensors, and what a load reports (Engine::load).
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "layout/layout.h"
#include "optim/loss_scaler.h"

namespace zero {

struct CheckpointState {
  int64_t step = 0;
  std::optional<optim::LossScalerState> scaler;
};

// What a load does where the checkpoint's optimizer is not the engine's (another kind, 8-bit
// state for fp32, Muon for AdamW).
enum class OptimizerStateLoad {
  kSame,     // the same optimizer is required (else the load fails, naming both)
  kConvert,  // each state the engine keeps is read from the saved state of its name, whatever
             // optimizer saved it (8-bit AdamW quantizes AdamW's moments; AdamW reads 8-bit AdamW's
             // dequantized ones); a state the checkpoint lacks starts anew (zeros; 8-bit AdamW's
             // absmax from the moments). The step count is kept (bias corrections go on).
  kReset,    // the master and the parameters only: every state starts anew, the optimizer's own
             // step count (bias corrections) at 0; the engine's step count (schedules) is kept
};

struct LoadOptions {
  OptimizerStateLoad optimizer_state = OptimizerStateLoad::kSame;
};

struct LoadedCheckpoint {
  CheckpointState state;
  std::string optimizer;  // the label of the optimizer that saved it ("adamw", "muon+adamw")
  std::vector<std::string> states_loaded, states_reset;  // the engine's states, as the load treated them
  int world_size = 0;  // of the run that saved it: its data-parallel size,
  int tp = 1, pp = 1;  // its model-parallel degrees
  int stage = 0;
  // The whole layout the manifest records (nullopt for checkpoints written before it had one).
  std::optional<Layout> layout;
  std::vector<std::string> user_blobs;  // by saving rank
};

}  // namespace zero
