// The tensor-parallel modules against the unsplit torch::nn modules built from the same seed, on 2
// ranks as threads: outputs, input gradients and each rank's slice of the parameter gradients, with
// and without sequence parallelism; the vocabulary-parallel embedding and cross-entropy; training
// through TorchEngine at tp 2 (placements from the modules) against the unsplit model on one rank;
// and the errors that name a size, a token or a parameter.
#include "adapters/libtorch/torch_doctest.h"

#include <mutex>
#include <string>
#include <vector>

#include "adapters/libtorch/tensor_parallel.h"
#include "adapters/libtorch/torch_engine.h"
#include "base/error.h"
#include "comm/mesh.h"
#include "parallel/engine_comms.h"
#include "testing/thread_ranks.h"
#include "zero/engine.h"

namespace zero::libtorch {
namespace {

using testing::generator_mutex;

constexpr int kTp = 2;
constexpr int64_t kBatch = 2, kSeq = 4, kIn = 6, kHidden = 8, kOut = 5;

bool close(const torch::Tensor& a, const torch::Tensor& b, double rtol = 1e-5, double atol = 1e-6) {
  return a.sizes() == b.sizes() && torch::allclose(a, b, rtol, atol);
}

// The unsplit block and its input, weights of the loss and gradients.
struct Reference {
  torch::nn::Linear first{nullptr}, second{nullptr};
  torch::Tensor x, weights, y;
};

Reference reference_block(uint64_t seed) {
  torch::manual_seed(seed);
  Reference r;
  r.first = torch::nn::Linear(kIn, kHidden);
  r.second = torch::nn::Linear(kHidden, kOut);
  r.x = torch::randn({kBatch, kSeq, kIn}).requires_grad_(true);
  r.weights = torch::randn({kBatch, kSeq, kOut});
  r.y = r.second(torch::gelu(r.first(r.x)));
  (r.y * r.weights).sum().backward();
  return r;
}

struct SplitBlock {
  ColumnParallelLinear first{nullptr};
  RowParallelLinear second{nullptr};
};

SplitBlock split_block(uint64_t seed, comm::Communicator& tp, bool sequence_parallel) {
  torch::manual_seed(seed);
  const ParallelLinearOptions o{.sequence_parallel = sequence_parallel};
  return {ColumnParallelLinear(kIn, kHidden, tp, o), RowParallelLinear(kHidden, kOut, tp, o)};
}

torch::Tensor gelu(torch::Tensor x) { return torch::gelu(x); }

torch::Tensor slice(const torch::Tensor& t, int rank, int64_t dim) { return t.chunk(kTp, dim)[static_cast<size_t>(rank)]; }

}  // namespace

TEST_CASE("a column and a row layer between f and g equal the unsplit block, with and without sequence parallelism") {
  for (bool sp : {false, true}) {
    CAPTURE(sp);
    testing::run_thread_ranks(kTp, [&](comm::Communicator& tp) {
      Reference ref;
      SplitBlock block;
      {
        std::lock_guard<std::mutex> lock(generator_mutex());
        ref = reference_block(11);
        block = split_block(11, tp, sp);
      }
      const int r = tp.rank();
      // Under sequence parallelism each rank holds its slice of the sequence, in and out.
      torch::Tensor x = (sp ? slice(ref.x.detach(), r, 1) : ref.x.detach()).clone().requires_grad_(true);
      const torch::Tensor y = block.second(torch::gelu(block.first(x)));
      const torch::Tensor weights = sp ? slice(ref.weights, r, 1) : ref.weights;
      (y * weights).sum().backward();
      CHECK(close(y, sp ? slice(ref.y.detach(), r, 1) : ref.y.detach()));
      CHECK(close(x.grad(), sp ? slice(ref.x.grad(), r, 1) : ref.x.grad()));
      CHECK(close(block.first->weight.grad(), slice(ref.first->weight.grad(), r, 0)));
      CHECK(close(block.first->bias.grad(), slice(ref.first->bias.grad(), r, 0)));
      CHECK(close(block.second->weight.grad(), slice(ref.second->weight.grad(), r, 1)));
      torch::Tensor bias_grad = block.second->bias.grad().clone();
      if (sp) {  // each rank's is the part of its rows: summed over tp, the whole
        CHECK(block.second->tp_placement("bias") == TpPlacement::replicated_partial());
        tp.all_reduce(bias_grad.data_ptr(), static_cast<size_t>(bias_grad.numel()), DType::kFloat32, comm::ReduceOp::kSum)
            ->wait();
      }
      CHECK(close(bias_grad, ref.second->bias.grad()));
      // The values are the unsplit module's slices.
      CHECK(torch::equal(block.first->weight, slice(ref.first->weight, r, 0)));
      CHECK(torch::equal(block.second->weight, slice(ref.second->weight, r, 1)));
      CHECK(torch::equal(block.second->bias, ref.second->bias));
    });
  }
}

TEST_CASE("a column layer's gathered output equals the unsplit layer's, and its gradient comes back split") {
  testing::run_thread_ranks(kTp, [&](comm::Communicator& tp) {
    torch::nn::Linear whole{nullptr};
    ColumnParallelLinear split{nullptr};
    torch::Tensor x;
    {
      std::lock_guard<std::mutex> lock(generator_mutex());
      torch::manual_seed(5);
      whole = torch::nn::Linear(kIn, kHidden);
      torch::manual_seed(5);
      split = ColumnParallelLinear(kIn, kHidden, tp, ParallelLinearOptions{.gather_output = true});
      x = torch::randn({3, kIn});
    }
    const torch::Tensor ref = whole(x);
    const torch::Tensor y = split(x);
    CHECK(close(y, ref));
    (y * y).sum().backward();
    (ref * ref).sum().backward();
    CHECK(close(split->weight.grad(), slice(whole->weight.grad(), tp.rank(), 0)));
  });
}

TEST_CASE("the vocabulary-parallel embedding and cross-entropy equal the unsplit ones with a tied head") {
  constexpr int64_t kVocab = 11, kDim = 4;  // 11 rows padded to 12: one padding row on rank 1
  testing::run_thread_ranks(kTp, [&](comm::Communicator& tp) {
    torch::nn::Embedding whole{nullptr};
    VocabParallelEmbedding split{nullptr};
    torch::Tensor tokens, targets;
    {
      std::lock_guard<std::mutex> lock(generator_mutex());
      torch::manual_seed(3);
      whole = torch::nn::Embedding(kVocab, kDim);
      torch::manual_seed(3);
      split = VocabParallelEmbedding(kVocab, kDim, tp);
      tokens = torch::randint(0, kVocab, {kBatch, kSeq});
      targets = torch::randint(0, kVocab, {kBatch * kSeq});
    }
    // The unsplit model: embedding, tied head, cross-entropy.
    const torch::Tensor h_ref = whole(tokens).reshape({-1, kDim});
    const torch::Tensor loss_ref = torch::nn::functional::cross_entropy(h_ref.matmul(whole->weight.t()), targets);
    loss_ref.backward();
    // Split: the head reads the replicated activation through f.
    const torch::Tensor h = split(tokens).reshape({-1, kDim});
    CHECK(close(h, h_ref.detach()));
    const torch::Tensor logits = copy_to_tp(h, tp).matmul(split->weight.t());
    const torch::Tensor loss = vocab_parallel_cross_entropy(logits, targets, split->range(), tp);
    loss.backward();
    CHECK(loss.item<float>() == doctest::Approx(loss_ref.item<float>()).epsilon(1e-6));
    const parallel::VocabRange& range = split->range();
    CHECK(range.padded == 12);
    const torch::Tensor grad = split->weight.grad();
    CHECK(close(grad.slice(0, 0, range.real_rows()), whole->weight.grad().slice(0, range.begin, range.begin + range.real_rows())));
    // The padding row never takes a gradient, nor a value.
    CHECK(torch::count_nonzero(grad.slice(0, range.real_rows())).item<int64_t>() == 0);
    CHECK(torch::count_nonzero(split->weight.slice(0, range.real_rows())).item<int64_t>() == 0);
  });
}

TEST_CASE("TorchEngine trains a LayerNorm and a tensor-parallel block at tp 2, with and without sequence "
          "parallelism, as the unsplit model on one rank") {
  constexpr int kSteps = 3;
  auto options = [](int stage) {
    EngineOptions o;
    o.stage = stage;
    o.optimizer.kind = optim::OptimizerKind::kAdamW;
    o.optimizer.groups = {optim::Hyper{.lr = 1e-2f, .weight_decay = 0.01f}};
    o.max_grad_norm = 0.5f;  // engaged: the norm must count each split part once, the replicated once
    o.timeout = std::chrono::seconds(60);
    return o;
  };
  auto batch = [](int step) {
    torch::Tensor x = torch::sin(torch::arange(kBatch * kSeq * kIn, torch::kFloat).reshape({kBatch, kSeq, kIn}) * 0.3 + step);
    torch::Tensor w = torch::cos(torch::arange(kBatch * kSeq * kOut, torch::kFloat).reshape({kBatch, kSeq, kOut}) * 0.7 - step);
    return std::pair{x, w};
  };
  const TorchEngineOptions units{.units = {"0", "1", "3"}};
  for (int stage : {0, 3}) {
    CAPTURE(stage);
    // The unsplit model on one rank.
    std::vector<torch::Tensor> ref;
    testing::run_thread_ranks(1, [&](comm::Communicator& world) {
      torch::nn::Sequential model;
      {
        std::lock_guard<std::mutex> lock(generator_mutex());
        torch::manual_seed(21);
        model = torch::nn::Sequential(torch::nn::LayerNorm(torch::nn::LayerNormOptions({kIn})),
                                      torch::nn::Linear(kIn, kHidden), torch::nn::Functional(gelu),
                                      torch::nn::Linear(kHidden, kOut));
      }
      Engine engine(world, options(stage));
      TorchEngine zt(engine, *model, units);
      zt.finalize();
      for (int step = 0; step < kSteps; ++step) {
        const auto [x, w] = batch(step);
        zt.backward((zt.forward(model, x) * w).sum());
        zt.step();
      }
      for (auto& [name, t] : zt.full_parameters()) ref.push_back(t);
    });
    for (bool sp : {false, true}) {
      CAPTURE(sp);
      testing::run_thread_ranks(kTp, [&](comm::Communicator& world) {
        comm::Mesh mesh(world, comm::MeshShape{.pp = 1, .dp = 1, .tp = kTp});
        const int r = mesh.coord().tp;
        const ParallelLinearOptions o{.sequence_parallel = sp};
        torch::nn::Sequential model;
        {
          std::lock_guard<std::mutex> lock(generator_mutex());
          torch::manual_seed(21);
          model = torch::nn::Sequential(torch::nn::LayerNorm(torch::nn::LayerNormOptions({kIn})),
                                        ColumnParallelLinear(kIn, kHidden, mesh.tp(), o), torch::nn::Functional(gelu),
                                        RowParallelLinear(kHidden, kOut, mesh.tp(), o));
        }
        Engine engine(parallel::engine_comms(mesh), options(stage));
        TorchEngineOptions placed = units;
        // Under sequence parallelism the LayerNorm sees this rank's rows only: its gradients are partial.
        placed.placement = [&](const std::string& name, const torch::Tensor&) -> std::optional<TpPlacement> {
          if (sp && name.rfind("0.", 0) == 0) return TpPlacement::replicated_partial();
          return std::nullopt;
        };
        TorchEngine zt(engine, *model, placed);
        zt.finalize();
        for (int step = 0; step < kSteps; ++step) {
          auto [x, w] = batch(step);
          if (sp) x = slice(x, r, 1), w = slice(w, r, 1);
          zt.backward((zt.forward(model, x) * w).sum());
          zt.step();
        }
        const auto params = zt.full_parameters();  // this rank's parts
        REQUIRE(params.size() == 6);
        CHECK(close(params[0].second, ref[0]));               // 0.weight: LayerNorm gains, whole
        CHECK(close(params[1].second, ref[1]));               // 0.bias
        CHECK(close(params[2].second, slice(ref[2], r, 0)));  // 1.weight: rows
        CHECK(close(params[3].second, slice(ref[3], r, 0)));  // 1.bias
        CHECK(close(params[4].second, slice(ref[4], r, 1)));  // 3.weight: columns
        CHECK(close(params[5].second, ref[5]));               // 3.bias: whole
      });
    }
  }
}

TEST_CASE("a LayerNorm under sequence parallelism left replicated is refused at the first step, naming it") {
  testing::run_thread_ranks(kTp, [&](comm::Communicator& world) {
    comm::Mesh mesh(world, comm::MeshShape{.pp = 1, .dp = 1, .tp = kTp});
    const ParallelLinearOptions o{.sequence_parallel = true};
    torch::nn::Sequential model;
    {
      std::lock_guard<std::mutex> lock(generator_mutex());
      torch::manual_seed(21);
      model = torch::nn::Sequential(torch::nn::LayerNorm(torch::nn::LayerNormOptions({kIn})),
                                    ColumnParallelLinear(kIn, kHidden, mesh.tp(), o),
                                    RowParallelLinear(kHidden, kOut, mesh.tp(), o));
    }
    Engine engine(parallel::engine_comms(mesh), EngineOptions{});
    TorchEngine zt(engine, *model, {.units = {"0", "1", "2"}});  // no placement for the LayerNorm
    zt.finalize();
    const torch::Tensor x = torch::sin(torch::arange(kBatch * kSeq * kIn, torch::kFloat).reshape({kBatch, kSeq, kIn}));
    zt.backward(zt.forward(model, slice(x, mesh.coord().tp, 1)).square().sum());
    try {
      zt.step();
      FAIL("stepped with the LayerNorm's partial gradients");
    } catch (const InvalidArgument& e) {
      const std::string m = e.what();
      CHECK((m.find("parameter '0.weight'") == 0 || m.find("parameter '0.bias'") == 0));
      CHECK(m.find("is held whole on every rank of its tensor-parallel group, but its gradient differs across them at "
                   "the first step") != std::string::npos);
    }
  });
}

TEST_CASE("sizes tp does not divide, tokens outside the vocabulary and a contradicted placement are named") {
  testing::run_thread_ranks(kTp, [&](comm::Communicator& tp) {
    CHECK_THROWS_WITH_AS(ColumnParallelLinear(4, 7, tp), "ColumnParallelLinear: out_features = 7 must be a positive multiple of tp = 2",
                         InvalidArgument);
    CHECK_THROWS_WITH_AS(RowParallelLinear(5, 4, tp), "RowParallelLinear: in_features = 5 must be a positive multiple of tp = 2",
                         InvalidArgument);
    VocabParallelEmbedding embedding(10, 4, tp);
    CHECK_THROWS_WITH_AS(embedding(torch::tensor({3, 12, 1})), "VocabParallelEmbedding: token 12 at position 1 is outside [0, 10)",
                         InvalidArgument);
    torch::nn::Sequential model(ColumnParallelLinear(4, 8, tp), RowParallelLinear(8, 4, tp));
    comm::Mesh mesh(tp, comm::MeshShape{.pp = 1, .dp = 1, .tp = kTp});
    Engine engine(parallel::engine_comms(mesh), EngineOptions{});
    TorchEngineOptions o;
    o.placement = [](const std::string& name, const torch::Tensor&) -> std::optional<TpPlacement> {
      if (name == "1.weight") return TpPlacement::split(0);
      return std::nullopt;
    };
    CHECK_THROWS_WITH_AS(TorchEngine(engine, *model, o),
                         "TorchEngine: parameter '1.weight' belongs to a tensor-parallel module that places it split(1); "
                         "TorchEngineOptions.placement says split(0)",
                         InvalidArgument);
  });
}

}  // namespace zero::libtorch
