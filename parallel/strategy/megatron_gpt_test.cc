// Megatron's GPT holds Korthikanti et al.'s activations: 34 h + 5 a s bytes per token and layer in
// 16 bits, 10 h + (24 h + 5 a s) / t under tp, all of it / t with sequence parallelism; full
// recompute keeps each layer's 2 h input.
#include "parallel/strategy/megatron_gpt.h"

#include <doctest/doctest.h>

#include "parallel/strategy/test_cluster.h"

namespace zero::strategy {
namespace {

TEST_CASE("a Megatron GPT stage holds the paper's activations at tp 1, under tp, with sp and recompute") {
  const Gpt2Shape shape{.vocab_size = 512, .block_size = 128, .n_embd = 64, .n_head = 4, .n_layer = 4};
  const DescribedModel gpt(describe_megatron_gpt(shape), DType::kBFloat16);
  const double h = 64, a = 4, s = 128, V = 512, L = 4;
  const double tokens = 2 * s;  // a micro-batch of 2 sequences: batch 4 over 2 micro-batches
  struct Case {
    int tp;
    bool sp, recompute;
    double per_token;  // embedding, blocks, head
  };
  const Case cases[] = {
      {1, false, false, h + L * (34 * h + 5 * a * s) + 4 * h + 4 * V},
      {2, false, false, h + L * (10 * h + (24 * h + 5 * a * s) / 2) + 4 * h + 4 * V / 2},
      {2, true, false, h / 2 + L * (34 * h + 5 * a * s) / 2 + 2 * h / 2 + 2 * h + 4 * V / 2},
  };
  for (const Case& c : cases) {
    CAPTURE(c.tp);
    CAPTURE(c.sp);
    const Layout l{.dp = 1, .tp = c.tp, .pp = 1, .stage = 0, .micro_batches = 2, .sequence_parallel = c.sp};
    const StageCosts costs = gpt.stage(l, 0, 4, test_cluster());
    CHECK(static_cast<double>(costs.activation_bytes) == doctest::Approx(tokens * c.per_token));
  }
  // Full recompute: each layer keeps its 2 h input (the embedding and head as without).
  const Layout r{.dp = 1, .tp = 1, .pp = 1, .stage = 0, .micro_batches = 2, .recompute = true};
  const StageCosts kept = gpt.stage(r, 0, 4, test_cluster());
  CHECK(static_cast<double>(kept.activation_bytes) < tokens * (h + L * 2 * h + 4 * h + 4 * V) * 1.01);
  // The FLOPs are the paper's: 24 h^2 + 4 s h forward per token and layer, twice that backward.
  const Layout one{.dp = 1, .tp = 1, .pp = 1, .stage = 0, .micro_batches = 2};
  Cluster c = test_cluster();
  c.matmul_efficiency = 1;
  const StageCosts f = gpt.stage(one, 0, 4, c);
  const double forward = tokens * (L * (24 * h * h + 4 * s * h) + 2 * h * V);
  CHECK(f.forward * c.peak_flops == doctest::Approx(forward));
  CHECK((f.backward_input + f.backward_weight) * c.peak_flops == doctest::Approx(2 * forward));
}

}  // namespace
}  // namespace zero::strategy
