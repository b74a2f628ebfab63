#include "examples/gpt/gpt_pipeline.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>
#include <numeric>
#include <utility>

#include "base/check.h"
#include "parallel/pipeline/pipeline_check.h"
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
  const std::vector<int> counts = layers.empty() ? parallel::even_stage_cut(n_layer, virtual_stages) : layers;
  if (static_cast<int>(counts.size()) != virtual_stages) {
    ZERO_THROW(InvalidArgument, "--pp-layers lists {} stages but the pipeline has {} (pp x chunks)", counts.size(),
               virtual_stages);
  }
  for (int c : counts) {
    if (c < 0) ZERO_THROW(InvalidArgument, "--pp-layers: a negative layer count {}", c);
  }
  const int sum = std::accumulate(counts.begin(), counts.end(), 0);
  if (sum != n_layer) ZERO_THROW(InvalidArgument, "--pp-layers sums to {} layers but the model has n_layer {}", sum, n_layer);
  std::vector<GptStage> stages;
  int first = 0;
  for (int k = 0; k < virtual_stages; ++k) {
    stages.push_back({first, first + counts[static_cast<size_t>(k)], k == 0, k == virtual_stages - 1});
    first += counts[static_cast<size_t>(k)];
  }
  return stages;
}

GptPipeline::GptPipeline(const Gpt& full, const GptParallel& parallel, comm::Communicator& pp,
                         parallel::Schedule schedule, const std::vector<int>& layers, Engine& engine, DType dtype,
                         bool fp32_norms)
    : schedule_(std::move(schedule)), pp_(pp), rank_(pp.rank()) {
  parallel::check_schedule(schedule_);
  if (schedule_.ranks != pp.size()) {
    ZERO_THROW(InvalidArgument, "the schedule '{}' has {} pipeline ranks but the pipeline group has {}", schedule_.name,
               schedule_.ranks, pp.size());
  }
  const std::vector<GptStage> stages = gpt_stages(full.config().n_layer, schedule_.virtual_stages(), layers);
  chunks_.reserve(static_cast<size_t>(schedule_.chunks));  // the scopes keep references to the chunks
  for (int c = 0; c < schedule_.chunks; ++c) {
    chunks_.emplace_back(full, parallel, stages[static_cast<size_t>(schedule_.virtual_stage(rank_, c))]);
  }
  for (Gpt& chunk : chunks_) {
    scopes_.push_back(std::make_unique<GptScopes>(engine, chunk, dtype, fp32_norms));
    access_.push_back(scopes_.back()->access());
  }
  runner_ = std::make_unique<parallel::PipelineRunner>(
      schedule_, rank_, pp, [this](int, int) { return chunks_.front().activation_numel(B_, T_); });
}

bool GptPipeline::holds_last_stage() const { return chunks_.back().stage().last; }

GptPipeline::StepResult GptPipeline::train_step(const std::vector<MicroBatch>& micro_batches, float loss_scale) {
  ZERO_CHECK_EQ(static_cast<int>(micro_batches.size()), schedule_.microbatches);
  B_ = micro_batches.front().B;
  T_ = micro_batches.front().T;
  for (const MicroBatch& m : micro_batches) {
    ZERO_CHECK(m.B == B_ && m.T == T_, "micro-batches of different shapes ({}x{} and {}x{})", B_, T_, m.B, m.T);
  }
  // The rank's activation peak over its chunks at once: an action changes only its own chunk's
  // bytes, so the peak during it is the others' bytes plus that chunk's peak within the action.
  size_t peak = 0;
  auto tracked = [&](int chunk, auto&& action) {
    Gpt& model = chunks_[static_cast<size_t>(chunk)];
    size_t others = 0;
    for (const Gpt& c : chunks_) others += &c == &model ? 0 : c.activation_bytes();
    model.reset_peak_activation_bytes();
    action(model);
    peak = std::max(peak, others + model.peak_activation_bytes());
  };
  std::vector<float> losses(micro_batches.size(), 0.0f);
  parallel::StageFunctions fns;
  fns.forward = [&](int mb, int chunk, const std::vector<float>& input, std::vector<float>& output) {
    const MicroBatch& m = micro_batches[static_cast<size_t>(mb)];
    tracked(chunk, [&](Gpt& model) {
      const float loss = model.forward_micro_batch(mb, m.inputs, m.targets, m.B, m.T,
                                                   input.empty() ? nullptr : input.data(), &output,
                                                   access_[static_cast<size_t>(chunk)]);
      if (model.stage().last) losses[static_cast<size_t>(mb)] = loss;
    });
  };
  fns.backward = [&](int mb, int chunk, bool with_weight, const std::vector<float>& grad_output,
                     std::vector<float>& grad_input) {
    tracked(chunk, [&](Gpt& model) {
      model.backward_micro_batch(mb, loss_scale, grad_output.empty() ? nullptr : grad_output.data(), &grad_input,
                                 with_weight, access_[static_cast<size_t>(chunk)]);
    });
  };
  fns.weight = [&](int mb, int chunk) {
    tracked(chunk, [&](Gpt& model) { model.weight_micro_batch(mb, access_[static_cast<size_t>(chunk)]); });
  };
  StepResult r;
  r.spans = runner_->run(fns);
  from_last_stage(losses);
  // The mean in micro-batch order (every schedule sums the same way).
  double sum = 0;
  for (float l : losses) sum += l;
  r.loss = static_cast<float>(sum / static_cast<double>(losses.size()));
  r.losses = std::move(losses);
  r.peak_activation_bytes = peak;
  r.start_s = std::chrono::duration<double>(runner_->last_start().time_since_epoch()).count();
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

void GptPipeline::from_last_stage(std::vector<float>& values) {
  if (pp_.size() == 1) return;
  pp_.broadcast(values.data(), values.size(), DType::kFloat32, schedule_.rank_of(schedule_.virtual_stages() - 1))->wait();
}

float GptPipeline::forward_only(int mb, const MicroBatch& batch, std::vector<float>* logits) {
  const int V = schedule_.virtual_stages();
  std::vector<float> x, out;
  float loss = 0;
  for (int k = 0; k < V; ++k) {
    if (schedule_.rank_of(k) != rank_) continue;
    const int c = schedule_.chunk_of(k);
    Gpt& model = chunks_[static_cast<size_t>(c)];
    const size_t numel = model.activation_numel(batch.B, batch.T);
    if (k > 0 && schedule_.rank_of(k - 1) != rank_) {
      x.resize(numel);
      pp_.recv(x.data(), numel, DType::kFloat32, schedule_.rank_of(k - 1))->wait();
    }
    loss = model.forward_micro_batch(mb, batch.inputs, batch.targets, batch.B, batch.T, k > 0 ? x.data() : nullptr, &out,
                                     access_[static_cast<size_t>(c)]);
    if (model.stage().last && logits != nullptr) *logits = model.last_position_logits(mb, access_[static_cast<size_t>(c)]);
    model.forget(mb);
    if (k + 1 < V && schedule_.rank_of(k + 1) != rank_) {
      pp_.send(out.data(), out.size(), DType::kFloat32, schedule_.rank_of(k + 1))->wait();
    }
    x = std::move(out);
    out.clear();
  }
  return loss;
}

float GptPipeline::evaluate(const std::vector<MicroBatch>& micro_batches) {
  constexpr int kEvaluation = -2;  // apart from the training micro-batches' activations
  std::vector<float> mean(1, 0.0f);
  double sum = 0;
  for (const MicroBatch& m : micro_batches) sum += forward_only(kEvaluation, m, nullptr);
  mean[0] = static_cast<float>(sum / static_cast<double>(micro_batches.size()));
  from_last_stage(mean);
  return mean[0];
}

std::vector<float> GptPipeline::next_logits(const std::vector<int>& context) {
  ZERO_CHECK(!context.empty(), "an empty context");
  const GptConfig& c = chunks_.front().config();
  const size_t T = std::min(context.size(), static_cast<size_t>(c.block_size));
  MicroBatch m;
  m.inputs.assign(context.end() - static_cast<std::ptrdiff_t>(T), context.end());
  m.targets.assign(T, 0);
  m.B = 1;
  m.T = static_cast<int>(T);
  std::vector<float> logits(static_cast<size_t>(c.vocab_size), 0.0f);
  constexpr int kSampling = -1;
  forward_only(kSampling, m, &logits);
  from_last_stage(logits);
  return logits;
}

}  // namespace zero::examples
