#pragma once
// The sharded data-parallel engine (ZeRO stages 0, 1 and 2).
//
// A training loop changes in three places:
//
//   zero::Engine engine(*pg.host, options);
//   for (auto& p : params) ids.push_back(engine.add_param({...}));   // 1. register once
//   engine.finalize();                                                // (collective)
//   for (step...) {
//     for (micro...) {
//       forward(...);
//       backward(...);   // writes += into engine.grad(id); may call engine.grad_ready(id)  // 2.
//       engine.finish_backward();
//     }
//     engine.step();                                                  // 3. (collective)
//   }
//
// Gradient storage. engine.grad(id) is where backward accumulates (+=) the gradient of one
// parameter, in the parameter's dtype; the engine zeroes it when it consumes it. At stages 0 and 1
// the pointer is stable (a view into the flat gradient buffer). At stage 2 only the rank's gradient
// shard is kept, so the pointer is valid from the first grad(id) of a micro-step until grad_ready(id)
// or finish_backward(): take it right before computing that gradient. A parameter registered with
// its own gradient storage (ParamSpec::grad) keeps it at every stage; the engine copies from it and
// zeroes it.
//
// Communication. When every tensor of a bucket is ready (grad_ready) its reduction starts on the
// communicator's worker thread while backward goes on. Buckets are issued in descending order on
// every rank, so ranks always agree on the collective sequence.
#include <array>
#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "memory/buffer.h"
#include "optim/loss_scaler.h"
#include "optim/optimizer.h"
#include "zero/engine_options.h"
#include "zero/memory_report.h"
#include "zero/param_registry.h"
#include "zero/shard_layout.h"

namespace zero {

struct StepResult {
  int64_t step = 0;           // optimizer steps taken so far (skipped ones excluded)
  bool skipped = false;       // inf/NaN gradients: no update on any rank
  double grad_norm = 0.0;     // global L2 norm of the averaged, unscaled gradient (before clipping)
  float clip_coefficient = 1.0f;
  float loss_scale = 1.0f;    // the scale used for this step's gradients
  int micro_steps = 0;
};

// RAII scope around a unit's forward or backward. Stage 3 gathers the unit's parameters here; at
// stages 0-2 parameters are always resident and the scope does nothing.
class GatherScope {
 public:
  GatherScope() = default;
};

class Engine {
 public:
  // The communicator must outlive the engine and be used by nobody else while it runs collectives.
  Engine(comm::Communicator& comm, EngineOptions options);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Registers a parameter (before finalize). Local problems are raised by finalize() on every rank.
  int add_param(const ParamSpec& spec);
  // Collective: checks that all ranks registered the same parameters, builds the layout, allocates
  // shards, broadcasts rank 0's initial values into every rank's parameters.
  void finalize();
  bool finalized() const { return finalized_; }

  // Where backward accumulates the gradient of parameter `id` (see the header comment).
  void* grad(int id);
  template <typename T>
  T* grad_as(int id) {
    return static_cast<T*>(grad(id));
  }
  // Optional: the gradient of `id` is complete for this micro-step; its bucket may start reducing.
  void grad_ready(int id);
  // Ends the backward of one micro-step: reduces what is still pending and waits for it.
  void finish_backward();
  // Collective: clips, updates the shards and gathers the new parameters into every rank's storage.
  // Afterwards all gradients are zero. Finishes the current micro-step first if needed.
  StepResult step();
  // Drops every gradient accumulated since the last step.
  void zero_grad();

  GatherScope gather(int unit);
  GatherScope gather_for_backward(int unit);

  // Multiply the loss (its gradient seed) by this before backward.
  float loss_scale() const;
  optim::Optimizer& optimizer();
  const ShardLayout& layout() const;
  const ParamRegistry& registry() const { return registry_; }
  const EngineOptions& options() const { return options_; }
  int rank() const { return rank_; }
  int world_size() const { return world_; }
  int64_t steps_taken() const { return steps_taken_; }

  MemoryReport memory_report() const;

 private:
  struct Slot;         // buffers for one in-flight bucket reduction
  struct BucketState;  // per-bucket progress within a micro-step

  // The part of bucket b this rank reduces into and updates: the whole bucket at stage 0, the
  // rank's chunk above it.
  struct OwnedRange {
    size_t opt_begin;   // offset in the optimizer space (master, accumulator)
    size_t len;
    size_t flat_begin;  // offset in the flat gradient/parameter space
  };
  OwnedRange owned(size_t b) const;
  size_t optimizer_numel() const;
  void require_finalized(const char* what) const;
  void require_param(int id, const char* what) const;
  size_t tensor_of(int id) const;
  bool reduces_now() const;  // communication this micro-step (false while no_sync defers it)
  DType grad_source_dtype() const;

  void broadcast_initial_values();
  void init_master();
  void build_optimizer();

  int acquire_slot();
  void release_slot(int slot);
  void* bucket_grad_buffer(size_t b);  // model-dtype gradient of bucket b (flat view or staging)
  void stage_tensor(size_t t);         // moves tensor t's gradient into its bucket(s)
  void mark_tensor_ready(size_t t);
  void launch_ready_buckets();
  void launch(size_t b);
  void complete(size_t b);
  void complete_all();
  void reduce_launched_buckets();
  void reduce_deferred();
  void reset_micro_step_state();

  const void* optimizer_grad(size_t b, DType* dtype) const;
  double global_sum_of_squares();
  void update_and_gather(float grad_scale);
  void scatter_bucket_to_params(size_t b, const void* bucket_params);
  void clear_gradients();

  comm::Communicator& comm_;
  EngineOptions options_;
  int rank_ = 0;
  int world_ = 1;
  ParamRegistry registry_;
  bool finalized_ = false;

  std::vector<int> tensor_param_;         // layout tensor index -> parameter id
  std::vector<int64_t> param_tensor_;     // parameter id -> layout tensor index (-1: frozen)
  DType model_dtype_ = DType::kFloat32;
  std::unique_ptr<ShardLayout> layout_;
  std::unique_ptr<optim::Optimizer> optimizer_;
  std::optional<optim::DynamicLossScaler> scaler_;

  memory::HostBuffer master_;       // fp32 master weights of the optimizer space
  memory::HostBuffer flat_grad_;    // stages 0/1: full gradients, model dtype
  memory::HostBuffer accum_;        // shard (or, stage 0, full) accumulator; stage 2 gradient shard
  DType accum_dtype_ = DType::kFloat32;
  std::vector<memory::HostBuffer> scratch_;  // stage 2: gradients of tensors spanning buckets
  std::vector<std::unique_ptr<Slot>> slots_;
  std::vector<int> free_slots_;
  std::vector<BucketState> buckets_;
  std::vector<char> tensor_ready_;
  size_t next_launch_ = 0;          // buckets are launched in descending order; count launched
  std::vector<size_t> inflight_;    // launched, not completed, in launch order
  std::array<memory::HostBuffer, 2> gather_;  // parameter all-gather double buffer

  int micro_steps_ = 0;             // finished micro-steps since the last step
  bool backward_open_ = false;      // gradients touched since the last finish_backward
  bool accum_has_data_ = false;     // accumulator written since the last step
  bool deferred_ = false;           // no_sync micro-steps accumulated locally, not yet reduced
  int64_t steps_taken_ = 0;
};

}  // namespace zero
