// Pipeline stages of torch::nn modules (TorchPipeline) against the whole model on one rank through
// TorchEngine, on ranks as threads: a residual MLP of 4 torch::nn blocks, every step's loss and every
// final parameter within 1e-5, under GPipe, 1F1B, interleaved (2 chunks) and ZB-H1 (its split
// backward; at stage 3 its weight part gathers the parameters in a scope of its own), at ZeRO
// stages 0-3, at pp 2 and dp 2 x pp 2, with tensor-parallel blocks at dp 1 x tp 2 x pp 2, and with
// activation recompute; the trained model's forward-only loss.
#include "adapters/libtorch/torch_doctest.h"

#include <fmt/format.h>

#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "adapters/libtorch/tensor_parallel.h"
#include "adapters/libtorch/torch_engine.h"
#include "adapters/libtorch/torch_pipeline.h"
#include "base/error.h"
#include "comm/mesh.h"
#include "parallel/engine_comms.h"
#include "parallel/pipeline/pipeline_stage.h"
#include "parallel/pipeline/schedules.h"
#include "testing/thread_ranks.h"
#include "zero/engine.h"

namespace zero::libtorch {
namespace {

using testing::generator_mutex;

constexpr int64_t kDim = 8, kHidden = 16;
constexpr int kLayers = 4, kBatch = 16, kMicro = 4, kSteps = 3;

// Counts its forwards with and without autograd (recompute runs each twice, the first without).
struct CountedForwards {
  int with_grad = 0, without_grad = 0;
  void count() { ++(torch::GradMode::is_enabled() ? with_grad : without_grad); }
};

// y = x + fc2(relu(fc1(x))); with tp, fc1 column-parallel and fc2 row-parallel.
struct BlockImpl : torch::nn::Module, CountedForwards {
  BlockImpl()
      : fc1(register_module("fc1", torch::nn::Linear(kDim, kHidden))),
        fc2(register_module("fc2", torch::nn::Linear(kHidden, kDim))) {}
  torch::Tensor forward(torch::Tensor x) {
    count();
    return x + fc2(torch::relu(fc1(x)));
  }
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(Block);

struct SplitBlockImpl : torch::nn::Module, CountedForwards {
  explicit SplitBlockImpl(comm::Communicator& tp)
      : fc1(register_module("fc1", ColumnParallelLinear(kDim, kHidden, tp))),
        fc2(register_module("fc2", RowParallelLinear(kHidden, kDim, tp))) {}
  torch::Tensor forward(torch::Tensor x) {
    count();
    return x + fc2(torch::relu(fc1(x)));
  }
  ColumnParallelLinear fc1;
  RowParallelLinear fc2;
};
TORCH_MODULE(SplitBlock);

// Layer l built from seed 100 + l, one at a time: every rank (and the reference) draws the same
// values for it.
template <typename Make>
auto seeded(int layer, Make make) {
  std::lock_guard<std::mutex> lock(generator_mutex());
  torch::manual_seed(static_cast<uint64_t>(100 + layer));
  return make();
}

torch::Tensor inputs() { return torch::sin(torch::arange(kBatch * kDim, torch::kFloat).reshape({kBatch, kDim}) * 0.37); }
torch::Tensor targets() { return torch::cos(torch::arange(kBatch * kDim, torch::kFloat).reshape({kBatch, kDim}) * 0.21); }

EngineOptions options(int stage) {
  EngineOptions o;
  o.stage = stage;
  // SGD with momentum: an update proportional to the gradient, so a wrong gradient moves the
  // parameters (Adam's would hide a uniform scale); clipping engaged every step.
  o.optimizer.kind = optim::OptimizerKind::kSgd;
  o.optimizer.groups = {optim::Hyper{.lr = 0.05f, .weight_decay = 0.01f, .momentum = 0.9f}};
  o.max_grad_norm = 0.5f;
  o.deterministic = true;
  o.timeout = std::chrono::seconds(60);
  return o;
}

struct Trained {
  std::vector<float> losses;
  float evaluated = 0;
  std::map<std::string, torch::Tensor> params;  // this rank's (its tp parts)
  int tp_rank = 0;
  std::vector<CountedForwards> forwards;  // this rank's layers'
};

// The whole model on one rank, micro-batch by micro-batch through TorchEngine.
Trained reference(int stage) {
  Trained want;
  testing::run_thread_ranks(1, [&](comm::Communicator& world) {
    torch::nn::Sequential model;
    for (int l = 0; l < kLayers; ++l) model->push_back(seeded(l, [] { return Block(); }));
    EngineOptions o = options(stage);
    o.micro_batches = kMicro;
    Engine engine(world, o);
    TorchEngine zt(engine, *model);
    zt.finalize();
    const torch::Tensor x = inputs(), y = targets();
    const int per = kBatch / kMicro;
    for (int step = 0; step < kSteps; ++step) {
      double sum = 0;
      for (int mb = 0; mb < kMicro; ++mb) {
        const torch::Tensor loss =
            torch::mse_loss(zt.forward(model, x.slice(0, mb * per, (mb + 1) * per)), y.slice(0, mb * per, (mb + 1) * per));
        sum += loss.item<float>();
        zt.backward(loss);
      }
      want.losses.push_back(static_cast<float>(sum / kMicro));
      zt.step();
    }
    for (auto& [name, t] : zt.full_parameters()) want.params[name] = t;
    torch::NoGradGuard no_grad;
    want.evaluated = torch::mse_loss(zt.forward(model, x), y).item<float>();
  });
  return want;
}

Trained train(comm::Communicator& world, const comm::MeshShape& shape, int stage, const std::string& schedule,
              bool recompute = false) {
  Trained r;
  comm::Mesh mesh(world, shape);
  Engine engine(parallel::engine_comms(mesh), options(stage));
  const int chunks = schedule == "interleaved" ? 2 : 1;
  parallel::PipelineStage pipe(mesh, engine, parallel::make_schedule(schedule, shape.pp, kMicro, chunks),
                               {.layers = kLayers});
  const int sample0 = pipe.data_parallel_slice(kBatch).first;
  const torch::Tensor x = inputs(), y = targets();
  auto samples = [&](const torch::Tensor& t, const parallel::StageCall& c) {
    return t.slice(0, sample0 + c.sample_begin, sample0 + c.sample_end);
  };
  TorchPipeline torch_pipe(
      engine, pipe,
      [&](int l) {
        return shape.tp > 1 ? torch::nn::AnyModule(seeded(l, [&] { return SplitBlock(mesh.tp()); }))
                            : torch::nn::AnyModule(seeded(l, [] { return Block(); }));
      },
      {.input = [&](const parallel::StageCall& c) { return samples(x, c); },
       .loss = [&](const parallel::StageCall& c, const torch::Tensor& out) { return torch::mse_loss(out, samples(y, c)); },
       .activation_shape = [](int, int n) { return std::vector<int64_t>{n, kDim}; },
       .recompute = recompute});
  torch_pipe.finalize();
  for (int step = 0; step < kSteps; ++step) {
    r.losses.push_back(pipe.train_step(kBatch / shape.dp, engine.loss_scale()).loss);
    engine.step();
  }
  r.evaluated = pipe.evaluate(kBatch / shape.dp).loss;
  for (auto& [name, t] : torch_pipe.parameters()) r.params[name] = t;
  r.tp_rank = mesh.coord().tp;
  for (int c = 0; c < pipe.chunks(); ++c) {
    for (int l = pipe.layers(c).first; l < pipe.layers(c).end; ++l) {
      torch::nn::AnyModule& m = torch_pipe.layer(l);
      r.forwards.push_back(shape.tp > 1 ? static_cast<CountedForwards&>(*m.get<SplitBlock>()) : *m.get<Block>());
    }
  }
  return r;
}

bool close(const torch::Tensor& a, const torch::Tensor& b) { return a.sizes() == b.sizes() && torch::allclose(a, b, 1e-5, 1e-6); }

// This rank's part of a whole reference tensor: fc1's rows and fc2's columns at tp 2.
torch::Tensor part_of(const std::string& name, const torch::Tensor& whole, int tp, int r) {
  if (tp == 1) return whole;
  if (name.find("fc1.") != std::string::npos) return whole.chunk(tp, 0)[static_cast<size_t>(r)];
  if (name.find("fc2.weight") != std::string::npos) return whole.chunk(tp, 1)[static_cast<size_t>(r)];
  return whole;
}

void check_matches(const Trained& got, const Trained& want, int tp) {
  REQUIRE(got.losses.size() == want.losses.size());
  for (size_t s = 0; s < got.losses.size(); ++s) CHECK(got.losses[s] == doctest::Approx(want.losses[s]).epsilon(1e-5));
  CHECK(got.evaluated == doctest::Approx(want.evaluated).epsilon(1e-5));
  CHECK(!got.params.empty());
  for (const auto& [name, t] : got.params) {
    CAPTURE(name);
    REQUIRE(want.params.count(name) == 1);
    CHECK(close(t, part_of(name, want.params.at(name), tp, got.tp_rank)));
  }
}

void run_layout(const comm::MeshShape& shape, const std::vector<int>& stages, const std::vector<std::string>& schedules,
                bool recompute = false) {
  for (int stage : stages) {
    const Trained want = reference(stage);
    for (const std::string& schedule : schedules) {
      CAPTURE(stage);
      CAPTURE(schedule);
      testing::run_thread_ranks(shape.dp * shape.tp * shape.pp, [&](comm::Communicator& world) {
        const Trained got = train(world, shape, stage, schedule, recompute);
        check_matches(got, want, shape.tp);
        // Every micro-batch's forward under autograd once per step; without it, the evaluation's
        // (and with recompute, each training forward's first run).
        const int trained = kSteps * kMicro, evaluated = kMicro;
        for (const CountedForwards& f : got.forwards) {
          CHECK(f.with_grad == trained);
          CHECK(f.without_grad == evaluated + (recompute ? trained : 0));
        }
      });
    }
  }
}

}  // namespace

TEST_CASE("torch::nn stages at pp 2 train as the whole model under every schedule at stages 0-3") {
  run_layout({.pp = 2, .dp = 1, .tp = 1}, {0, 1, 2, 3}, {"gpipe", "1f1b", "interleaved", "zb-h1"});
}

TEST_CASE("torch::nn stages at dp 2 x pp 2 train as the whole model") {
  run_layout({.pp = 2, .dp = 2, .tp = 1}, {1, 3}, {"1f1b", "zb-h1"});
}

TEST_CASE("tensor-parallel torch::nn stages at tp 2 x pp 2 train as the whole model") {
  run_layout({.pp = 2, .dp = 1, .tp = 2}, {0, 3}, {"1f1b", "interleaved"});
}

TEST_CASE("torch::nn stages with activation recompute train as the whole model") {
  run_layout({.pp = 2, .dp = 1, .tp = 1}, {0, 3}, {"1f1b", "zb-h1"}, /*recompute=*/true);
}

TEST_CASE("missing functions are refused by name") {
  testing::run_thread_ranks(2, [&](comm::Communicator& world) {
    comm::Mesh mesh(world, comm::MeshShape{.pp = 2, .dp = 1, .tp = 1});
    Engine engine(parallel::engine_comms(mesh), options(3));
    parallel::PipelineStage pipe(mesh, engine, parallel::make_schedule("zb-h1", 2, kMicro, 1), {.layers = kLayers});
    const auto block = [](int) { return torch::nn::AnyModule(Block()); };
    const TorchStageFunctions fns{.input = [](const parallel::StageCall&) { return torch::Tensor(); },
                                  .loss = [](const parallel::StageCall&, const torch::Tensor& t) { return t.sum(); },
                                  .activation_shape = [](int, int n) { return std::vector<int64_t>{n, kDim}; }};
    TorchStageFunctions no_loss = fns;
    no_loss.loss = nullptr;
    CHECK_THROWS_WITH_AS(TorchPipeline(engine, pipe, block, no_loss), "TorchPipeline: TorchStageFunctions.loss is not set",
                         InvalidArgument);
  });
}

TEST_CASE("a layer of another pipeline stage is refused by name") {
  testing::run_thread_ranks(2, [&](comm::Communicator& world) {
    comm::Mesh mesh(world, comm::MeshShape{.pp = 2, .dp = 1, .tp = 1});
    Engine engine(parallel::engine_comms(mesh), options(1));
    parallel::PipelineStage pipe(mesh, engine, parallel::make_schedule("1f1b", 2, kMicro, 1), {.layers = kLayers});
    TorchPipeline stages(engine, pipe, [](int) { return torch::nn::AnyModule(Block()); },
                         {.input = [](const parallel::StageCall&) { return torch::Tensor(); },
                          .loss = [](const parallel::StageCall&, const torch::Tensor& t) { return t.sum(); },
                          .activation_shape = [](int, int n) { return std::vector<int64_t>{n, kDim}; }});
    const int other = mesh.coord().pp == 0 ? kLayers - 1 : 0;
    const std::string held = mesh.coord().pp == 0 ? "0, 1" : "2, 3";
    CHECK_THROWS_WITH_AS(stages.layer(other),
                         fmt::format("TorchPipeline: layer {} is not in this rank's chunks, which hold layers {}", other, held).c_str(),
                         InvalidArgument);
    CHECK_NOTHROW(stages.layer(mesh.coord().pp == 0 ? 0 : kLayers - 1));
  });
}

}  // namespace zero::libtorch
