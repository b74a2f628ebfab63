// Composing the parallelisms with a model of one's own: the residual MLP (tests/residual_mlp.h)
// trained at one (dp, tp, pp) layout, at ZeRO stages 0-3 under every schedule, against the same
// code on one rank: every step's loss and the trained model's forward-only loss within 1e-6
// (relative), and every final parameter within 1e-6.
//
// Built once per layout (COMPOSE_DP, COMPOSE_TP, COMPOSE_PP; tests/BUILD): the three targets are the
// matrix of layouts x stages x schedules. Each runs every stage and every schedule (a covering
// subset; ZERO_FULL_MATRIX=1, scripts/full_matrix.sh, runs every stage under every schedule); the
// sanitizer runs take the (2,2,2) target, which runs both the tp and the pp paths (.ci/run).
//
// What a user writes beside the model's math, its data and the loop is the "glue" below: the mesh,
// the engine built from it, the pipeline stage, the model's chunks and their functions.
#include <doctest/doctest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "comm/mesh.h"
#include "optim/custom_optimizer.h"
#include "parallel/engine_comms.h"
#include "parallel/pipeline/pipeline_stage.h"
#include "parallel/pipeline/schedules.h"
#include "testing/matrix.h"
#include "testing/thread_ranks.h"
#include "tests/residual_mlp.h"
#include "zero/engine.h"

namespace zero::testing {
namespace {

using parallel::StageCall;
using parallel::StageTensor;

constexpr MlpShape kShape{.dim = 8, .hidden = 16, .layers = 4};
constexpr int kBatch = 16, kMicro = 4, kSteps = 3;

EngineOptions options(int stage) {
  EngineOptions o;
  o.stage = stage;
  // SGD with momentum: an update proportional to the gradient, so that a wrong gradient or a wrong
  // clip (a norm added over the wrong group) moves the parameters (Adam's update would hide a
  // uniform scale).
  o.optimizer.kind = optim::OptimizerKind::kSgd;
  o.optimizer.groups = {optim::Hyper{.lr = 0.05f, .weight_decay = 0.01f, .momentum = 0.9f}};
  o.max_grad_norm = 0.5f;  // clips every step
  o.deterministic = true;
  o.timeout = std::chrono::seconds(60);
  o.layout = {.alignment = 4, .bucket_numel = 64, .block = 8};
  return o;
}

// A rule that needs whole tensors (LARS's trust ratio): each tensor's step is the gradient scaled by
// ||w|| / ||g|| of the whole tensor, so a rank that saw only its slice of a tensor split over tp
// would take another step than one rank holding it whole.
class TrustRatioRule : public optim::CustomOptimizer {
 public:
  std::string name() const override { return "trust-ratio"; }
  std::vector<std::string> state_names() const override { return {}; }
  bool needs_whole_tensors() const override { return true; }
  void update(const optim::UpdateContext& context, const optim::OwnedRange& r) override {
    double w2 = 0, g2 = 0;
    for (size_t i = 0; i < r.numel; ++i) {
      w2 += static_cast<double>(r.master[i]) * r.master[i];
      g2 += static_cast<double>(r.grad[i]) * r.grad[i];
    }
    const float ratio = w2 > 0 && g2 > 0 ? static_cast<float>(std::sqrt(w2 / g2)) : 1.0f;
    const float lr = context.groups[static_cast<size_t>(r.group)].lr * ratio;
    for (size_t i = 0; i < r.numel; ++i) r.master[i] -= lr * r.grad[i];
  }
};

// options(stage) with the trust-ratio rule, each tensor owned whole by one data-parallel rank.
EngineOptions whole_tensor_options(int stage) {
  EngineOptions o = options(stage);
  o.optimizer.custom = std::make_shared<TrustRatioRule>();
  o.optimizer.groups = {optim::Hyper{.lr = 0.02f}};
  o.layout.whole_tensors = true;
  return o;
}

struct Trained {
  std::vector<float> losses;              // per step
  float evaluated = 0;                    // the trained model's loss, forward only
  std::vector<std::vector<float>> params;  // per (layer, tensor): this rank's part
  std::vector<std::unique_ptr<ResidualMlp>> chunks;  // to cut the reference's tensors as this rank holds them
};

Trained train(comm::Communicator& world, const comm::MeshShape& shape, const EngineOptions& opt,
              const std::string& schedule) {
  Trained r;
  // --- glue ---
  comm::Mesh mesh(world, shape);
  Engine engine(parallel::engine_comms(mesh), opt);
  const int chunks = schedule == "interleaved" ? 2 : 1;
  parallel::PipelineStage pipe(mesh, engine, parallel::make_schedule(schedule, shape.pp, kMicro, chunks),
                               {.layers = kShape.layers});
  for (int c = 0; c < pipe.chunks(); ++c) {
    r.chunks.push_back(std::make_unique<ResidualMlp>(kShape, mesh.tp(), engine, pipe.layers(c)));
  }
  const int sample0 = pipe.data_parallel_slice(kBatch).first;
  auto chunk = [&](const StageCall& c) -> ResidualMlp& { return *r.chunks[static_cast<size_t>(c.chunk)]; };
  pipe.finalize({
      .forward = [&](const StageCall& c, const StageTensor& in, StageTensor& out) { return chunk(c).forward(c, in, out, sample0); },
      .backward = [&](const StageCall& c, const StageTensor& dy, StageTensor& dx) { chunk(c).backward(c, dy, dx); },
      .weight = [&](const StageCall& c) { chunk(c).weight(c); },
      .activation = [](int, int samples) { return parallel::TensorSpec{static_cast<size_t>(samples * kShape.dim)}; },
  });
  // --- the loop ---
  for (int step = 0; step < kSteps; ++step) {
    r.losses.push_back(pipe.train_step(kBatch / shape.dp, engine.loss_scale()).loss);
    engine.step();
  }
  r.evaluated = pipe.evaluate(kBatch / shape.dp).loss;
  for (int c = 0; c < pipe.chunks(); ++c) {
    for (int l = pipe.layers(c).first; l < pipe.layers(c).end; ++l) {
      for (int t = 0; t < 4; ++t) r.params.push_back(r.chunks[static_cast<size_t>(c)]->param(l, t));
    }
  }
  return r;
}

// The reference: the same code on one rank, every parameter whole.
Trained on_one_rank(const EngineOptions& opt) {
  Trained want;
  run_thread_ranks(1, [&](comm::Communicator& world) { want = train(world, {}, opt, "1f1b"); });
  return want;
}

void check_layout(const comm::MeshShape& shape, const std::vector<int>& stages,
                  EngineOptions (*options_at)(int stage) = options,
                  const std::vector<const char*>& schedules = {"gpipe", "1f1b", "interleaved", "zb-h1"}) {
  for (size_t si = 0; si < stages.size(); ++si) {
    const int stage = stages[si];
    const Trained want = on_one_rank(options_at(stage));
    REQUIRE(want.losses.back() < want.losses.front());  // it trains
    for (size_t k = 0; k < schedules.size(); ++k) {
      // The covering subset: the i-th stage under the i-th schedule (in turn), so that every stage and
      // every schedule runs; ZERO_FULL_MATRIX=1 runs each stage under every schedule.
      if (!full_matrix() && k != si % schedules.size()) continue;
      const char* schedule = schedules[k];
      CAPTURE(stage);
      CAPTURE(schedule);
      run_thread_ranks(shape.world_size(), [&](comm::Communicator& world) {
        const Trained got = train(world, shape, options_at(stage), schedule);
        for (int s = 0; s < kSteps; ++s) {
          CHECK(std::abs(got.losses[static_cast<size_t>(s)] - want.losses[static_cast<size_t>(s)]) <=
                1e-6 * std::abs(want.losses[static_cast<size_t>(s)]));
        }
        CHECK(std::abs(got.evaluated - want.evaluated) <= 1e-6 * std::abs(want.evaluated));
        CHECK(got.evaluated < want.losses.back());  // it evaluates the trained parameters
        // This rank's parts, against the same parts of the reference's whole tensors.
        size_t i = 0;
        double worst = 0;
        for (const auto& c : got.chunks) {
          for (int l = c->layers().first; l < c->layers().end; ++l) {
            for (int t = 0; t < 4; ++t, ++i) {
              const std::vector<float> part = c->part_of(t, want.params[static_cast<size_t>(l * 4 + t)]);
              REQUIRE(part.size() == got.params[i].size());
              for (size_t e = 0; e < part.size(); ++e) worst = std::max(worst, static_cast<double>(std::abs(part[e] - got.params[i][e])));
            }
          }
        }
        CHECK(i == got.params.size());
        CHECK(worst <= 1e-6);
      }, std::chrono::seconds(120));
    }
  }
}

TEST_CASE("a residual MLP of its own trains at (dp, tp, pp) as on one rank, under every schedule") {
  const comm::MeshShape shape{.pp = COMPOSE_PP, .dp = COMPOSE_DP, .tp = COMPOSE_TP};
  CAPTURE(shape.describe());
  check_layout(shape, {0, 1, 2, 3});
}

// Tensor parallelism's finalizer gathers each split tensor whole for the rule at update time (its
// slice kept), so the rule sees what it sees on one rank.
TEST_CASE("a rule that needs whole tensors sees each tensor whole at (dp, tp, pp), as on one rank") {
  const comm::MeshShape shape{.pp = COMPOSE_PP, .dp = COMPOSE_DP, .tp = COMPOSE_TP};
  CAPTURE(shape.describe());
  check_layout(shape, {1, 3}, whole_tensor_options, {"1f1b", "zb-h1"});
}

}  // namespace
}  // namespace zero::testing
