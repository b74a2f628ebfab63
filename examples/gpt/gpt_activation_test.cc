// Gpt::micro_batch_bytes against activation_bytes(), byte for byte, at every point of a micro-batch's
// life (two micro-batches in flight: forwards, a split backward's input part, which keeps only what
// its weight part reads, its weight part, a whole backward): the whole model, the stages of 3-way and 2-way pipelines (one holding only the
// embedding, one only the head), at tp 1 and tp 2 with and without sequence parallelism (tp ranks as
// threads over Gloo), at two micro-batch shapes, with and without activation recompute; the peak as
// the replay predicts it. Recompute gives the same losses and gradients, bit for bit.
#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "base/error.h"
#include "comm/mesh.h"
#include "examples/gpt/gpt_model.h"
#include "examples/gpt/gpt_pipeline.h"
#include "testing/thread_ranks.h"

namespace zero::examples {
namespace {

// A vocabulary tp 2 does not divide (61: padded to 62).
const GptConfig kConfig{.vocab_size = 61, .block_size = 8, .n_embd = 16, .n_head = 4, .n_layer = 4};

struct Shape {
  int B, T;
};

// What the passes computed: every loss and every stage's parameter gradients.
struct Computed {
  std::vector<float> losses;
  std::vector<std::vector<std::vector<float>>> grads;
};

// Two micro-batches through `stages` (in model order, one tp rank's parts), each stage checked
// against the formula after every pass.
Computed check_stages(const Gpt& whole, const std::vector<GptStage>& stages, const GptParallel& parallel, Shape shape,
                      bool recompute) {
  const int B = shape.B, T = shape.T, BT = B * T;
  const int tp = parallel.tp ? parallel.tp->size() : 1;
  std::vector<Gpt> models;
  std::vector<Gpt::MicroBatchBytes> want;
  std::vector<std::vector<std::vector<float>>> grads;
  std::vector<Gpt::Access> access(stages.size());
  for (const GptStage& s : stages) {
    models.emplace_back(whole, parallel, s);
    models.back().set_recompute(recompute);
    want.push_back(Gpt::micro_batch_bytes(kConfig, s, tp, parallel.sequence_parallel, B, T, recompute));
  }
  for (size_t s = 0; s < models.size(); ++s) {
    grads.emplace_back();
    for (const Gpt::Param& p : models[s].params()) grads[s].emplace_back(p.values.size(), 0.0f);
    access[s].grad = [&grads, s](size_t i) { return grads[s][i].data(); };
    models[s].reset_peak_activation_bytes();
  }
  auto tokens = [&](int mb, int salt) {
    std::vector<int> out;
    for (int i = 0; i < BT; ++i) out.push_back((i * 17 + 5 * mb + salt) % kConfig.vocab_size);
    return out;
  };
  auto check = [&](size_t s, size_t expected, const std::string& when) {
    CAPTURE(tp);
    CAPTURE(parallel.sequence_parallel);
    CAPTURE(B);
    CAPTURE(T);
    CAPTURE(stages.size());
    CAPTURE(stages.front().end_layer);
    CAPTURE(s);
    CAPTURE(recompute);
    CAPTURE(when);
    CHECK(models[s].activation_bytes() == expected);
  };
  Computed out;
  auto forward = [&](int mb) {
    std::vector<float> x, next;
    for (size_t s = 0; s < models.size(); ++s) {
      const float loss = models[s].forward_micro_batch(mb, tokens(mb, 3), tokens(mb, 11), B, T,
                                                       x.empty() ? nullptr : x.data(), &next, access[s]);
      x.swap(next);
      if (s + 1 == models.size()) out.losses.push_back(loss);
    }
  };
  auto backward = [&](int mb, bool with_weight, const std::vector<size_t>& expected) {
    std::vector<float> dy, next;
    for (size_t s = models.size(); s-- > 0;) {
      models[s].backward_micro_batch(mb, 1.0f, dy.empty() ? nullptr : dy.data(), &next, with_weight, access[s]);
      dy.swap(next);
      check(s, expected[s], with_weight ? "whole backward" : "input part");
    }
  };
  std::vector<size_t> one, two, split, rebuilt, input_part, none(models.size(), 0);
  for (size_t s = 0; s < want.size(); ++s) {
    const Gpt::MicroBatchBytes& w = want[s];
    one.push_back(w.forward);
    two.push_back(2 * w.forward);
    split.push_back(w.forward + w.weight);            // micro-batch 1's forward, 0's input part
    rebuilt.push_back(w.forward + w.rebuilt);         // 1's whole backward, running a rebuilt block
    input_part.push_back(2 * w.forward + w.input_peak);  // 0's input part rebuilding, 1 forwarded
    CHECK((w.rebuilt > 0) == (recompute && stages[s].end_layer > stages[s].first_layer));
    CHECK((w.input_peak > 0) == (recompute && stages[s].end_layer > stages[s].first_layer));
  }

  forward(0);
  for (size_t s = 0; s < models.size(); ++s) check(s, one[s], "forward of 0");
  forward(1);
  for (size_t s = 0; s < models.size(); ++s) check(s, two[s], "forward of 1");
  backward(0, false, split);
  for (size_t s = 0; s < models.size(); ++s) {
    CHECK(want[s].weight > 0);  // every stage has weight work (wpe, a block, or the head)
    models[s].weight_micro_batch(0, access[s]);
    check(s, one[s], "weight part of 0");  // micro-batch 0 holds nothing
  }
  backward(1, true, none);  // nothing is held after a whole backward
  for (size_t s = 0; s < models.size(); ++s) {
    CAPTURE(s);
    CHECK(models[s].peak_activation_bytes() == std::max({two[s], split[s], rebuilt[s], input_part[s]}));
    models[s].reset_peak_activation_bytes();
  }
  // One micro-batch alone, a whole backward: its peak is the rebuilt block's on top of its forward.
  forward(2);
  backward(2, true, none);
  for (size_t s = 0; s < models.size(); ++s) {
    CAPTURE(s);
    CHECK(models[s].peak_activation_bytes() == rebuilt[s]);
  }
  for (const auto& g : grads) out.grads.push_back(g);
  return out;
}

// Every stage list of `stage_lists` at each shape, at tp (ranks as threads) with sequence
// parallelism `sp`.
void check_layouts(int tp, bool sp, const std::vector<std::vector<GptStage>>& stage_lists) {
  const Gpt whole(kConfig, 5);
  for (const Shape shape : {Shape{2, 8}, Shape{3, 4}}) {
    for (const std::vector<GptStage>& stages : stage_lists) {
      testing::run_thread_ranks(tp, [&](comm::Communicator& world) {
        comm::Mesh mesh(world, comm::MeshShape{.pp = 1, .dp = 1, .tp = tp});
        const GptParallel parallel{tp > 1 ? &mesh.tp() : nullptr, sp};
        const Computed kept = check_stages(whole, stages, parallel, shape, false);
        const Computed recomputed = check_stages(whole, stages, parallel, shape, true);
        CHECK(kept.losses == recomputed.losses);  // bit for bit
        CHECK(kept.grads == recomputed.grads);
      });
    }
  }
}

const std::vector<std::vector<GptStage>> kLayouts{
    {GptStage{0, kConfig.n_layer, true, true}},                // the whole model
    gpt_stages(kConfig.n_layer, 3),                            // first, middle, last: 2, 1, 1 blocks
    gpt_stages(kConfig.n_layer, 2, parse_layer_counts("0,4")),  // the embedding only, then every block
    gpt_stages(kConfig.n_layer, 2, parse_layer_counts("4,0")),  // every block, then the head only
};

TEST_CASE("micro_batch_bytes equals activation_bytes after every pass at tp 1") { check_layouts(1, false, kLayouts); }

TEST_CASE("micro_batch_bytes equals activation_bytes after every pass at tp 2, with and without sequence parallelism") {
  check_layouts(2, false, kLayouts);
  check_layouts(2, true, kLayouts);
}

TEST_CASE("at the pipeline bench's shape a deferred weight part keeps less than a forward, on every stage") {
  // n_embd 128, 4 heads, T 64, micro-batches of 2 (examples/bench/pipeline_bench.cc), 4 layers in 2
  // and in 4 stages: the probabilities, q|k|v, the MLP's product and the normalized inputs go.
  const GptConfig bench{.vocab_size = 65, .block_size = 64, .n_embd = 128, .n_head = 4, .n_layer = 4};
  for (int stages : {2, 4}) {
    for (const GptStage& s : gpt_stages(bench.n_layer, stages)) {
      const Gpt::MicroBatchBytes w = Gpt::micro_batch_bytes(bench, s, 1, false, 2, 64);
      CAPTURE(stages);
      CAPTURE(s.first_layer);
      CHECK(w.weight < w.forward);
      CHECK(w.weight > w.forward / 2);
    }
  }
}

TEST_CASE("an embedding-only stage holds nothing until its input part; the formula's errors are the model's") {
  const GptStage embedding{0, 0, true, false};
  const Gpt::MicroBatchBytes e = Gpt::micro_batch_bytes(kConfig, embedding, 1, false, 2, 8);
  CHECK(e.forward == 0);
  CHECK(e.weight == 2 * 8 * 16 * sizeof(float));  // wpe's output gradient
  CHECK_THROWS_WITH_AS(Gpt::micro_batch_bytes(kConfig, embedding, 3, false, 2, 8),
                       doctest::Contains("n_head 4 does not divide by tp 3"), InvalidArgument);
  CHECK_THROWS_WITH_AS(Gpt::micro_batch_bytes(kConfig, embedding, 2, true, 1, 7),
                       doctest::Contains("the sequence length 7 does not divide by tp 2"), InvalidArgument);
  CHECK_THROWS_WITH_AS(Gpt::micro_batch_bytes(kConfig, embedding, 1, true, 1, 8),
                       doctest::Contains("sequence parallelism needs tensor parallelism"), InvalidArgument);
}

}  // namespace
}  // namespace zero::examples
