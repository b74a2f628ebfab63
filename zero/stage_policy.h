#pragma once
// The stage policy: the one place that knows what a ZeRO stage means. Called once, at
// Engine::finalize(), it chooses the ownership, the reducer's buffers, the parameter writeback and
// builds the parts; from then on no part asks for the stage.
//
//   stage  ownership   gradients (GradReducer)                          writeback
//   0      replicated  full buffer, all-reduce; accumulator if K > 1    local
//   1      sharded     full buffer, reduce-scatter; accumulator if K>1  all-gather
//   2      sharded     bucket staging, reduce-scatter into the shard    all-gather
//                      accumulator (full buffer only under no_sync)
//   3      sharded     as stage 2, one bucket per unit                  into the parameter shard;
//                                                                       units gathered by ParamGatherer
// (K: micro-steps per step, when each is reduced.) Independently of the stage, the optimizer runs on
// the device (master and state beside the gradients) or offloaded (OffloadPipeline). Every stage lays tensors out grouped by unit,
// each unit starting on a block, so block-wise norms agree bit for bit across stages.
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "comm/hybrid_groups.h"
#include "memory/device.h"
#include "zero/engine_options.h"
#include "zero/grad_finalizer.h"
#include "zero/grad_reducer.h"
#include "zero/memory_report.h"
#include "zero/offload_pipeline.h"
#include "zero/param_gatherer.h"
#include "zero/param_registry.h"
#include "zero/param_writeback.h"
#include "zero/shard_layout.h"
#include "zero/shard_ownership.h"
#include "zero/sharded_update.h"

namespace zero {

struct EngineParts {
  // Optimizer offload: the host tier's tracker (master, state, staging, the stage 3 parameter shard
  // with parameter offload); first, so that it outlives every part that allocates from it.
  std::unique_ptr<memory::MemoryTracker> offload_tracker;
  std::unique_ptr<ShardLayout> layout;
  std::unique_ptr<ShardOwnership> ownership;
  // hpZ and qgZ (EngineOptions.secondary_shard, quantized_gradients): the shard group cut into
  // nodes; shard() is this rank's node, replica() its peers of the same place on the other nodes
  // (null on one node). Before the parts that use it, so that it outlives them.
  std::unique_ptr<comm::HybridGroups> nodes;
  std::unique_ptr<GradReducer> reducer;
  std::unique_ptr<ParamGatherer> gatherer;  // stage 3 only; outlives the writeback that writes its shard
  std::unique_ptr<ParamWriteback> writeback;
  std::unique_ptr<ShardedUpdate> update;
  MemoryFormulaInputs formula;  // the ZeRO formula this wiring should meet (memory report)
};

// The trainable parameters' dtypes: each as registered (ParamSpec.dtype: the user's storage, and the
// parameters that checkpoints and exports hold) and as the engine works with it (the stage 3 shard,
// the gathered units, the gradients): ParamSpec.param_dtype, else EngineOptions.param_dtype, else the
// registered one.
// Parameters may mix dtypes (fp32 LayerNorm and biases beside bf16 matrices): the layout gives each
// dtype buckets of its own.
struct ModelDtypes {
  std::optional<DType> param_dtype;  // EngineOptions.param_dtype
  std::optional<DType> storage;      // the registered dtype, when every trainable parameter has the same
  DType compute(const ParamSpec& p) const { return p.param_dtype.value_or(param_dtype.value_or(p.dtype)); }
};

// How the engine runs a step's micro-batches, resolved from EngineOptions::micro_batches and its two
// policies: one after another, each a micro-step closed by finish_backward(), or interleaved within
// one micro-step by a pipeline (Engine::interleave_micro_batches). The two are the same axis to the
// user; inside, accumulation counts micro-steps (and reduces at their ends, or defers all but the
// last as no_sync does) while a pipeline counts each unit's backward passes (and holds a unit's
// gradient until its last pass, or completes it at every one).
struct MicroBatching {
  bool interleaved = false;
  int micro_steps = 1;             // finish_backward() calls per step, at most
  int passes = 1;                  // each unit's backward passes per micro-step
  bool reduce_every_micro_step = true;  // one after another: each micro-step reduces (else the last)
  bool reduce_each_pass = false;        // interleaved: each pass completes its unit's gradients
  bool keep_gathered = false;           // interleaved stage 3: units stay gathered through the step
  bool each_pass_reduces() const { return reduce_each_pass && passes > 1; }
};
// InvalidArgument naming the option for a policy the mode cannot run: micro_batch_gather once with
// micro-batches one after another; micro_batch_reduce each under a pipeline below stage 2.
MicroBatching micro_batching(const EngineOptions& options, bool interleaved);

struct PolicyInputs {
  const EngineOptions* options = nullptr;
  MicroBatching micro;
  const ParamRegistry* registry = nullptr;
  std::vector<int> tensor_param;  // layout tensor -> parameter id (trainable, grouped by unit)
  ModelDtypes dtypes;
  comm::Communicator* shard = nullptr;
  comm::Communicator* replica = nullptr;
  memory::Device* device = nullptr;
  StepTimings* timings = nullptr;
  comm::Communicator* norm_group = nullptr;  // the global norm's sum (null: the data-parallel ranks')
  GradFinalizers finalizers;  // EngineComms::finalizers
};

// Problems of the registration that only the options reveal (a group index past the optimizer's
// groups, a param dtype that does not fit the registered dtypes, reduce/accumulate dtypes that do not
// fit the dtypes gradients are written in), for the registry's cross-rank report.
// Returns the dtypes when there are trainable parameters.
std::optional<ModelDtypes> check_registration(const EngineOptions& options, ParamRegistry& registry);

// The layout's order of the trainable parameters (layout tensor -> parameter id): grouped by unit
// (units in order of first registration), and within a unit by the dtype the engine works in
// (dtypes in order of first appearance in the unit), so that a unit of two dtypes is two buckets,
// not one per dtype change (ShardLayout).
std::vector<int> layout_tensor_order(const ParamRegistry& registry, const ModelDtypes& dtypes);

EngineParts wire_stage(const PolicyInputs& in);

// Throws InvalidArgument when the stage cannot run on the given communicators (hybrid sharding needs
// a sharded stage).
void check_topology(const EngineOptions& options, bool has_replica);

}  // namespace zero
