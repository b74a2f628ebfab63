// Engine::save / load / export_safetensors: the engine lends its parts to the Checkpointer.
#include <fmt/format.h>

#include "base/check.h"
#include "base/logging.h"
#include "zero/checkpoint/checkpoint.h"
#include "zero/engine.h"
#include "zero/engine_groups.h"
#include "zero/engine_impl.h"

namespace zero {

CheckpointState Engine::checkpoint_state() const {
  CheckpointState state;
  state.step = impl_->steps_taken;
  if (impl_->scaler) state.scaler = impl_->scaler->state();
  return state;
}

CheckpointParts Engine::checkpoint_parts() {
  Impl& m = *impl_;
  return {&m.registry,
          &m.tensor_param,
          m.parts.layout.get(),
          m.parts.ownership.get(),
          &m.parts.update->applier(),
          m.parts.writeback.get(),
          m.comms.shard,
          m.comms.replica,
          split_group(m.comms),
          m.comms.model_parallel,
          &m.options,
          m.dtypes.storage,
          m.device,
          m.comms.layout ? &*m.comms.layout : nullptr};
}

void Engine::save(const std::string& dir, std::string_view user_blob) {
  impl_->require_finalized("save");
  wait_for_save();
  save_checkpoint(checkpoint_parts(), checkpoint_state(), dir, user_blob);
}

void Engine::save_async(const std::string& dir, std::string_view user_blob, const NodeCopies* node_copies) {
  impl_->require_finalized("save_async");
  wait_for_save();
  impl_->pending_save = std::make_unique<PendingSave>(checkpoint_parts(), checkpoint_state(), dir, user_blob,
                                                      &impl_->save_staging, node_copies);
}

void Engine::wait_for_save() {
  Impl& m = *impl_;
  m.require_finalized("wait_for_save");
  if (!m.pending_save) return;
  std::unique_ptr<PendingSave> pending = std::move(m.pending_save);
  pending->wait(checkpoint_parts());
}

void Engine::release_save_staging() {
  wait_for_save();
  impl_->save_staging.release();
}

size_t Engine::save_staging_bytes() const { return impl_->save_staging.reserved_bytes(); }

LoadedCheckpoint Engine::load(const std::string& dir, const LoadOptions& options) {
  return load(std::vector<std::string>{dir}, options);
}

LoadedCheckpoint Engine::load(const std::vector<std::string>& dirs, const LoadOptions& options) {
  Impl& m = *impl_;
  m.require_finalized("load");
  wait_for_save();
  zero_grad();
  LoadedCheckpoint c = load_checkpoint(checkpoint_parts(), dirs, options);
  const std::string& dir = dirs.front();
  if (m.parts.gatherer) m.parts.gatherer->invalidate();
  m.shard_checksums_recorded = false;  // the shard was rewritten: nothing carried
  m.steps_taken = c.state.step;
  const bool reset = options.optimizer_state == OptimizerStateLoad::kReset;
  m.parts.update->optimizer().set_step_count(reset ? 0 : c.state.step);
  const std::string runs = optim::optimizer_label(m.options.optimizer);
  if (reset || c.optimizer != runs || !c.states_reset.empty()) {
    ZERO_LOG_INFO("checkpoint '{}' (optimizer {}) into {}: {}; started anew: {}{}", dir, c.optimizer, runs,
                  c.states_loaded.empty() ? "no state read" : fmt::format("read {}", fmt::join(c.states_loaded, ", ")),
                  c.states_reset.empty() ? "none" : fmt::format("{}", fmt::join(c.states_reset, ", ")),
                  reset ? " (the optimizer's step count at 0)" : "");
  }
  if (m.scaler && c.state.scaler) {
    m.scaler->set_state(*c.state.scaler);
  } else if (m.scaler || c.state.scaler) {
    ZERO_LOG_WARN("checkpoint '{}': the loss scaler {}; the engine keeps its own setting", dir,
                  m.scaler ? "was not saved (no dynamic loss scaling then)" : "state is ignored (no dynamic loss scaling now)");
  }
  return c;
}

void Engine::export_safetensors(const std::string& path, DType dtype) {
  Impl& m = *impl_;
  m.require_finalized("export_safetensors");
  ::zero::export_safetensors(checkpoint_parts(), path, dtype);
}

void Engine::import_safetensors(const std::string& path, const std::map<std::string, std::string>& name_map) {
  Impl& m = *impl_;
  m.require_finalized("import_safetensors");
  wait_for_save();
  ::zero::import_safetensors(checkpoint_parts(), path, name_map);
  if (m.parts.gatherer) m.parts.gatherer->invalidate();
  m.shard_checksums_recorded = false;  // the shard was rewritten: nothing carried
}

}  // namespace zero
