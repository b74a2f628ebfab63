#include "parallel/pipeline/pipeline_stage.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>

#include <fmt/format.h>

#include "base/check.h"
#include "parallel/pipeline/pipeline_check.h"
#include "parallel/pipeline/stage_cut.h"

namespace zero::parallel {
namespace {

std::vector<LayerRange> cut_layers(const PipelineOptions& o, int stages) {
  if (o.layers < 1) ZERO_THROW(InvalidArgument, "PipelineOptions.layers is {}: a pipelined model has layers to cut", o.layers);
  std::vector<LayerRange> cut;
  for (const auto& [first, end] :
       stage_ranges(o.layers, stages, o.layer_counts, "PipelineOptions.layer_counts", "PipelineOptions.layers is")) {
    cut.push_back({first, end});
  }
  return cut;
}

// The engine's groups must be the mesh's: a pipeline whose stages clip by their own norms, or a
// tensor-parallel model counted as if whole, trains silently wrong.
void check_engine(const comm::Mesh& mesh, const Engine& engine) {
  if (engine.finalized()) ZERO_THROW(InvalidArgument, "PipelineStage: the engine is finalized; build the stage first");
  const EngineComms& c = engine.comms();
  const comm::MeshShape& s = mesh.shape();
  const char* fix = "build the engine's groups from the mesh (parallel::engine_comms)";
  if (engine.world_size() != s.dp) {
    ZERO_THROW(InvalidArgument, "PipelineStage: the engine's data-parallel group has {} ranks but the mesh's dp is {}: {}",
               engine.world_size(), s.dp, fix);
  }
  const bool splits_over_tp = std::any_of(c.finalizers.begin(), c.finalizers.end(),
                                          [&](const auto& f) { return f->splits_over() == &mesh.tp(); });
  if (s.tp > 1 && !splits_over_tp) {
    ZERO_THROW(InvalidArgument,
               "PipelineStage: no gradient finalizer of the engine (EngineComms.finalizers) works over the mesh's "
               "tensor-parallel group of {} ranks: {}",
               s.tp, fix);
  }
  const int norm_size = c.model_parallel ? c.model_parallel->size() : 1;
  if (norm_size != s.tp * s.pp) {
    ZERO_THROW(InvalidArgument,
               "PipelineStage: the engine adds the gradient norm over {} rank(s) (EngineComms.model_parallel{}) but "
               "the model is split over tp x pp = {}: each stage would clip by its own norm; {}",
               norm_size, c.model_parallel ? "" : " is null", s.tp * s.pp, fix);
  }
}

}  // namespace

PipelineStage::PipelineStage(const comm::Mesh& mesh, Engine& engine, Schedule schedule, PipelineOptions options)
    : mesh_(mesh), engine_(engine), schedule_(std::move(schedule)), rank_(mesh.pp().rank()) {
  check_schedule(schedule_);
  if (schedule_.ranks != mesh.pp().size()) {
    ZERO_THROW(InvalidArgument, "PipelineStage: the schedule '{}' has {} pipeline ranks but the mesh's pp is {}",
               schedule_.name, schedule_.ranks, mesh.pp().size());
  }
  cut_ = cut_layers(options, schedule_.virtual_stages());
  check_engine(mesh, engine);
  engine.interleave_micro_batches(schedule_.microbatches);
  loss_comm_ = mesh.dp().split(0, mesh.dp().rank());
  runner_ = std::make_unique<PipelineRunner>(
      schedule_, rank_, mesh.pp(), [this](int, int k) { return model_.activation(k, mb_samples_); }, options.device);
}

PipelineStage::~PipelineStage() = default;

bool PipelineStage::holds_last_stage() const { return schedule_.rank_of(schedule_.virtual_stages() - 1) == rank_; }

std::pair<int, int> PipelineStage::data_parallel_slice(int global_batch) const {
  const int dp = mesh_.shape().dp;
  if (global_batch < 1 || global_batch % dp != 0) {
    ZERO_THROW(InvalidArgument, "PipelineStage: a global batch of {} samples does not divide among {} data-parallel ranks",
               global_batch, dp);
  }
  const int per = global_batch / dp;
  return {mesh_.coord().dp * per, (mesh_.coord().dp + 1) * per};
}

void PipelineStage::finalize(StageModel model) {
  if (finalized_) ZERO_THROW(InvalidArgument, "PipelineStage::finalize() called twice");
  const char* missing = !model.forward      ? "forward"
                        : !model.backward   ? "backward"
                        : !model.activation ? "activation"
                                            : nullptr;
  if (missing != nullptr) ZERO_THROW(InvalidArgument, "PipelineStage::finalize(): no StageModel::{} was given", missing);
  if (schedule_.split_backward && !model.weight) {
    ZERO_THROW(InvalidArgument,
               "PipelineStage::finalize(): the schedule '{}' splits the backward into B and W but no weight function "
               "was given (StageModel::weight)",
               schedule_.name);
  }
  // Every rank's count of trainable parameters, so that every rank names the same empty stages.
  comm::Communicator& world = mesh_.world();
  int64_t mine = static_cast<int64_t>(engine_.registry().trainable().size());
  std::vector<int64_t> counts(static_cast<size_t>(world.size()), 0);
  world.all_gather(&mine, counts.data(), 1, DType::kInt64)->wait();
  std::string empty;
  for (int r = 0; r < world.size(); ++r) {
    if (counts[static_cast<size_t>(r)] > 0) continue;
    const int p = mesh_.mesh_layout().coord(r).pp;
    for (int c = 0; c < schedule_.chunks; ++c) {
      const LayerRange l = cut_[static_cast<size_t>(schedule_.virtual_stage(p, c))];
      empty += fmt::format("{}virtual stage {} (pipeline rank {}, world rank {}: layers [{}, {}))", empty.empty() ? "" : "; ",
                           schedule_.virtual_stage(p, c), p, r, l.first, l.end);
    }
  }
  if (!empty.empty()) {
    ZERO_THROW(InvalidArgument,
               "PipelineStage: stages registered no trainable parameters: {}; {} virtual stages over {} layers (pp x "
               "chunks, or PipelineOptions.layer_counts, leaves a stage without a layer)",
               empty, schedule_.virtual_stages(), cut_.back().end);
  }
  model_ = std::move(model);
  engine_.finalize();
  finalized_ = true;
}

StageCall PipelineStage::call(int mb, int chunk, std::any& context, int samples_per_mb) const {
  const int k = virtual_stage(chunk);
  return StageCall{.mb = mb,
                   .chunk = chunk,
                   .virtual_stage = k,
                   .first = k == 0,
                   .last = k == schedule_.virtual_stages() - 1,
                   .layers = cut_[static_cast<size_t>(k)],
                   .sample_begin = mb * samples_per_mb,
                   .sample_end = (mb + 1) * samples_per_mb,
                   .context = context};
}

namespace {

int per_micro_batch(int samples, int m, const char* what) {
  if (samples < 1 || samples % m != 0) {
    ZERO_THROW(InvalidArgument, "PipelineStage::{}: this data-parallel rank's batch of {} samples does not divide into {} micro-batches",
               what, samples, m);
  }
  return samples / m;
}

}  // namespace

PipelineStage::StepResult PipelineStage::train_step(int samples, float loss_scale) {
  if (!finalized_) ZERO_THROW(InvalidArgument, "PipelineStage::train_step() before finalize()");
  const int m = schedule_.microbatches;
  mb_samples_ = per_micro_batch(samples, m, "train_step");
  std::vector<float> losses(static_cast<size_t>(m), 0.0f);
  std::map<std::pair<int, int>, std::any> contexts;
  StageFunctions fns;
  fns.forward = [&](int mb, int chunk, const StageTensor& input, StageTensor& output) {
    StageCall c = call(mb, chunk, contexts[{mb, chunk}], mb_samples_);
    c.loss_scale = loss_scale;
    const float loss = model_.forward(c, input, output);
    if (c.last) losses[static_cast<size_t>(mb)] = loss;
  };
  fns.backward = [&](int mb, int chunk, bool with_weight, const StageTensor& grad_output, StageTensor& grad_input) {
    StageCall c = call(mb, chunk, contexts.at({mb, chunk}), mb_samples_);
    c.part = with_weight ? BackwardPart::kAll : BackwardPart::kInput;
    c.loss_scale = loss_scale;
    model_.backward(c, grad_output, grad_input);
    if (with_weight) contexts.erase({mb, chunk});
  };
  if (model_.weight) {
    fns.weight = [&](int mb, int chunk) {
      StageCall c = call(mb, chunk, contexts.at({mb, chunk}), mb_samples_);
      c.part = BackwardPart::kWeight;
      c.loss_scale = loss_scale;
      model_.weight(c);
      contexts.erase({mb, chunk});
    };
  }
  StepResult r;
  r.spans = runner_->run(fns);
  r.loss = global_mean(losses);
  r.losses = std::move(losses);
  return r;
}

PipelineStage::EvalResult PipelineStage::evaluate(int samples, int micro_batches) {
  if (!finalized_) ZERO_THROW(InvalidArgument, "PipelineStage::evaluate() before finalize()");
  const int m = micro_batches > 0 ? micro_batches : schedule_.microbatches;
  const int per = per_micro_batch(samples, m, "evaluate");
  std::optional<EvaluationScope> evaluating;
  if (!engine_.evaluating()) evaluating.emplace(engine_.evaluation());
  comm::Communicator& pp = mesh_.pp();
  const int V = schedule_.virtual_stages();
  auto allocate = [&](int k) { return StageTensor::allocate(runner_->device(), model_.activation(k, per)); };
  EvalResult r;
  r.losses.assign(static_cast<size_t>(m), 0.0f);
  for (int mb = 0; mb < m; ++mb) {
    StageTensor x;
    for (int k = 0; k < V; ++k) {
      if (schedule_.rank_of(k) != rank_) continue;
      if (k > 0 && schedule_.rank_of(k - 1) != rank_) {
        x = allocate(k - 1);
        pp.recv(x.data(), x.numel(), x.dtype(), schedule_.rank_of(k - 1))->wait();
      }
      std::any context;
      StageCall c = call(mb, schedule_.chunk_of(k), context, per);
      c.training = false;
      StageTensor out = k + 1 < V ? allocate(k) : StageTensor();
      const float loss = model_.forward(c, x, out);
      if (c.last) r.losses[static_cast<size_t>(mb)] = loss;
      if (k + 1 < V && schedule_.rank_of(k + 1) != rank_) {
        pp.send(out.data(), out.numel(), out.dtype(), schedule_.rank_of(k + 1))->wait();
      }
      x = std::move(out);
    }
  }
  if (evaluating) evaluating->close();
  r.loss = global_mean(r.losses);
  return r;
}

void PipelineStage::from_last_stage(float* values, size_t count) {
  if (schedule_.ranks == 1) return;
  mesh_.pp().broadcast(values, count, DType::kFloat32, schedule_.rank_of(schedule_.virtual_stages() - 1))->wait();
}

float PipelineStage::global_mean(std::vector<float>& losses) {
  from_last_stage(losses.data(), losses.size());
  double sum = 0;  // in micro-batch order: every schedule adds the same way
  for (float l : losses) sum += l;
  float mean = static_cast<float>(sum / static_cast<double>(losses.size()));
  if (loss_comm_->size() == 1) return mean;
  loss_comm_->all_reduce(&mean, 1, DType::kFloat32, comm::ReduceOp::kSum)->wait();
  return mean / static_cast<float>(loss_comm_->size());
}

}  // namespace zero::parallel
