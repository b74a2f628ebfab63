#pragma once
// The sharded data-parallel engine (ZeRO stages 0 to 3; docs/design.md, "Engine internals").
//
// A training loop changes in three places, and the same loop runs at every stage:
//
//   zero::Engine engine(*pg.host, options);
//   for (auto& p : params) ids.push_back(engine.add_param({..., .unit = block}));  // 1. register
//   engine.finalize();                                                             // (collective)
//   for (step...) {
//     for (micro...) {
//       for (block...) { auto s = engine.gather(block); forward(block); }
//       for (block... reversed) {
//         auto s = engine.gather_for_backward(block);
//         backward(block);            // 2. += into engine.grad(id) for the block's parameters
//       }                             //    leaving the scope: the block's gradients are complete
//       engine.finish_backward();
//     }
//     engine.step();                                                               // 3. (collective)
//   }
//
// Micro-batches. A step is EngineOptions::micro_batches = M micro-batches: the loop above runs them
// one after another, each closed by finish_backward(); a pipeline (parallel/pipeline) runs them
// interleaved within one micro-step (interleave_micro_batches), each unit's backward scope closing
// M times before its gradients are complete (BackwardPart splits a backward into its input and
// weight parts). EngineOptions::micro_batch_reduce and micro_batch_gather say how units reduce and
// gather across them, whichever way they run.
//
// Where gradients go (one rule at every stage). engine.grad(id) is where backward accumulates (+=)
// the gradient of parameter `id` in the parameter's dtype, for the current micro-step. The pointer
// is valid until the gradient is marked complete — grad_ready(id), the end of the backward scope of
// the parameter's unit, or finish_backward(), whichever comes first — and must be asked for again in
// the next micro-step. (Some stages happen to keep it longer; do not rely on that.) A parameter
// registered with its own gradient storage (ParamSpec::grad) keeps it at every stage: the engine
// adds it in when the gradient is complete, then zeroes it.
//
// Communication. When every tensor of a bucket is complete its reduction starts on the
// communicator's own thread (or stream) while backward goes on, in one fixed order on every rank.
// Loops without units call grad_ready(id) instead of the scopes; finish_backward() completes
// whatever was not marked.
//
// Accumulation by hand. Micro-steps inside a no_sync() scope only accumulate locally (in a full
// gradient buffer, as DDP and FSDP do); the first micro-step outside it reduces everything: a loop
// that decides per step what to defer keeps the scope, where micro_batch_reduce = kOnce says it once.
// step() may follow fewer finish_backward() calls than micro_batches (the mean is over those run).
//
// Errors. Problems in one rank's registration or options are reported by finalize() on every rank,
// naming the parameter or the option field and the ranks. A failed collective throws TimeoutError or
// CommError naming the operation and the rank, never a hang.
#include <cstddef>
#include <exception>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "comm/communicator.h"
#include "memory/device.h"
#include "optim/optimizer.h"
#include "zero/checkpoint/checkpoint_types.h"
#include "zero/engine_options.h"
#include "zero/grad_finalizer.h"
#include "zero/memory_report.h"
#include "zero/param_registry.h"
#include "zero/step_result.h"
#include "zero/step_timings.h"
#include "zero/typed_view.h"

namespace zero {

struct CheckpointParts;  // zero/checkpoint/checkpoint_parts.h
struct NodeCopies;       // zero/checkpoint/node_copies.h

class Engine;

// What a backward scope is for. A schedule that splits the backward (zero bubble: parallel/pipeline)
// runs a unit's input gradient (kInput: the parameters readable, no parameter gradient written) and
// later its weight gradient (kWeight: gradients written, the parameters not readable, not gathered
// at stage 3) as two scopes; kAll is both. A kAll or kWeight scope is one backward pass of the unit
// (EngineOptions::micro_batches of them complete its gradients).
enum class BackwardPart { kAll, kInput, kWeight };

// A unit's forward (gather) or backward (gather_for_backward) scope. Move-only; ending it (the
// destructor, or close()) ends that unit's forward or backward. Leaving a backward scope marks the
// gradients of the unit's parameters complete, which may start their buckets' reductions. At stage 3
// the scope also holds the unit's gathered parameters; below it they are always resident, and the
// scope costs nothing more. An error while ending the scope in the destructor is raised by the next
// engine call (close() raises it right away).
class [[nodiscard("a unit scope ends when it is destroyed: hold it for the unit's forward or backward")]] UnitScope {
 public:
  UnitScope(UnitScope&& other) noexcept;
  UnitScope& operator=(UnitScope&& other) noexcept;
  UnitScope(const UnitScope&) = delete;
  UnitScope& operator=(const UnitScope&) = delete;
  ~UnitScope();

  int unit() const { return unit_; }
  bool backward() const { return backward_; }
  BackwardPart part() const { return part_; }
  bool evaluation() const { return evaluation_; }
  // Parameter `id` of this unit, in full: the user's storage below stage 3, the gathered copy at
  // stage 3 (in EngineOptions.param_dtype where set; valid while the scope is open; read-only: the
  // engine's update is the only writer).
  void* param(int id);
  // Typed views (zero/typed_view.h): T must match the dtype of that memory (the registered dtype,
  // or param_dtype), else InvalidArgument naming the parameter.
  template <typename T>
  std::span<const T> param_span(int id) {
    const void* p = param(id);
    return {static_cast<const T*>(p), view_numel(id, view_type<T>())};
  }
  template <typename T>
  const T* param_as(int id) {
    return param_span<T>(id).data();
  }
  // The backward scope's gradient storage of parameter `id` of this unit (Engine::grad's rule).
  void* grad(int id);
  template <typename T>
  std::span<T> grad_span(int id) {
    void* g = grad(id);
    return {static_cast<T*>(g), view_numel(id, view_type<T>())};
  }
  template <typename T>
  T* grad_as(int id) {
    return grad_span<T>(id).data();
  }
  void close();

 private:
  friend class Engine;
  size_t view_numel(int id, ViewType v) const;
  UnitScope(Engine* engine, int unit, bool backward, BackwardPart part, bool evaluation)
      : engine_(engine), unit_(unit), backward_(backward), part_(part), evaluation_(evaluation) {}
  Engine* engine_ = nullptr;
  int unit_ = -1;
  bool backward_ = false;
  BackwardPart part_ = BackwardPart::kAll;
  bool evaluation_ = false;
  void* base_ = nullptr;  // stage 3: the unit's gathered parameters (its first bucket); null: resident
};

// While alive, micro-steps only accumulate their gradients locally; see the header comment. Open it
// before a micro-step's first gradient and close it after its finish_backward().
class [[nodiscard("no_sync() lasts as long as the scope it returns: hold it")]] NoSyncScope {
 public:
  NoSyncScope(NoSyncScope&& other) noexcept;
  NoSyncScope& operator=(NoSyncScope&& other) noexcept;
  NoSyncScope(const NoSyncScope&) = delete;
  NoSyncScope& operator=(const NoSyncScope&) = delete;
  ~NoSyncScope();

 private:
  friend class Engine;
  explicit NoSyncScope(Engine* engine) : engine_(engine) {}
  Engine* engine_ = nullptr;
};

// While alive, the engine evaluates: gather(unit) opens forward-only scopes (validation, sampling)
// that train nothing. At stage 3 they are not recorded in the unit order: they prefetch along the
// recorded forward order, and the next training step still prefetches along its own.
// gather_for_backward(), grad() and grad_ready() inside it are errors; step() too. Open it between
// steps (or between a step's micro-steps), with no unit scope open, and close it before training
// goes on. Below stage 3 it costs nothing.
class [[nodiscard("evaluation() lasts as long as the scope it returns: hold it")]] EvaluationScope {
 public:
  EvaluationScope(EvaluationScope&& other) noexcept;
  EvaluationScope& operator=(EvaluationScope&& other) noexcept;
  EvaluationScope(const EvaluationScope&) = delete;
  EvaluationScope& operator=(const EvaluationScope&) = delete;
  ~EvaluationScope();
  void close();

 private:
  friend class Engine;
  explicit EvaluationScope(Engine* engine) : engine_(engine) {}
  Engine* engine_ = nullptr;
};

// The communicators and the device an engine runs on.
struct EngineComms {
  // Reduce-scatter and all-gather run within this group; without `replica` it is the whole
  // data-parallel group (which may itself be a split() of a larger mesh).
  comm::Communicator* shard = nullptr;
  // Hybrid sharding (HSDP): the ranks holding the same shard in other groups. Gradient shards are
  // all-reduced across it after the reduce-scatter. Stages 1 to 3 (stage 0 shards nothing).
  comm::Communicator* replica = nullptr;
  // Where the engine's buffers live and its kernels run; nullptr: a host device of the engine's own.
  // Must outlive the engine; its memory kind must be one the communicators accept.
  memory::Device* device = nullptr;
  // The global gradient norm and the overflow check are added over it (model parallelism:
  // comm::Mesh::model_parallel(), tp x pp), each element counted once (a finalizer's copies on its
  // group's rank 0 only); nullptr: over the data-parallel ranks alone.
  comm::Communicator* model_parallel = nullptr;
  // Model parallelism's gradient finalizers (zero/grad_finalizer.h), run in this order: tensor
  // parallelism's partial sums and replicated copies, the tied copies' sums across pipeline stages.
  // A parameter that needs one (a split placement, ParamSpec::tied) and finds none is refused at
  // finalize(). Each serves one engine.
  //
  // parallel::engine_comms(mesh) (parallel/engine_comms.h) builds every field from the rank's
  // place in the device mesh, so that none can be left out.
  GradFinalizers finalizers;
  // The run's layout (layout/layout.h) when the mesh was built from one: the options must agree with
  // it on the stage and the offload (check_layout), and checkpoints record it whole.
  std::optional<Layout> layout;
};

class Engine {
 public:
  // The communicator (and device) must outlive the engine and be used by nobody else while it runs
  // collectives.
  Engine(comm::Communicator& comm, EngineOptions options);
  Engine(const EngineComms& comms, EngineOptions options);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Registers a parameter (before finalize). Local problems are raised by finalize() on every rank.
  // An optimizer group whose name patterns match it (optim::Hyper::params) takes it, whatever
  // ParamSpec::group says; two such groups are refused here, naming both.
  int add_param(const ParamSpec& spec);
  // Before finalize(): the step's micro-batches (EngineOptions::micro_batches, set to this count)
  // run interleaved within one micro-step, as a pipeline schedule runs them, instead of one after
  // another. parallel::PipelineStage calls it with its schedule's m.
  void interleave_micro_batches(int micro_batches);
  // Collective: checks that all ranks registered the same parameters and options, wires the stage,
  // allocates the shards, broadcasts rank 0's initial values into every rank's parameters.
  void finalize();
  bool finalized() const;

  // Unit scopes (see UnitScope). `unit` must be a registered unit id.
  UnitScope gather(int unit);  // [[nodiscard]] by its type, with the reason
  UnitScope gather_for_backward(int unit, BackwardPart part = BackwardPart::kAll);
  NoSyncScope no_sync();
  EvaluationScope evaluation();
  bool evaluating() const;  // an evaluation scope is open

  // Whether every trainable parameter's registered storage holds its current values (stages 0-2).
  // False at stage 3: the parameters live in the shards and are read through an open scope
  // (UnitScope::param); the registered storage holds NaN after finalize(), so a stale read shows
  // at once. Adapters ask this instead of the stage.
  bool params_resident() const;

  // Where backward accumulates the gradient of parameter `id` (see the header comment). Where
  // parameters are not resident (stage 3) only inside an open backward scope of the parameter's unit.
  void* grad(int id);
  // Typed views of it (zero/typed_view.h): T must match the dtype gradients are written in (the
  // registered dtype, or EngineOptions.param_dtype), else InvalidArgument naming the parameter.
  template <typename T>
  std::span<T> grad_span(int id) {
    void* g = grad(id);
    return {static_cast<T*>(g), view_numel(id, view_type<T>())};
  }
  template <typename T>
  T* grad_as(int id) {
    return grad_span<T>(id).data();
  }
  // The gradient of `id` is complete for this micro-step.
  void grad_ready(int id);
  // Ends the backward of one micro-step: reduces what is still pending (unless no_sync) and waits.
  void finish_backward();
  // Collective: clips, updates the shards and writes the new parameters into every rank's storage.
  // Afterwards all gradients are zero. Finishes the current micro-step first if needed.
  StepResult step();
  // Drops every gradient accumulated since the last step.
  void zero_grad();

  // Multiply the loss (its gradient seed) by this before backward.
  float loss_scale() const;
  // The CPU optimizer (host devices; throws InvalidArgument on a CUDA device, and with a custom rule,
  // which is the caller's own object).
  optim::Optimizer& optimizer();
  // A parameter group's hyperparameters (e.g. the learning rate from a schedule), on any device.
  optim::Hyper& param_group(int group);
  const ParamRegistry& registry() const;
  const EngineOptions& options() const;
  const EngineComms& comms() const;
  memory::Device& device();
  int rank() const;        // in the whole data-parallel group (replica-major with hybrid sharding)
  int world_size() const;  // shard group size x replicas
  int64_t steps_taken() const;
  // Where the last completed step's time went (waits, optimizer, bytes moved).
  const StepTimings& step_timings() const;

  // This engine's memory (its own tracker) against the ZeRO formula.
  MemoryReport memory_report() const;

  // Checkpoints (zero/checkpoint/checkpoint.h, docs/checkpoints.md). Collective: every rank calls them.
  // save(): every rank writes the pieces it owns into DIR (crash-safe: a DIR without manifest.json
  // is never loaded, and the previous checkpoint in DIR is kept until the new one is complete);
  // `user_blob` is this rank's opaque state (RNG, data position). Call between steps.
  void save(const std::string& dir, std::string_view user_blob = {});
  // save_async(): copies what it must into a host snapshot and returns; the files are written in the
  // background while training goes on. A second save (or load) waits for the first; wait_for_save()
  // (collective) returns once the checkpoint is complete and raises its error, if any. The snapshot's
  // host memory (this rank's checkpoint size) is kept for the next save_async, since mapping it
  // anew costs more than the copy; release_save_staging() waits for the save and frees it.
  // `node_copies`: DIR is each node's own (its /dev/shm), and each rank's data file is copied to a
  // rank of another node on the save's thread (zero/checkpoint/node_copies.h); kept alive by the
  // caller until the save is waited for.
  void save_async(const std::string& dir, std::string_view user_blob = {}, const NodeCopies* node_copies = nullptr);
  void wait_for_save();
  void release_save_staging();
  size_t save_staging_bytes() const;
  // load(): at any world size and stage; restores the master, the optimizer state, the parameters,
  // the step count and the loss scaler, and drops accumulated gradients. Returns every saving rank's
  // user blob and the saved world size and stage. A missing, incomplete, corrupt or foreign
  // checkpoint fails on every rank with an error naming the file, and changes nothing. A checkpoint
  // of another optimizer (AdamW's into 8-bit AdamW or Muon) loads with `options.optimizer_state`
  // kConvert or kReset (zero/checkpoint/checkpoint_types.h), which the log names.
  LoadedCheckpoint load(const std::string& dir, const LoadOptions& options = {});
  // From several directories that together hold the model (each pipeline stage's checkpoint): this
  // engine's parameters from whichever holds them, so a pipeline's checkpoint loads at another
  // split of the layers (zero/checkpoint/checkpoint.h).
  LoadedCheckpoint load(const std::vector<std::string>& dirs, const LoadOptions& options = {});
  // export_safetensors(): the full weights (fp32 from the master, or the model dtype) as one
  // safetensors file, written in place by every rank, piece by piece.
  void export_safetensors(const std::string& path, DType dtype = DType::kFloat32);
  // import_safetensors(): start from a safetensors file's weights (parameters and master; the
  // optimizer state is kept), each rank reading only its own ranges. `name_map`: registered name ->
  // the file's name, where they differ.
  void import_safetensors(const std::string& path, const std::map<std::string, std::string>& name_map = {});

 private:
  friend class UnitScope;
  friend class NoSyncScope;
  friend class EvaluationScope;
  UnitScope open_scope(int unit, bool backward, BackwardPart part);
  void end_scope(const UnitScope& scope);
  void* scope_param(void* base, int id);
  // The element count of a typed view of parameter `id`'s memory in the engine (zero/typed_view.h).
  size_t view_numel(int id, ViewType v) const;
  void end_no_sync();
  void end_evaluation();
  void note_scope_error(std::exception_ptr error);
  // Closes `scope` from its destructor or a move: an error is kept for the engine's next call
  // (note_scope_error), since neither may throw.
  template <typename Scope>
  static void close_quietly(Scope& scope) noexcept;
  CheckpointParts checkpoint_parts();
  CheckpointState checkpoint_state() const;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace zero
