// The LibTorch GPT (examples/libtorch/torch_gpt.h) through TorchPipeline at several (dp, tp, pp)
// layouts and ZeRO stages, on ranks as threads, against the same model on one rank: every step's
// loss and the trained model's forward-only loss within 1e-5 (relative). The layouts take every
// path: data parallelism, tensor parallelism (heads, the MLP and the vocabulary split), pipeline
// stages (1F1B, interleaved), and all three at once. Also the refusal of heads tp does not divide.
#include "adapters/libtorch/torch_doctest.h"

#include <string>
#include <vector>

#include "adapters/libtorch/torch_pipeline.h"
#include "base/error.h"
#include "comm/mesh.h"
#include "examples/libtorch/torch_gpt.h"
#include "parallel/engine_comms.h"
#include "parallel/pipeline/pipeline_stage.h"
#include "parallel/pipeline/schedules.h"
#include "testing/thread_ranks.h"
#include "zero/engine.h"

namespace zero::examples {
namespace {

constexpr TorchGptConfig kConfig{.vocab = 64, .block_size = 8, .n_layer = 2, .n_head = 4, .n_embd = 32};
constexpr int kBatch = 8, kMicro = 4, kSteps = 3;
constexpr uint64_t kSeed = 7;

torch::Tensor tokens() {
  return (torch::arange(kBatch * kConfig.block_size, torch::kLong).reshape({kBatch, kConfig.block_size}) * 7 + 3) %
         kConfig.vocab;
}
torch::Tensor targets() { return (tokens() * 5 + 1) % kConfig.vocab; }

EngineOptions options(int stage) {
  EngineOptions o;
  o.stage = stage;
  o.optimizer.kind = optim::OptimizerKind::kAdamW;
  o.optimizer.groups = {optim::Hyper{.lr = 3e-3f, .weight_decay = 0.01f}};
  o.max_grad_norm = 1.0f;
  o.deterministic = true;
  o.timeout = std::chrono::seconds(60);
  return o;
}

struct Run {
  std::vector<float> losses;
  float evaluated = 0;
};

Run train(comm::Communicator& world, const comm::MeshShape& shape, int stage, const std::string& schedule) {
  comm::Mesh mesh(world, shape);
  Engine engine(parallel::engine_comms(mesh), options(stage));
  const int chunks = schedule == "interleaved" ? 2 : 1;
  parallel::PipelineStage pipe(mesh, engine, parallel::make_schedule(schedule, shape.pp, kMicro, chunks),
                               {.layers = kConfig.layers()});
  const int sample0 = pipe.data_parallel_slice(kBatch).first;
  const torch::Tensor x = tokens(), y = targets();
  auto samples = [&](const torch::Tensor& t, const parallel::StageCall& c) {
    return t.slice(0, sample0 + c.sample_begin, sample0 + c.sample_end);
  };
  libtorch::TorchPipeline stages(
      engine, pipe,
      [&](int l) {
        std::lock_guard<std::mutex> lock(testing::generator_mutex());
        return gpt_layer(kConfig, mesh.tp(), l, kSeed);
      },
      {.input = [&](const parallel::StageCall& c) { return samples(x, c); },
       .loss = [&](const parallel::StageCall& c, const torch::Tensor& out) { return gpt_loss(kConfig, mesh.tp(), out, samples(y, c)); },
       .activation_shape = [](int, int n) { return std::vector<int64_t>{n, kConfig.block_size, kConfig.n_embd}; }});
  stages.finalize();
  Run r;
  for (int step = 0; step < kSteps; ++step) {
    r.losses.push_back(pipe.train_step(kBatch / shape.dp, engine.loss_scale()).loss);
    engine.step();
  }
  r.evaluated = pipe.evaluate(kBatch / shape.dp).loss;
  return r;
}

Run on_one_rank(int stage) {
  Run want;
  testing::run_thread_ranks(1, [&](comm::Communicator& world) { want = train(world, {}, stage, "1f1b"); });
  return want;
}

}  // namespace

TEST_CASE("the LibTorch GPT trains at (dp, tp, pp) layouts as on one rank") {
  struct Case {
    comm::MeshShape shape;
    int stage;
    std::string schedule;
  };
  const std::vector<Case> cases = {
      {{.pp = 1, .dp = 2, .tp = 1}, 2, "1f1b"},  {{.pp = 1, .dp = 1, .tp = 2}, 1, "1f1b"},
      {{.pp = 2, .dp = 1, .tp = 1}, 3, "1f1b"},  {{.pp = 2, .dp = 1, .tp = 1}, 0, "interleaved"},
      {{.pp = 2, .dp = 2, .tp = 2}, 1, "1f1b"},  {{.pp = 2, .dp = 2, .tp = 2}, 3, "interleaved"},
  };
  std::map<int, Run> want;
  for (const Case& c : cases) {
    if (!want.count(c.stage)) want[c.stage] = on_one_rank(c.stage);
    const Run& ref = want[c.stage];
    CAPTURE(c.shape.dp);
    CAPTURE(c.shape.tp);
    CAPTURE(c.shape.pp);
    CAPTURE(c.stage);
    CAPTURE(c.schedule);
    testing::run_thread_ranks(c.shape.dp * c.shape.tp * c.shape.pp, [&](comm::Communicator& world) {
      const Run got = train(world, c.shape, c.stage, c.schedule);
      REQUIRE(got.losses.size() == ref.losses.size());
      for (size_t s = 0; s < got.losses.size(); ++s) CHECK(got.losses[s] == doctest::Approx(ref.losses[s]).epsilon(1e-5));
      CHECK(got.evaluated == doctest::Approx(ref.evaluated).epsilon(1e-5));
    });
  }
  // It learns: the loss falls over the steps.
  CHECK(want[1].losses.back() < want[1].losses.front());
}

TEST_CASE("heads that tp does not divide are refused by name") {
  testing::run_thread_ranks(2, [&](comm::Communicator& tp) {
    TorchGptConfig c = kConfig;
    c.n_head = 3;
    c.n_embd = 24;
    CHECK_THROWS_WITH_AS(GptBlock(c, tp), "GPT: n_head = 3 is not a multiple of tp = 2: each rank takes whole heads",
                         InvalidArgument);
  });
}

}  // namespace zero::examples
