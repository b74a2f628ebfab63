#pragma once
// Private to the engine's implementation (engine.cc, unit_scope.cc): the state behind Engine's
// pimpl. Not a public header; nothing outside zero/engine*.cc and unit_scope.cc includes it.
#include <exception>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "base/check.h"
#include "memory/device.h"
#include "optim/loss_scaler.h"
#include "zero/checkpoint/checkpoint.h"
#include "zero/collective_order.h"
#include "zero/engine.h"
#include "zero/stage_policy.h"
#include "zero/grad_finalizer.h"
#include "zero/held_grads.h"
#include "zero/replica_check.h"

namespace zero {

struct Engine::Impl {
  EngineComms comms;
  EngineOptions options;
  std::unique_ptr<memory::MemoryTracker> own_tracker;  // when the engine owns its device
  std::unique_ptr<memory::Device> own_device;
  memory::Device* device = nullptr;
  ParamRegistry registry;
  std::vector<int> tensor_param;    // layout tensor -> parameter id
  std::vector<int64_t> param_tensor;  // parameter id -> layout tensor (-1: frozen)
  ModelDtypes dtypes;  // the trainable parameters' registered dtype and the one the engine computes in
  EngineParts parts;
  std::optional<optim::DynamicLossScaler> scaler;
  bool finalized = false;
  MicroBatching micro;    // how the step's micro-batches run (sequentially until a pipeline interleaves them)
  int micro_steps = 0;    // finished micro-steps since the last step
  int no_sync_depth = 0;  // open NoSyncScopes
  int64_t steps_taken = 0;
  std::exception_ptr scope_error;  // raised by the next call after a scope's destructor failed
  // Layouts of unit buckets (stage 3, micro-batches reduced one by one): unit id -> its buckets
  // [first, end), one per dtype of its parameters.
  std::map<int, std::pair<size_t, size_t>> unit_buckets;
  std::map<int, int> open_backward;   // unit id -> its open scopes that write gradients
  std::map<int, int> backward_passes;  // unit id -> its backward passes closed this micro-step
  // unit id -> its input-gradient (kInput) and weight-gradient (kWeight) scopes opened this
  // micro-step: a W follows its B.
  std::map<int, std::pair<int, int>> split_passes;
  void clear_passes() {
    backward_passes.clear();
    split_passes.clear();
  }
  // Interleaved micro-batches reduced one by one: every backward pass of a unit (but those holding a
  // finalizer's held gradients) completes its gradients for that micro-batch.
  bool each_micro_batch() const { return micro.each_pass_reduces(); }
  HeldGrads held;  // the finalizers' (EngineComms::finalizers) held gradients
  bool evaluating = false;            // an EvaluationScope is open
  StepTimings timings, last_timings;  // the step in progress, the last one completed
  SaveStaging save_staging;                   // save_async's copy; kept between saves
  std::unique_ptr<PendingSave> pending_save;  // save_async in progress (uses save_staging)

  int world() const { return comms.shard->size() * (comms.replica ? comms.replica->size() : 1); }
  // EngineOptions::replica_check_every's checks (zero/engine_replicas.cc); rank_name: Engine::rank(),
  // as their errors name this rank. check_replicas after step `step`; at stage 3 the shard's
  // checksums recorded at the end of the step before a check (record_shard_at_rest) and compared as
  // the checked step's update begins (verify_shard_at_rest); load and import clear them.
  void check_replicas(int64_t step, int rank_name);
  void record_shard_at_rest();
  void verify_shard_at_rest(int64_t step, int rank_name);
  std::vector<ReplicaPiece> shard_pieces();
  // Throws on every rank the first non-empty verdict of any rank (after the groups agree); `named`:
  // this rank is the one at fault.
  void agree_and_throw(std::string verdict, bool named);
  // Recorded for the next step's check (a rank that owns no piece of the shard records none, and
  // must take part in the check all the same).
  std::vector<uint32_t> shard_checksums;
  bool shard_checksums_recorded = false;
  // Stage 3, in a checked step's forward: each unit bucket's checksum as gathered (first gather of
  // the step), which every rank of the shard group must agree on at the check.
  std::vector<std::pair<size_t, uint32_t>> gathered_checksums;
  // replica_check_every, or 0 on a device that holds no values (the planner's meta device: no bytes
  // to check).
  int replica_check_interval() const { return device->holds_values() ? options.replica_check_every : 0; }
  // Whether this step's training forward gathers record their checksums (the step is checked).
  bool records_gathered() const {
    const int every = replica_check_interval();
    return every > 0 && (steps_taken + 1) % every == 0;
  }
  void record_gathered(size_t bucket, const void* gathered);
  // The current micro-step reduces unless no_sync is open or it is a deferred one.
  bool syncs() const {
    if (no_sync_depth > 0) return false;
    return micro.reduce_every_micro_step || micro_steps + 1 == micro.micro_steps;
  }
  // Opens the reducer's micro-step unless one is open, telling it the step and micro-step its
  // reductions belong to (qgZ's stochastic rounding keys its draws with them).
  void open_micro_step(bool sync) {
    if (parts.reducer->micro_step_open()) return;
    parts.reducer->set_step(steps_taken, micro_steps);
    parts.reducer->begin_micro_step(sync);
  }
  void require_finalized(const char* what) {
    if (scope_error) std::rethrow_exception(std::exchange(scope_error, nullptr));
    if (!finalized) ZERO_THROW(InvalidArgument, "{}() called before finalize()", what);
  }
  size_t tensor_of(int id, const char* what) {
    require_finalized(what);
    const ParamSpec& p = registry.param(id);
    if (!p.requires_grad) {
      ZERO_THROW(InvalidArgument, "{}({}): parameter '{}' is frozen (requires_grad = false)", what, id, p.name);
    }
    if (evaluating) ZERO_THROW(InvalidArgument, "{}({}): parameter '{}' inside an evaluation scope", what, id, p.name);
    // Where parameters are sharded, a unit's gradient exists only while its backward runs.
    if (parts.gatherer && open_backward[p.unit] == 0) {
      ZERO_THROW(InvalidArgument,
                 "{}({}): parameter '{}' outside a backward scope of its unit {}: parameters are sharded "
                 "(params_resident() is false), so gradients are written inside gather_for_backward({})",
                 what, id, p.name, p.unit, p.unit);
    }
    const size_t t = static_cast<size_t>(param_tensor[static_cast<size_t>(id)]);
    open_micro_step(syncs());
    if (parts.reducer->is_ready(t)) {
      ZERO_THROW(InvalidArgument, "{}({}): parameter '{}' was already marked ready in this micro-step", what, id,
                 p.name);
    }
    return t;
  }
  static bool reads_params(const UnitScope& scope) {
    return !scope.backward() || scope.part() != BackwardPart::kWeight;
  }
  static bool writes_grads(const UnitScope& scope) {
    return scope.backward() && scope.part() != BackwardPart::kInput;
  }
  GatherUse use(const UnitScope& scope) const {
    return scope.evaluation() ? GatherUse::kEvaluation : scope.backward() ? GatherUse::kBackward : GatherUse::kForward;
  }
  void require_unit(int unit, const char* what) {
    require_finalized(what);
    if (registry.params_of_unit(unit).empty()) {
      ZERO_THROW(InvalidArgument, "{}({}): no parameter was registered with unit {}", what, unit, unit);
    }
  }
};

}  // namespace zero
