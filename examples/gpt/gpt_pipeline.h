#pragma once
// The GPT over a pipeline: this rank's chunks of the model (one Gpt stage model per virtual stage it
// holds) registered in one engine, run by the library's parallel::PipelineStage, which owns the
// cut, the activations between stages, the schedule's run, the loss off the last stage and
// forward-only passes. What is left here is the GPT's: its chunks, their calls, its micro-batches
// of tokens, and the activation peak its chunks report.
//
//   GptPipeline pipe(full, {tp, sp}, mesh, schedule, layers, engine);   // registers the chunks
//   pipe.finalize();                                                    // and the engine
//   const GptPipeline::StepResult r = pipe.train_step(micro_batches, engine.loss_scale());
//   engine.step();
//
// The engine must be built from the mesh (parallel::engine_comms(mesh)): the tied wte copies sum
// over its embedding group, the norm over its model-parallel group. The loss is the mean over the
// micro-batches, computed by the last stage and given to every pipeline rank.
#include <memory>
#include <string>
#include <vector>

#include "comm/mesh.h"
#include "examples/gpt/gpt_engine.h"
#include "examples/gpt/gpt_model.h"
#include "parallel/pipeline/held_activations.h"
#include "parallel/pipeline/pipeline_stage.h"
#include "parallel/pipeline/schedule.h"
#include "parallel/pipeline/schedule_sim.h"

namespace zero::examples {

// Blocks per virtual stage: `layers` (one count per virtual stage, summing to n_layer; a stage may
// have none), or an even split (the first stages take one more where it does not divide). Throws
// InvalidArgument naming --pp-layers for a list of the wrong length or sum, or a negative count.
std::vector<GptStage> gpt_stages(int n_layer, int virtual_stages, const std::vector<int>& layers = {});

// "2,1,1" -> {2, 1, 1}; "" -> {} (even). Throws InvalidArgument naming --pp-layers on anything else.
std::vector<int> parse_layer_counts(const std::string& text);

// What one B x T micro-batch holds on each virtual stage of the GPT cut by `layers` (as gpt_stages
// cuts it) at tensor-parallel size `tp` (Gpt::micro_batch_bytes, field for field).
parallel::HeldBytes gpt_held_bytes(const GptConfig& config, int virtual_stages, const std::vector<int>& layers, int tp,
                                   bool sequence_parallel, int B, int T, bool recompute);

// The named schedule (parallel::make_schedule) for the GPT's pipeline of `pp` ranks, `chunks` each,
// running micro-batches of B x T: the zero-bubble ones keep the held activations, in bytes, within
// 1F1B's peak (gpt_held_bytes), their order fitted to `times` (each virtual stage's F, B and W, as
// a run measured them: parallel::measured_costs; default a unit each).
parallel::Schedule gpt_schedule(const std::string& name, const GptConfig& config, int pp, int micro_batches, int chunks,
                                const std::vector<int>& layers, int tp, bool sequence_parallel, int B, int T,
                                bool recompute, const parallel::ActionCosts& times = {});

// One micro-batch: B x T inputs and next-token targets.
struct MicroBatch {
  std::vector<int> inputs, targets;
  int B = 0, T = 0;
};

class GptPipeline {
 public:
  // Registers this rank's chunks (pipeline rank mesh.pp().rank(), chunk c = the schedule's virtual
  // stage of (rank, c): c * p + rank in a loop, rank and 2p-1-rank in a V) with `engine` (before
  // finalize). Where the rank holds the first and the last virtual stage (a V's rank 0), the head
  // borrows the embedding's wte (GptTieOnRank): one copy, no tie across ranks. `full` is the whole model (every rank builds the same one).
  GptPipeline(const Gpt& full, const GptParallel& parallel, const comm::Mesh& mesh, parallel::Schedule schedule,
              const std::vector<int>& layers, Engine& engine, DType dtype = DType::kFloat32, bool fp32_norms = false);
  // Collective: the stage's checks, then engine.finalize() (parallel::PipelineStage::finalize).
  void finalize();

  struct StepResult {
    float loss = 0;                        // mean over the micro-batches (every pipeline rank)
    std::vector<float> losses;             // each micro-batch's (every pipeline rank)
    std::vector<parallel::Span> spans;     // this rank's compute actions
    size_t peak_activation_bytes = 0;      // this rank's chunks, at most at once during the step
    double start_s = 0;                    // when the spans' time 0 was (steady clock, seconds)
  };
  // One step's forwards and backwards of `micro_batches` (the schedule's m of them) by the schedule;
  // the caller calls engine.step() after.
  StepResult train_step(const std::vector<MicroBatch>& micro_batches, float loss_scale);
  // Forward only: the mean loss over `micro_batches`, on every pipeline rank.
  float evaluate(const std::vector<MicroBatch>& micro_batches);
  // The next-token log-probabilities after `context`, on every pipeline rank (sampling).
  std::vector<float> next_logits(const std::vector<int>& context);

  const parallel::Schedule& schedule() const { return stage_.schedule(); }
  int rank() const { return rank_; }
  // This rank's chunks (virtual stage schedule().virtual_stage(rank, c) for chunk c) and their engine ids.
  std::vector<Gpt>& chunks() { return chunks_; }
  const std::vector<int>& ids(int chunk) const { return scopes_[static_cast<size_t>(chunk)]->ids(); }
  bool holds_last_stage() const { return stage_.holds_last_stage(); }
  // The activation bytes one B x T micro-batch leaves in this rank's chunks after its forward.
  size_t activation_bytes_per_micro_batch(int B, int T);

 private:
  // The stage functions over `batches` (the step's micro-batches); `losses` and `logits` (the
  // last position's log-probabilities, sampling) filled on the last stage.
  parallel::StageModel functions();

  const int rank_;
  std::vector<Gpt> chunks_;
  std::vector<std::unique_ptr<GptScopes>> scopes_;
  std::vector<Gpt::Access> access_;
  parallel::PipelineStage stage_;
  // The pass in progress: its micro-batches, the activation peak, and (sampling) the logits.
  const std::vector<MicroBatch>* batches_ = nullptr;
  size_t peak_ = 0;
  std::vector<float>* logits_ = nullptr;
  std::vector<float> scratch_;
};

}  // namespace zero::examples
