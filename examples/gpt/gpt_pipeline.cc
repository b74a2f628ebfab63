#include "examples/gpt/gpt_pipeline.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>
#include <utility>

#include "base/check.h"
#include "parallel/pipeline/schedules.h"
#include "parallel/pipeline/stage_cut.h"

namespace zero::examples {

std::vector<int> parse_layer_counts(const std::string& text) {
  std::vector<int> out;
  if (text.empty()) return out;
  size_t at = 0;
  while (at <= text.size()) {
    const size_t comma = std::min(text.find(',', at), text.size());
    const std::string item = text.substr(at, comma - at);
    size_t used = 0;
    int v = -1;
    try {
      v = std::stoi(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (item.empty() || used != item.size()) {
      ZERO_THROW(InvalidArgument, "--pp-layers '{}': '{}' is not a layer count (a comma-separated list, e.g. 2,1,1)",
                 text, item);
    }
    out.push_back(v);
    at = comma + 1;
  }
  return out;
}

std::vector<GptStage> gpt_stages(int n_layer, int virtual_stages, const std::vector<int>& layers) {
  ZERO_CHECK(virtual_stages >= 1, "virtual stages {} not positive", virtual_stages);
  std::vector<GptStage> stages;
  for (const auto& [first, end] :
       parallel::stage_ranges(n_layer, virtual_stages, layers, "--pp-layers", "the model has n_layer")) {
    stages.push_back({first, end, stages.empty(), static_cast<int>(stages.size()) == virtual_stages - 1});
  }
  return stages;
}

parallel::HeldBytes gpt_held_bytes(const GptConfig& config, int virtual_stages, const std::vector<int>& layers, int tp,
                                   bool sequence_parallel, int B, int T, bool recompute) {
  parallel::HeldBytes h;
  h.forward.clear();
  h.weight.clear();
  h.rebuilt.clear();
  h.input_peak.clear();
  for (const GptStage& stage : gpt_stages(config.n_layer, virtual_stages, layers)) {
    const Gpt::MicroBatchBytes b = Gpt::micro_batch_bytes(config, stage, tp, sequence_parallel, B, T, recompute);
    h.forward.push_back(static_cast<double>(b.forward));
    h.weight.push_back(static_cast<double>(b.weight));
    h.rebuilt.push_back(static_cast<double>(b.rebuilt));
    h.input_peak.push_back(static_cast<double>(b.input_peak));
  }
  return h;
}

parallel::Schedule gpt_schedule(const std::string& name, const GptConfig& config, int pp, int micro_batches, int chunks,
                                const std::vector<int>& layers, int tp, bool sequence_parallel, int B, int T,
                                bool recompute, const parallel::ActionCosts& times) {
  parallel::ActionCosts costs = times;
  costs.held = gpt_held_bytes(config, pp * chunks, layers, tp, sequence_parallel, B, T, recompute);
  return parallel::make_schedule(name, pp, micro_batches, chunks, config.n_layer, costs);
}

namespace {

// The cut, checked as the GPT's flags name it (--pp-layers) before the stage checks it again.
parallel::PipelineOptions cut_of(const Gpt& full, const parallel::Schedule& schedule, const std::vector<int>& layers) {
  gpt_stages(full.config().n_layer, schedule.virtual_stages(), layers);
  return {.layers = full.config().n_layer, .layer_counts = layers};
}

}  // namespace

GptPipeline::GptPipeline(const Gpt& full, const GptParallel& parallel, const comm::Mesh& mesh, parallel::Schedule schedule,
                         const std::vector<int>& layers, Engine& engine, DType dtype, bool fp32_norms)
    : rank_(mesh.pp().rank()), stage_(mesh, engine, schedule, cut_of(full, schedule, layers)) {
  chunks_.reserve(static_cast<size_t>(stage_.chunks()));  // the scopes keep references to the chunks
  for (int c = 0; c < stage_.chunks(); ++c) {
    const parallel::LayerRange l = stage_.layers(c);
    chunks_.emplace_back(full, parallel, GptStage{l.first, l.end, stage_.is_first(c), stage_.is_last(c)});
  }
  // A V's rank 0 holds the first virtual stage (chunk 0, the embedding) and the last (the tied head):
  // one copy of wte, which the head borrows (GptTieOnRank).
  const bool tie_on_rank = stage_.holds_last_stage() && stage_.is_first(0) && !stage_.is_last(0);
  for (size_t c = 0; c < chunks_.size(); ++c) {
    GptTieOnRank tie;
    if (tie_on_rank && c == 0) tie.lends = true;
    if (tie_on_rank && stage_.is_last(static_cast<int>(c))) tie.lender = scopes_.front().get();
    scopes_.push_back(std::make_unique<GptScopes>(engine, chunks_[c], dtype, fp32_norms, tie));
    access_.push_back(scopes_.back()->access());
  }
}

void GptPipeline::finalize() { stage_.finalize(functions()); }

parallel::StageModel GptPipeline::functions() {
  // The rank's activation peak over its chunks at once: an action changes only its own chunk's
  // bytes, so the peak during it is the others' bytes plus that chunk's peak within the action.
  auto tracked = [this](int chunk, auto&& action) {
    Gpt& model = chunks_[static_cast<size_t>(chunk)];
    size_t others = 0;
    for (const Gpt& c : chunks_) others += &c == &model ? 0 : c.activation_bytes();
    model.reset_peak_activation_bytes();
    action(model);
    peak_ = std::max(peak_, others + model.peak_activation_bytes());
  };
  parallel::StageModel fns;
  fns.forward = [this, tracked](const parallel::StageCall& call, const parallel::StageTensor& input,
                                parallel::StageTensor& output) {
    const MicroBatch& m = (*batches_)[static_cast<size_t>(call.mb)];
    const Gpt::Access& access = access_[static_cast<size_t>(call.chunk)];
    float loss = 0;
    tracked(call.chunk, [&](Gpt& model) {
      loss = model.forward_micro_batch(call.mb, m.inputs, m.targets, m.B, m.T,
                                       input.empty() ? nullptr : input.span<float>().data(), &scratch_, access);
      if (!call.training && call.last && logits_ != nullptr) *logits_ = model.last_position_logits(call.mb, access);
      if (!call.training) model.forget(call.mb);
    });
    if (!call.last) std::copy(scratch_.begin(), scratch_.end(), output.span<float>().begin());
    return loss;
  };
  fns.backward = [this, tracked](const parallel::StageCall& call, const parallel::StageTensor& grad_output,
                                 parallel::StageTensor& grad_input) {
    tracked(call.chunk, [&](Gpt& model) {
      model.backward_micro_batch(call.mb, call.loss_scale, grad_output.empty() ? nullptr : grad_output.span<float>().data(),
                                 &scratch_, call.part == BackwardPart::kAll, access_[static_cast<size_t>(call.chunk)]);
    });
    if (!call.first) std::copy(scratch_.begin(), scratch_.end(), grad_input.span<float>().begin());
  };
  fns.weight = [this, tracked](const parallel::StageCall& call) {
    tracked(call.chunk, [&](Gpt& model) { model.weight_micro_batch(call.mb, access_[static_cast<size_t>(call.chunk)]); });
  };
  fns.activation = [this](int, int) {
    const MicroBatch& m = batches_->front();
    return parallel::TensorSpec{chunks_.front().activation_numel(m.B, m.T)};
  };
  return fns;
}

GptPipeline::StepResult GptPipeline::train_step(const std::vector<MicroBatch>& micro_batches, float loss_scale) {
  ZERO_CHECK_EQ(static_cast<int>(micro_batches.size()), stage_.schedule().microbatches);
  for (const MicroBatch& m : micro_batches) {
    ZERO_CHECK(m.B == micro_batches.front().B && m.T == micro_batches.front().T,
               "micro-batches of different shapes ({}x{} and {}x{})", micro_batches.front().B, micro_batches.front().T,
               m.B, m.T);
  }
  batches_ = &micro_batches;
  peak_ = 0;
  // The stage slices samples into micro-batches; here a micro-batch is one MicroBatch, whatever its B.
  parallel::PipelineStage::StepResult s = stage_.train_step(static_cast<int>(micro_batches.size()), loss_scale);
  batches_ = nullptr;
  StepResult r;
  // The mean in micro-batch order (every schedule sums the same way).
  double sum = 0;
  for (float l : s.losses) sum += l;
  r.loss = static_cast<float>(sum / static_cast<double>(s.losses.size()));
  r.losses = std::move(s.losses);
  r.spans = std::move(s.spans);
  r.peak_activation_bytes = peak_;
  r.start_s = std::chrono::duration<double>(stage_.last_start().time_since_epoch()).count();
  return r;
}

size_t GptPipeline::activation_bytes_per_micro_batch(int B, int T) {
  constexpr int kProbe = -3;
  const size_t numel = chunks_.front().activation_numel(B, T);
  const std::vector<float> input(numel, 0.0f);
  const std::vector<int> tokens(static_cast<size_t>(B) * static_cast<size_t>(T), 0);
  size_t bytes = 0;
  for (size_t c = 0; c < chunks_.size(); ++c) {
    Gpt& model = chunks_[c];
    const size_t before = model.activation_bytes();
    std::vector<float> out;
    model.forward_micro_batch(kProbe, tokens, tokens, B, T, input.data(), &out, access_[c]);
    bytes += model.activation_bytes() - before;
    model.forget(kProbe);
  }
  return bytes;
}

float GptPipeline::evaluate(const std::vector<MicroBatch>& micro_batches) {
  batches_ = &micro_batches;
  const int m = static_cast<int>(micro_batches.size());
  const parallel::PipelineStage::EvalResult e = stage_.evaluate(m, m);
  batches_ = nullptr;
  double sum = 0;
  for (float l : e.losses) sum += l;
  return static_cast<float>(sum / static_cast<double>(m));
}

std::vector<float> GptPipeline::next_logits(const std::vector<int>& context) {
  ZERO_CHECK(!context.empty(), "an empty context");
  const GptConfig& c = chunks_.front().config();
  const size_t T = std::min(context.size(), static_cast<size_t>(c.block_size));
  std::vector<MicroBatch> one(1);
  one[0].inputs.assign(context.end() - static_cast<std::ptrdiff_t>(T), context.end());
  one[0].targets.assign(T, 0);
  one[0].B = 1;
  one[0].T = static_cast<int>(T);
  std::vector<float> logits(static_cast<size_t>(c.vocab_size), 0.0f);
  batches_ = &one;
  logits_ = &logits;
  stage_.evaluate(1, 1);
  batches_ = nullptr;
  logits_ = nullptr;
  stage_.from_last_stage(logits.data(), logits.size());
  return logits;
}

}  // namespace zero::examples
