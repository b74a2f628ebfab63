#pragma once
// The planner: what the engine will allocate per rank, and move per step, for a model and options at
// a world size, before any hardware is bought. It is the engine itself: a real Engine on a meta
// device (memory/meta_device.h: every buffer accounted, large ones never backed) and a planning
// communicator (comm/planning_communicator.h: identical ranks, nothing sent, bytes counted). The
// plan registers the model, finalizes and takes two steps of the loop's unit scopes with nothing
// computed (ModelSpec::schedule: by default each unit gathered for forward in order, then for
// backward in reverse, every trainable gradient asked for), so every
// buffer the stage policy wires, every lazy one and every transient peak is the engine's own, with
// no second copy of the formulas. The memory is the engine's trackers after those steps; the
// traffic is the second step's collectives. On the host backend the Gloo communicator's scratch
// comes from its own sizing code (comm::GlooScratchPlan).
//
// What it leaves out: the model's activations and the loop's own buffers (not the engine's), and on
// CUDA, NCCL's internal buffers.
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "comm/gloo/gloo_communicator.h"
#include "comm/planning_communicator.h"
#include "zero/engine_options.h"
#include "zero/grad_finalizer.h"
#include "zero/memory_report.h"
#include "zero/plan/model_spec.h"

namespace zero::plan {

struct PlanInputs {
  ModelSpec model;
  EngineOptions options;
  int world_size = 1;  // the data-parallel ranks
  int rank = 0;        // ranks differ by padding only; rank 0 holds none of the last shard's
  // Tensor parallelism: the model's tensors are one tp rank's parts (TensorSpec::tp), and the
  // engine's tp collectives (the norm's sum, partial gradients) are planned on a tp group of this
  // size (rank 0 of it: the replicated parameters' norm is counted there).
  int tp = 1;
  // Pipeline parallelism: the model is one stage's part. The norm's sum runs over a model-parallel
  // group of tp x pp, tied tensors are summed over an embedding group of 2, and the step's
  // EngineOptions::micro_batches interleave in one micro-step (every unit's backward that many
  // times); at pp 1 they are the step's micro-steps, one after another.
  int pp = 1;
  // Model parallelism's gradient finalizers over the planned tp group and, where the model has tied
  // tensors, the planned tied group (else null): parallel::model_parallel_finalizers. Required for a
  // model with split or tied tensors (zero/ plans what parallel/ registers, without knowing it).
  std::function<GradFinalizers(comm::Communicator& tp, comm::Communicator* tied)> finalizers;
  // The largest unit count over the model-parallel group (the norm's per-unit sums are sized by it):
  // other stages may hold more units than this one. 0: this stage's own.
  int model_parallel_units = 0;
  // A pipeline rank's whole micro-step, every micro-batch in its schedule's order, run once in place
  // of ModelSpec::schedule EngineOptions::micro_batches times: a rank holding several model chunks
  // (an interleaved schedule) interleaves their scopes across micro-batches. Empty: the repeat.
  std::vector<ScopeEvent> step_schedule;
  bool cuda = false;   // plan a GPU's memory (NCCL; no communicator scratch is accounted)
  comm::GlooOptions gloo;  // the host backend's settings (its scratch)
};

struct EnginePlan {
  // The engine's memory report over the planned run: current and peak by category, with the ZeRO
  // formula's prediction; the "comm (process)" row is the planned Gloo scratch.
  MemoryReport memory;
  uint64_t device_peak = 0;  // peak of the engine's device tracker, all categories together
  uint64_t host_tier_peak = 0;  // the offload tier's tracker
  uint64_t comm_scratch = 0;
  // One optimizer step's collectives, by operation ("all_gather", ...), every micro-step included.
  std::map<std::string, comm::CollectiveTally> traffic;
  // The engine's collectives over the tensor-parallel group in that step (the model's own f and g
  // are the model's, not the engine's).
  std::map<std::string, comm::CollectiveTally> tp_traffic;
  // hpZ and qgZ (EngineOptions.secondary_shard, quantized_gradients): the collectives within this
  // rank's node of node_size data-parallel ranks, and across its place on every node (0 and empty
  // without them, or when one node holds the whole group: then they are in `traffic`).
  int node_size = 0;
  std::map<std::string, comm::CollectiveTally> node_traffic, across_traffic;
  uint64_t wire_bytes() const;  // sent per rank per step
  std::string table() const;
};

EnginePlan plan_engine(const PlanInputs& in);

}  // namespace zero::plan
