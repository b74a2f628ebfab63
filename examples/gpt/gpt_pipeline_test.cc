// The GPT through GptPipeline, ranks as threads (Gloo): the stage split and its errors, and the global
// gradient norm of one step over (dp, tp, pp) meshes equal to one rank's with the whole model to 1e-6
// relative, including a first stage that holds only the embedding and a last that holds only the
// head (wte counted once, the stages without blocks neither hanging nor skewing the sum).
#include "examples/gpt/gpt_pipeline.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <string>
#include <vector>

#include "base/error.h"
#include "comm/mesh.h"
#include "parallel/engine_comms.h"
#include "parallel/pipeline/schedules.h"
#include "testing/thread_ranks.h"
#include "zero/engine.h"

namespace zero::examples {
namespace {

const GptConfig kConfig{.vocab_size = 61, .block_size = 8, .n_embd = 16, .n_head = 4, .n_layer = 4};
constexpr int kMicroBatches = 4, kB = 2, kT = 8;

// The micro-batches of data-parallel rank `dp` of `dp_size`; all of them together are the same
// global batch at every layout.
std::vector<MicroBatch> micro_batches(int dp, int dp_size) {
  std::vector<MicroBatch> out;
  const int per_rank = kMicroBatches / dp_size;
  for (int q = dp * per_rank; q < (dp + 1) * per_rank; ++q) {
    MicroBatch m{{}, {}, kB, kT};
    for (int i = 0; i < kB * kT; ++i) {
      m.inputs.push_back((i * 17 + 5 * q + 3) % kConfig.vocab_size);
      m.targets.push_back((i * 29 + 7 * q + 11) % kConfig.vocab_size);
    }
    out.push_back(std::move(m));
  }
  return out;
}

EngineOptions options(int stage, int micro_batches) {
  EngineOptions o = strategy::gpt2_engine_options(1e-3f);
  o.stage = stage;
  o.micro_batches = micro_batches;
  o.layout = {.alignment = 4, .bucket_numel = 256, .block = 16};
  return o;
}

// The first step's gradient norm at (pp, dp, tp) with `layers` per stage.
double norm_at(int pp, int dp, int tp, int stage, const std::vector<int>& layers) {
  double norm = -1;
  std::mutex mu;
  testing::run_thread_ranks(pp * dp * tp, [&](comm::Communicator& world) {
    comm::Mesh mesh(world, comm::MeshShape{.pp = pp, .dp = dp, .tp = tp});
    const Gpt whole(kConfig, 3);
    const int m = kMicroBatches / dp;
    Engine engine(parallel::engine_comms(mesh), options(stage, m));
    GptPipeline pipe(whole, {tp > 1 ? &mesh.tp() : nullptr, false}, mesh, parallel::one_f_one_b(pp, m), layers,
                     engine);
    pipe.finalize();
    pipe.train_step(micro_batches(mesh.coord().dp, dp), engine.loss_scale());
    const double n = engine.step().grad_norm;
    std::lock_guard<std::mutex> lock(mu);
    if (norm < 0) norm = n;
    CHECK(n == norm);  // every rank the same
  });
  return norm;
}

TEST_CASE("stages split the layers evenly or as --pp-layers says, and bad lists are named") {
  const std::vector<GptStage> even = gpt_stages(5, 2);
  REQUIRE(even.size() == 2);
  CHECK(even[0].first_layer == 0);
  CHECK(even[0].end_layer == 3);
  CHECK(even[0].first);
  CHECK(!even[0].last);
  CHECK(even[1].end_layer == 5);
  CHECK(even[1].last);
  const std::vector<GptStage> given = gpt_stages(4, 3, parse_layer_counts("0,4,0"));
  CHECK(given[0].end_layer == 0);
  CHECK(given[1].end_layer == 4);
  CHECK(given[2].first_layer == 4);
  CHECK_THROWS_WITH_AS(gpt_stages(4, 2, {1, 2}), doctest::Contains("--pp-layers sums to 3 layers but the model has n_layer 4"),
                       InvalidArgument);
  CHECK_THROWS_WITH_AS(gpt_stages(4, 3, {2, 2}), doctest::Contains("--pp-layers lists 2 stages but the pipeline has 3"),
                       InvalidArgument);
  CHECK_THROWS_WITH_AS(gpt_stages(4, 2, {5, -1}), doctest::Contains("a negative layer count -1"), InvalidArgument);
  CHECK_THROWS_WITH_AS(parse_layer_counts("2,,2"), doctest::Contains("'' is not a layer count"), InvalidArgument);
  // A middle stage with no block holds nothing: refused by the model.
  const Gpt whole(kConfig, 3);
  CHECK_THROWS_WITH_AS(Gpt(whole, {}, GptStage{2, 2, false, false}), doctest::Contains("it would hold nothing"),
                       InvalidArgument);
}

TEST_CASE("the global norm over (dp, tp, pp) equals one rank's, with stages holding only the embedding or the head") {
  for (int stage : {1, 3}) {
    CAPTURE(stage);
    const double want = norm_at(1, 1, 1, stage, {});
    REQUIRE(want > 0);
    struct Layout {
      int pp, dp, tp;
      std::vector<int> layers;
    };
    for (const Layout& l : {Layout{2, 1, 1, {}}, Layout{2, 1, 1, {0, 4}}, Layout{2, 2, 1, {4, 0}},
                            Layout{2, 1, 2, {0, 4}}, Layout{4, 1, 1, {0, 2, 2, 0}}, Layout{2, 2, 2, {}}}) {
      CAPTURE(l.pp);
      CAPTURE(l.dp);
      CAPTURE(l.tp);
      CAPTURE(l.layers.size());
      const double got = norm_at(l.pp, l.dp, l.tp, stage, l.layers);
      CHECK(std::abs(got - want) <= 1e-6 * want);
    }
  }
}

// A V holds the embedding and the tied head on one rank: the head's gradient joins wte's as the
// embedding's last weight part of the step closes, so a schedule that runs that part before the
// head's last is refused, naming the parameter, where it would otherwise train silently wrong.
TEST_CASE("a V schedule with the embedding's last weight part before the head's is refused naming wte") {
  parallel::Schedule s = parallel::zb_v(1, 1);  // one rank: F0 F1 B1 W1 B0 W0
  std::vector<parallel::Action>& order = s.actions[0];
  const auto w1 = std::find(order.begin(), order.end(), parallel::Action{parallel::Op::kW, 0, 1});
  REQUIRE(w1 != order.end());
  order.erase(w1);
  order.push_back({parallel::Op::kW, 0, 1});  // F0 F1 B1 B0 W0 W1: still a valid order
  std::string error;
  testing::run_thread_ranks(1, [&](comm::Communicator& world) {
    comm::Mesh mesh(world, comm::MeshShape{.pp = 1, .dp = 1, .tp = 1});
    const Gpt whole(kConfig, 3);
    Engine engine(parallel::engine_comms(mesh), options(1, 1));
    GptPipeline pipe(whole, {}, mesh, s, {}, engine);
    pipe.finalize();
    try {
      pipe.train_step(micro_batches(0, kMicroBatches), engine.loss_scale());  // one micro-batch
    } catch (const Error& e) {
      error = e.what();
    }
  });
  CHECK(error.find("tied parameter 'wte.weight'") != std::string::npos);
  CHECK(error.find("after 0 of the 1 weight parts of the chunk that borrows it") != std::string::npos);
}

}  // namespace
}  // namespace zero::examples
