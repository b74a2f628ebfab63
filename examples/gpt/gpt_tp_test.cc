// The GPT split over tensor-parallel ranks (threads over Gloo) computes what the whole model
// computes: the loss and every gradient (the parts compared with the same parts of the whole
// model's, partial ones summed over tp) at tp 2 and 4, with and without sequence parallelism, on a
// vocabulary tp does not divide (61: its padding rows get exactly zero gradient); and the named
// errors for heads or a sequence that tp does not divide. And three AdamW steps through the engine
// at tp 2 (stages 2 and 3, with and without sequence parallelism) against the whole model at tp 1:
// every parameter part within 2e-5, the padding rows exactly zero.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "base/error.h"
#include "comm/mesh.h"
#include "examples/gpt/gpt_engine.h"
#include "examples/gpt/gpt_model.h"
#include "parallel/engine_comms.h"
#include "testing/thread_ranks.h"
#include "zero/tp_placement.h"

namespace zero::examples {
namespace {

const GptConfig kConfig{.vocab_size = 61, .block_size = 8, .n_embd = 16, .n_head = 4, .n_layer = 2};

struct Batch {
  std::vector<int> tokens, targets;
  int B = 3, T = 8;
};

Batch batch() {
  Batch b;
  for (int i = 0; i < b.B * b.T; ++i) {
    b.tokens.push_back((i * 17 + 3) % kConfig.vocab_size);
    b.targets.push_back((i * 29 + 11) % kConfig.vocab_size);
  }
  return b;
}

struct Result {
  float loss = 0;
  std::vector<std::vector<float>> grads;
};

Result run(Gpt& model) {
  const Batch b = batch();
  Result r;
  for (const auto& p : model.params()) r.grads.emplace_back(p.values.size(), 0.0f);
  Gpt::Access access;
  access.grad = [&](size_t i) { return r.grads[i].data(); };
  r.loss = model.forward(b.tokens, b.targets, b.B, b.T, access);
  model.backward(1.0f, access);
  return r;
}

TEST_CASE("the GPT split over tp computes the whole model's loss and gradients") {
  Gpt full(kConfig, 7);
  const Result want = run(full);
  for (int tp : {2, 4}) {
    for (bool sp : {false, true}) {
      CAPTURE(tp);
      CAPTURE(sp);
      testing::run_thread_ranks(tp, [&](comm::Communicator& comm) {
        Gpt part(full, GptParallel{&comm, sp});
        CHECK(part.vocab_range().padded == (tp == 2 ? 62 : 64));
        Result got = run(part);
        CHECK(std::abs(got.loss - want.loss) <= 1e-6 * std::abs(want.loss));
        for (size_t i = 0; i < got.grads.size(); ++i) {
          const Gpt::Param& p = part.params()[i];
          CAPTURE(p.name);
          if (p.tp.partial_grad) {
            comm.all_reduce(got.grads[i].data(), got.grads[i].size(), DType::kFloat32, comm::ReduceOp::kSum)->wait();
          }
          std::vector<int64_t> shape = full.params()[i].shape;
          std::vector<float> whole = want.grads[i];
          if (p.name == "wte.weight") {
            shape[0] = part.vocab_range().padded;
            whole.resize(static_cast<size_t>(shape[0] * 16), 0.0f);
          }
          std::vector<float> expect(got.grads[i].size());
          shard(whole.data(), shape, p.tp, comm.rank(), tp, expect.data());
          double worst = 0, largest = 0;
          for (const float w : want.grads[i]) largest = std::max(largest, std::fabs(static_cast<double>(w)));
          for (size_t e = 0; e < expect.size(); ++e) {
            worst = std::max(worst, std::fabs(static_cast<double>(expect[e]) - got.grads[i][e]));
          }
          CHECK(worst <= 1e-5 * largest);
          if (p.name == "wte.weight") {  // padding rows: exactly zero
            bool zero = true;
            for (size_t e = static_cast<size_t>(part.vocab_range().real_rows()) * 16; e < got.grads[i].size(); ++e) {
              zero &= got.grads[i][e] == 0.0f;
            }
            CHECK(zero);
          }
        }
      });
    }
  }
}

// Three AdamW steps through the engine; the parameters this rank holds afterwards.
std::vector<std::vector<float>> train(Gpt& model, const EngineComms& comms, int stage) {
  EngineOptions o = strategy::gpt2_engine_options(1e-2f);
  o.stage = stage;
  o.layout = {.alignment = 4, .bucket_numel = 2048, .block = 16};
  o.timeout = std::chrono::seconds(30);
  Engine engine(comms, o);
  GptScopes scopes(engine, model);
  engine.finalize();
  const Gpt::Access access = scopes.access();
  const Batch b = batch();
  for (int step = 0; step < 3; ++step) {
    model.forward(b.tokens, b.targets, b.B, b.T, access);
    model.backward(1.0f, access);
    engine.finish_backward();
    engine.step();
  }
  std::vector<std::vector<float>> out;
  for (int u = 0; u < model.num_units(); ++u) {
    UnitScope scope = engine.gather(u);
    for (size_t i = 0; i < model.params().size(); ++i) {
      if (model.params()[i].unit != u) continue;
      if (out.size() <= i) out.resize(model.params().size());
      const float* p = scope.param_as<float>(scopes.ids()[i]);
      out[i].assign(p, p + model.params()[i].values.size());
    }
  }
  return out;
}

TEST_CASE("a vocabulary tp does not divide trains through the engine as the whole model does") {
  const Gpt full(kConfig, 7);
  for (int stage : {2, 3}) {
    std::vector<std::vector<float>> want;
    testing::run_thread_ranks(1, [&](comm::Communicator& comm) {
      Gpt whole = full;
      want = train(whole, EngineComms{.shard = &comm, .finalizers = parallel::model_parallel_finalizers(comm, nullptr)},
                   stage);  // tp 1: the same lone rank
    });
    for (bool sp : {false, true}) {
      CAPTURE(stage);
      CAPTURE(sp);
      testing::run_thread_ranks(2, [&](comm::Communicator& comm) {
        comm::Mesh mesh(comm, comm::MeshShape{.pp = 1, .dp = 1, .tp = 2});
        Gpt part(full, GptParallel{&mesh.tp(), sp});
        const auto got = train(part, parallel::engine_comms(mesh), stage);
        double worst = 0;
        for (size_t i = 0; i < got.size(); ++i) {
          const Gpt::Param& p = part.params()[i];
          std::vector<int64_t> shape = full.params()[i].shape;
          std::vector<float> whole = want[i];
          if (p.name == "wte.weight") {
            shape[0] = part.vocab_range().padded;
            whole.resize(static_cast<size_t>(shape[0] * 16), 0.0f);
          }
          std::vector<float> expect(got[i].size());
          shard(whole.data(), shape, p.tp, mesh.tp().rank(), 2, expect.data());
          for (size_t e = 0; e < expect.size(); ++e) worst = std::max(worst, std::fabs(static_cast<double>(expect[e]) - got[i][e]));
          if (p.name == "wte.weight") {
            bool zero = true;
            for (size_t e = static_cast<size_t>(part.vocab_range().real_rows()) * 16; e < got[i].size(); ++e) {
              zero &= got[i][e] == 0.0f;
            }
            CHECK(zero);  // the padding rows stay zero through the optimizer
          }
        }
        CHECK(worst <= 2e-5);
      });
    }
  }
}

TEST_CASE("heads or a sequence that tp does not divide are named") {
  Gpt full(kConfig, 7);
  testing::run_thread_ranks(3, [&](comm::Communicator& comm) {
    CHECK_THROWS_WITH_AS(Gpt(full, GptParallel{&comm, false}),
                         doctest::Contains("n_head 4 does not divide by tp 3"), InvalidArgument);
  });
  testing::run_thread_ranks(2, [&](comm::Communicator& comm) {
    Gpt part(full, GptParallel{&comm, true});
    const std::vector<int> tokens(7, 1);
    Gpt::Access access;
    CHECK_THROWS_WITH_AS(part.forward(tokens, tokens, 1, 7, access),
                         doctest::Contains("the sequence length 7 does not divide by tp 2"), InvalidArgument);
  });
}

}  // namespace
}  // namespace zero::examples
