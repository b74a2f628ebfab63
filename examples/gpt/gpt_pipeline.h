#pragma once
// The GPT over a pipeline (parallel/pipeline): this rank's chunks of the model (one Gpt stage model
// per virtual stage it holds) registered in one engine, and the runner's stage functions over them.
//
//   GptPipeline pipe(full, {tp, sp}, mesh.pp(), schedule, layers, engine);   // registers the chunks
//   engine.finalize();
//   const GptPipeline::StepResult r = pipe.train_step(micro_batches, engine.loss_scale());
//   engine.step();
//
// The engine runs with EngineOptions::micro_batches = the schedule's m (a unit's gradients complete
// after its last micro-batch's backward), the tied wte copies over the mesh's embedding group. The
// loss is the mean over the micro-batches, computed by the last stage and given to every pipeline
// rank. Validation and sampling run forward-only passes through the stages in model order (blocking
// transfers: slow is fine there).
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "examples/gpt/gpt_engine.h"
#include "examples/gpt/gpt_model.h"
#include "parallel/pipeline/runner.h"
#include "parallel/pipeline/schedule.h"

namespace zero::examples {

// Blocks per virtual stage: `layers` (one count per virtual stage, summing to n_layer; a stage may
// have none), or an even split (the first stages take one more where it does not divide). Throws
// InvalidArgument naming --pp-layers for a list of the wrong length or sum, or a negative count.
std::vector<GptStage> gpt_stages(int n_layer, int virtual_stages, const std::vector<int>& layers = {});

// "2,1,1" -> {2, 1, 1}; "" -> {} (even). Throws InvalidArgument naming --pp-layers on anything else.
std::vector<int> parse_layer_counts(const std::string& text);

// One micro-batch: B x T inputs and next-token targets.
struct MicroBatch {
  std::vector<int> inputs, targets;
  int B = 0, T = 0;
};

class GptPipeline {
 public:
  // Registers this rank's chunks (pipeline rank pp.rank(), chunks c = virtual stages c * p + rank)
  // with `engine` (before finalize). `full` is the whole model (every rank builds the same one).
  GptPipeline(const Gpt& full, const GptParallel& parallel, comm::Communicator& pp, parallel::Schedule schedule,
              const std::vector<int>& layers, Engine& engine, DType dtype = DType::kFloat32,
              bool fp32_norms = false);

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
  // Forward only (inside an engine.evaluation() scope): the mean loss, on every pipeline rank.
  float evaluate(const std::vector<MicroBatch>& micro_batches);
  // The next-token log-probabilities after `context`, on every pipeline rank (sampling).
  std::vector<float> next_logits(const std::vector<int>& context);

  const parallel::Schedule& schedule() const { return schedule_; }
  int rank() const { return rank_; }
  // This rank's chunks (virtual stage c * p + rank for chunk c) and their engine ids.
  std::vector<Gpt>& chunks() { return chunks_; }
  const std::vector<int>& ids(int chunk) const { return scopes_[static_cast<size_t>(chunk)]->ids(); }
  bool holds_last_stage() const;
  // The activation bytes one B x T micro-batch leaves in this rank's chunks after its forward.
  size_t activation_bytes_per_micro_batch(int B, int T);

 private:
  // A forward-only pass of one micro-batch through every stage in model order; the loss (last stage)
  // or, with `logits`, the last position's log-probabilities, on the last stage.
  float forward_only(int mb, const MicroBatch& batch, std::vector<float>* logits);
  // The last stage's values on every pipeline rank.
  void from_last_stage(std::vector<float>& values);

  parallel::Schedule schedule_;
  comm::Communicator& pp_;
  int rank_;
  std::vector<Gpt> chunks_;
  std::vector<std::unique_ptr<GptScopes>> scopes_;
  std::vector<Gpt::Access> access_;
  std::unique_ptr<parallel::PipelineRunner> runner_;
  int B_ = 0, T_ = 0;  // the micro-batch shape the runner's buffers are sized for
};

}  // namespace zero::examples
