#pragma once
// parallel::PipelineStage: a rank's part of a pipelined model, joined to its engine. It owns what
// every pipelined training loop otherwise writes again: the cut of the layers into virtual stages
// and which of them this rank holds, the typed activation buffers between stages, a context per
// (micro-batch, chunk) kept from a forward to its backward, the slicing of a batch into the
// schedule's micro-batches, the loss taken off the last stage, forward-only evaluation, and the
// engine's micro-batch count (the schedule's m). The model stays the user's: three functions (and
// the activation's size) over the chunk's layers.
//
//   comm::Mesh mesh(world, comm::MeshShape{.pp = 2, .dp = 2, .tp = 2});
//   zero::Engine engine(parallel::engine_comms(mesh), options);  // every group from the mesh
//   parallel::PipelineStage pipe(mesh, engine, parallel::make_schedule("1f1b", 2, 8), {.layers = 8});
//   for (int c = 0; c < pipe.chunks(); ++c) register_layers(engine, pipe.layers(c));
//   pipe.finalize(model);                                 // checks, then engine.finalize()
//   for (...) {
//     const auto r = pipe.train_step(batch_samples, engine.loss_scale());   // r.loss on every rank
//     engine.step();
//   }
//
// The batch. A step takes this data-parallel rank's batch of S samples (data_parallel_slice() cuts
// a global batch among the data-parallel ranks) and slices it into the schedule's m micro-batches of
// S/m samples in order: micro-batch i is samples [i*S/m, (i+1)*S/m), given to every stage function
// as StageCall::sample_begin / sample_end. An S that m does not divide is refused, naming both.
//
// The loss. The last virtual stage's forward returns its micro-batch's mean loss, and its backward
// seeds the gradient of that mean (times StageCall::loss_scale); the engine divides by m and by the
// data-parallel size, so the step follows the gradient of the global batch's mean loss. The step's
// loss is that mean, on every rank.
//
// Refused, naming the culprit, before anything trains: an engine whose norm group or tp group does
// not cover the mesh (each stage would clip by its own norm), a cut with a stage that registered no
// trainable parameter (by stage and world rank), a missing stage function.
#include <any>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "comm/mesh.h"
#include "memory/device.h"
#include "parallel/pipeline/runner.h"
#include "parallel/pipeline/schedule.h"
#include "parallel/pipeline/stage_tensor.h"
#include "zero/engine.h"

namespace zero::parallel {

struct LayerRange {
  int first = 0, end = 0;  // layers [first, end)
  int size() const { return end - first; }
};

// What a stage function is called for.
struct StageCall {
  int mb = 0;             // the micro-batch's index in the step
  int chunk = 0;          // this rank's chunk
  int virtual_stage = 0;  // the chunk's place in the model, 0 .. pp x chunks - 1
  bool first = false;     // the model's first virtual stage (its input is the data)
  bool last = false;      // the model's last virtual stage (its output is the loss)
  LayerRange layers;      // the chunk's layers
  int sample_begin = 0, sample_end = 0;  // the micro-batch's samples in this rank's batch
  // backward: kAll (input and weight gradients), or kInput where the schedule runs the weight part
  // later (weight() is then called with kWeight).
  BackwardPart part = BackwardPart::kAll;
  float loss_scale = 1.0f;  // the last stage's backward seeds d(mean loss)/d(output) x loss_scale
  bool training = true;     // false in evaluate(): forward only, inside the engine's evaluation scope
  // Kept from this (micro-batch, chunk)'s forward to its last backward part, then dropped: what the
  // backward needs (inputs, pre-activations, a framework's graph).
  std::any& context;
  int samples() const { return sample_end - sample_begin; }
};

struct StageModel {
  // Forward of the call's micro-batch through the chunk: `input` is the previous virtual stage's
  // activation (empty on the first, which reads its samples); fills `output` (empty on the last).
  // Returns the micro-batch's mean loss on the last virtual stage (ignored elsewhere).
  std::function<float(const StageCall& call, const StageTensor& input, StageTensor& output)> forward;
  // Backward of call.part from `grad_output` (empty on the last virtual stage, which seeds its own
  // loss's gradient); fills `grad_input` (empty on the first).
  std::function<void(const StageCall& call, const StageTensor& grad_output, StageTensor& grad_input)> backward;
  // The weight part (call.part == kWeight) after a kInput backward. Required by schedules that split
  // the backward (zb-h1).
  std::function<void(const StageCall& call)> weight;
  // The activation leaving virtual stage k for a micro-batch of `samples` samples (its gradient has
  // the same spec).
  std::function<TensorSpec(int virtual_stage, int samples)> activation;
};

struct PipelineOptions {
  int layers = 0;                 // the model's repeated layers, cut over the virtual stages
  std::vector<int> layer_counts;  // one count per virtual stage (summing to layers); empty: even
  memory::Device* device = nullptr;  // where activations live; a host device of the runner's own if null
};

class PipelineStage {
 public:
  // Before engine.finalize(); collective over the mesh's dp group. Sets the engine's micro-batch
  // count to the schedule's m. Throws InvalidArgument naming the field: a schedule for another
  // pipeline size, a cut that does not fit, an engine whose groups do not cover the mesh.
  PipelineStage(const comm::Mesh& mesh, Engine& engine, Schedule schedule, PipelineOptions options);
  ~PipelineStage();
  PipelineStage(const PipelineStage&) = delete;
  PipelineStage& operator=(const PipelineStage&) = delete;

  const Schedule& schedule() const { return schedule_; }
  int chunks() const { return schedule_.chunks; }
  int virtual_stage(int chunk) const { return schedule_.virtual_stage(rank_, chunk); }
  LayerRange layers(int chunk) const { return cut_.at(static_cast<size_t>(virtual_stage(chunk))); }
  bool is_first(int chunk) const { return virtual_stage(chunk) == 0; }
  bool is_last(int chunk) const { return virtual_stage(chunk) == schedule_.virtual_stages() - 1; }
  bool holds_last_stage() const;

  // This data-parallel rank's samples [first, end) of a global batch (InvalidArgument naming both
  // when the data-parallel size does not divide it).
  std::pair<int, int> data_parallel_slice(int global_batch) const;

  // Collective over the mesh's world: every rank's chunks registered trainable parameters (else
  // InvalidArgument on every rank naming the empty stages and their world ranks), the functions are
  // given (else naming the missing one); then engine.finalize().
  void finalize(StageModel model);

  struct StepResult {
    float loss = 0;             // the mean over the global batch (every micro-batch of every data-parallel rank)
    std::vector<float> losses;  // this data-parallel rank's micro-batches' losses
    std::vector<Span> spans;    // this rank's compute actions (seconds since the step began)
  };
  // One step's forwards and backwards over `samples` samples (this data-parallel rank's batch), by
  // the schedule; the caller calls engine.step() after.
  StepResult train_step(int samples, float loss_scale);
  // Forward only through the stages in model order (blocking transfers), inside an engine
  // evaluation scope (opened here unless the caller holds one). `micro_batches` (default: the
  // schedule's m) must divide `samples`.
  struct EvalResult {
    float loss = 0;             // the mean over the global batch, on every rank
    std::vector<float> losses;  // this data-parallel rank's micro-batches' losses, on every pipeline rank
  };
  EvalResult evaluate(int samples, int micro_batches = 0);
  // The last virtual stage's `values` (the same count on every pipeline rank) given to every
  // pipeline rank.
  void from_last_stage(float* values, size_t count);
  // When the last train_step's schedule began on this rank (steady clock).
  std::chrono::steady_clock::time_point last_start() const { return runner_->last_start(); }

 private:
  StageCall call(int mb, int chunk, std::any& context, int samples_per_mb) const;
  // The last stage's micro-batch `losses` given to every pipeline rank (in place), and their mean over
  // the global batch (the data-parallel ranks' means averaged).
  float global_mean(std::vector<float>& losses);

  const comm::Mesh& mesh_;
  Engine& engine_;
  const Schedule schedule_;
  const int rank_;
  std::vector<LayerRange> cut_;  // per virtual stage
  std::unique_ptr<comm::Communicator> loss_comm_;  // the data-parallel loss mean, apart from the engine's
  std::unique_ptr<PipelineRunner> runner_;
  StageModel model_;
  bool finalized_ = false;
  int mb_samples_ = 0;  // the step's micro-batch size, for the activations' specs
};

}  // namespace zero::parallel
