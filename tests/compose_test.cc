// Composing the parallelisms with a model of one's own: the residual MLP (tests/residual_mlp.h)
// trained at one (dp, tp, pp) layout, at ZeRO stages 0-3 under every schedule, against the same
// code on one rank: every step's loss and the trained model's forward-only loss within 1e-6
// (relative), and every final parameter within 1e-6.
//
// Built once per layout (COMPOSE_DP, COMPOSE_TP, COMPOSE_PP; tests/BUILD): the three targets are the
// whole matrix of layouts x stages x schedules, which the plain suite runs whole; the sanitizer runs
// take the (2,2,2) target, which runs both the tp and the pp paths (.ci/run).
//
// What a user writes beside the model's math, its data and the loop is the "glue" below: the mesh,
// the engine built from it, the pipeline stage, the model's chunks and their functions.
#include <doctest/doctest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "comm/mesh.h"
#include "parallel/engine_comms.h"
#include "parallel/pipeline/pipeline_stage.h"
#include "parallel/pipeline/schedules.h"
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

struct Trained {
  std::vector<float> losses;              // per step
  float evaluated = 0;                    // the trained model's loss, forward only
  std::vector<std::vector<float>> params;  // per (layer, tensor): this rank's part
  std::vector<std::unique_ptr<ResidualMlp>> chunks;  // to cut the reference's tensors as this rank holds them
};

Trained train(comm::Communicator& world, const comm::MeshShape& shape, int stage, const std::string& schedule) {
  Trained r;
  // --- glue ---
  comm::Mesh mesh(world, shape);
  Engine engine(parallel::engine_comms(mesh), options(stage));
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
Trained on_one_rank(int stage) {
  Trained want;
  run_thread_ranks(1, [&](comm::Communicator& world) { want = train(world, {}, stage, "1f1b"); });
  return want;
}

void check_layout(const comm::MeshShape& shape, const std::vector<int>& stages) {
  for (int stage : stages) {
    const Trained want = on_one_rank(stage);
    REQUIRE(want.losses.back() < want.losses.front());  // it trains
    for (const char* schedule : {"gpipe", "1f1b", "interleaved", "zb-h1"}) {
      CAPTURE(stage);
      CAPTURE(schedule);
      run_thread_ranks(shape.world_size(), [&](comm::Communicator& world) {
        const Trained got = train(world, shape, stage, schedule);
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

}  // namespace
}  // namespace zero::testing
