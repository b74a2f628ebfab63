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

struct LoadedCheckpoint {
  CheckpointState state;
  int world_size = 0;  // of the run that saved it: its data-parallel size,
  int tp = 1, pp = 1;  // its model-parallel degrees
  int stage = 0;
  // The whole layout the manifest records (nullopt for checkpoints written before it had one).
  std::optional<Layout> layout;
  std::vector<std::string> user_blobs;  // by saving rank
};

}  // namespace zero
