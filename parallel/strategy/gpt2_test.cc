#include "parallel/strategy/gpt2.h"

#include <doctest/doctest.h>

#include <string>

#include "base/error.h"
#include "parallel/strategy/kernel_times.h"
#include "parallel/strategy/predict.h"
#include "parallel/strategy/test_cluster.h"

namespace zero::strategy {
namespace {

const Gpt2Shape kShape{.vocab_size = 256, .block_size = 64, .n_embd = 64, .n_head = 4, .n_layer = 4};

Cluster cluster() { return test_cluster(); }

Kernel kernel(KernelLayer layer, KernelPass pass, int batch, int tp) {
  return {"gpt/4,64,4,256,64", layer, pass, batch, tp, false};
}

TEST_CASE("the GPT's five numbers, read and written") {
  const Gpt2Shape s = parse_gpt2_shape("4,64,4,256,64");
  CHECK(gpt2_shape_text(s) == "4,64,4,256,64");
  CHECK(gpt2_shape_text(parse_gpt2_shape("2,32,2")) == "2,32,2,256,64");
  CHECK_THROWS_WITH_AS(parse_gpt2_shape("4,64"), doctest::Contains("--gpt '4,64': expected n_layer,n_embd,n_head"),
                       InvalidArgument);
  CHECK_THROWS_WITH_AS(parse_gpt2_shape("4,x,4"), doctest::Contains("'x' is not a positive integer"), InvalidArgument);
  CHECK_THROWS_WITH_AS(parse_gpt2_shape("4,64,5", "--model-shape"),
                       doctest::Contains("--model-shape '4,64,5': n_head 5 does not divide n_embd 64"), InvalidArgument);
}

// examples/models/gpt_4layer.json is this description written out, so a user who edits a copy of
// it starts from what the planner itself uses for the GPT.
TEST_CASE("the GPT's description is examples/models/gpt_4layer.json") {
  const ModelDescription file = load_model_description("examples/models/gpt_4layer.json");
  const ModelDescription made = describe_gpt2(kShape);
  CHECK(to_json(made) == to_json(file));
  CHECK(to_json(parse_model_description(to_json(made), "written")) == to_json(made));
  CHECK(made.kernels == "gpt/4,64,4,256,64");
}

TEST_CASE("fp32 norms: the LayerNorms and biases kept in fp32 beside bf16 matrices, at every stage") {
  const DescribedModel gpt(describe_gpt2(kShape, true), DType::kBFloat16);
  const plan::ModelSpec m = gpt.stage_model({.first_block = 0, .end_block = 4});
  int fp32 = 0;
  for (const plan::TensorSpec& t : m.tensors) {
    const bool norm_or_bias = t.group == 1;
    CAPTURE(t.name);
    CHECK(m.dtype_of(t) == (norm_or_bias ? DType::kFloat32 : DType::kBFloat16));
    CHECK(t.param_dtype == (norm_or_bias ? std::optional(DType::kFloat32) : std::nullopt));
    fp32 += norm_or_bias;
  }
  CHECK(fp32 == 8 * 4 + 2);
}

TEST_CASE("what the GPT cannot run is named") {
  const DescribedModel gpt(describe_gpt2(kShape), DType::kFloat32);
  CHECK(gpt.unsupported({.tp = 8}, 16) == "tp 8 does not divide the 4 heads");
  CHECK(gpt.unsupported({.pp = 8}, 16) == "pp 8 is more stages than the 4 blocks");
  CHECK(gpt.unsupported({.dp = 2, .micro_batches = 3}, 16) == "the batch 16 does not divide into dp 2 x 3 micro-batches");
  CHECK(gpt.unsupported({.dp = 2, .tp = 2, .pp = 2, .micro_batches = 4}, 16).empty());
  // Interleaving groups its forwards by p micro-batches; the V takes any count.
  CHECK(gpt.unsupported({.pp = 2, .micro_batches = 6, .schedule = "interleaved", .chunks = 2}, 12).empty());
  CHECK(gpt.unsupported({.pp = 2, .micro_batches = 3, .schedule = "interleaved", .chunks = 2}, 12) ==
        "interleaved: 3 micro-batches are not a multiple of pp 2");
  CHECK(gpt.unsupported({.pp = 2, .micro_batches = 3, .schedule = "zb-v", .chunks = 2}, 12).empty());
  CHECK(gpt.unsupported({.pp = 4, .micro_batches = 4, .schedule = "zb-v", .chunks = 2}, 16) ==
        "pp 4 x 2 chunks is more stages than the 4 blocks");
}

TEST_CASE("a GPT stage's tp collectives are Megatron's f and g, its sends the residual stream") {
  const DescribedModel gpt(describe_gpt2(kShape), DType::kFloat32);
  const Layout l{.dp = 1, .tp = 2, .pp = 2, .micro_batches = 4};
  const StageCosts first = gpt.stage(l, 0, 16, cluster()), last = gpt.stage(l, 1, 16, cluster());
  // Two blocks: an all-reduce leaving attention and the MLP forward, one entering each backward;
  // the embedding leaves a region forward.
  CHECK(first.tp_forward.size() == 2 * 2 + 1);
  CHECK(first.tp_backward.size() == 2 * 2);
  CHECK(first.tp_forward[0].kind == TpCollective::kAllReduce);
  CHECK(first.tp_forward[0].bytes == 4.0 * 4 * 64 * 64);
  CHECK(first.send_bytes == 4.0 * 4 * 64 * 64);
  CHECK(last.send_bytes == 0);
  // The last stage's head: three sums for the loss forward, the head's input gradient backward.
  CHECK(last.tp_forward.size() == 2 * 2 + 3);
  CHECK(last.units == 6);
  // Without calibrated kernels: the matrix FLOPs at the cluster's rate (4 sequences of 64 tokens on
  // one of 2 tp ranks: the four matrices' 24 C^2 and attention's 4 T C per token, two blocks).
  CHECK(first.forward == doctest::Approx(2 * 4 * 64 * (24.0 * 64 * 64 + 4.0 * 64 * 64) / 2 / 1e10));
  // With sequence parallelism the regions all-gather and reduce-scatter, and a stage sends its rows.
  const StageCosts sp = gpt.stage({.tp = 2, .pp = 2, .micro_batches = 4, .sequence_parallel = true}, 0, 16, cluster());
  // Each block enters two regions (all-gathers) and leaves two (reduce-scatters), and the embedding leaves one.
  int gathers = 0, scatters = 0;
  for (const TpCollective& c : sp.tp_forward) {
    gathers += c.kind == TpCollective::kAllGather;
    scatters += c.kind == TpCollective::kReduceScatter;
  }
  CHECK(gathers == 2 * 2);
  CHECK(scatters == 2 * 2 + 1);
  CHECK(sp.send_bytes == first.send_bytes / 2);
}

TEST_CASE("the engine's own tp collectives are in the step: sequence parallelism's partial gradients") {
  const DescribedModel gpt(describe_gpt2(kShape), DType::kFloat32);
  PlanSettings settings;
  settings.engine = gpt2_engine_options(1e-3f);
  settings.global_batch = 16;
  const Prediction plain = predict(gpt, {.tp = 2, .stage = 1, .micro_batches = 2}, cluster(), settings);
  const Prediction sp = predict(gpt, {.tp = 2, .stage = 1, .micro_batches = 2, .sequence_parallel = true}, cluster(),
                                settings);
  // Without sp only the norm's sum crosses the tp group; with it the partial gradients of the
  // parameters it replicates (wpe, the LayerNorms', the row-parallel biases') are summed over it
  // too, in one packed all-reduce: one call's two messages and its bytes (fp32, each once on the
  // wire at tp 2), not a call per tensor.
  CHECK(plain.time.engine_tp > 0);
  const double partial_bytes = 4.0 * (kShape.block_size + 6 * kShape.n_layer + 2) * kShape.n_embd;
  const Link link = cluster().intra;
  CHECK(sp.time.engine_tp - plain.time.engine_tp ==
        doctest::Approx(2 * link.latency + partial_bytes / link.bandwidth).epsilon(1e-9));
  CHECK(sp.time.dp_comm == sp.time.engine_tp);  // dp 1: nothing else
  CHECK(sp.time.dp_exposed == doctest::Approx(sp.time.engine_tp / 6).epsilon(1e-9));  // one unit's share at least
}

TEST_CASE("calibrated kernels take the place of the FLOP estimate") {
  const DescribedModel gpt(describe_gpt2(kShape), DType::kFloat32);
  Cluster c = cluster();
  c.kernels[kernel_key(kernel(KernelLayer::kBlock, KernelPass::kForward, 16, 1))] = 0.5;
  c.kernels[kernel_key(kernel(KernelLayer::kHead, KernelPass::kForward, 16, 1))] = 0.25;
  CHECK(kernel_key(kernel(KernelLayer::kBlock, KernelPass::kForward, 16, 1)) == "gpt/4,64,4,256,64/block/b16/tp1/sp0/f");
  const StageCosts s = gpt.stage({}, 0, 16, c);
  CHECK(s.forward == doctest::Approx(4 * 0.5 + 0.25));  // the embedding's lookups cost no FLOPs
  // Timed alone too: one rank on a machine whose ranks share the cores uses those; more ranks, or
  // ranks with their own devices, do not.
  c.kernels[alone_key(kernel(KernelLayer::kBlock, KernelPass::kForward, 16, 1))] = 0.375;
  CHECK(alone_key(kernel(KernelLayer::kBlock, KernelPass::kForward, 16, 2)) == "gpt/4,64,4,256,64/block/b16/tp1/sp0/f+alone");
  CHECK(gpt.stage({}, 0, 16, c).forward == doctest::Approx(4 * 0.5 + 0.25));
  c.shared_cores = true;
  CHECK(gpt.stage({}, 0, 16, c).forward == doctest::Approx(4 * 0.375 + 0.25));
  CHECK(gpt.stage({.pp = 2}, 0, 16, c).forward == doctest::Approx(2 * 0.5));  // two ranks: two blocks each
  // A description without a "kernels" prefix reads none of them.
  ModelDescription plain = describe_gpt2(kShape);
  plain.kernels.clear();
  CHECK(DescribedModel(plain, DType::kFloat32).stage({}, 0, 16, c).forward == doctest::Approx(gpt.stage({}, 0, 16, cluster()).forward));
}

TEST_CASE("more ranks than a shared-core machine's cores: the tp parts timed at that crowding, per core") {
  const DescribedModel gpt(describe_gpt2(kShape), DType::kFloat32);
  Cluster c = cluster();
  c.devices_per_node = 2;
  c.shared_cores = true;
  // dp 2 x tp 2 on 2 cores: 2 ranks per core; micro-batches of 8 sequences, as tp 2 x 2 micro-batches.
  const Layout crowded{.dp = 2, .tp = 2, .micro_batches = 1}, alone{.tp = 2, .micro_batches = 2};
  for (KernelLayer layer : {KernelLayer::kBlock, KernelLayer::kEmbedding, KernelLayer::kHead}) {
    for (KernelPass pass : {KernelPass::kForward, KernelPass::kInput, KernelPass::kWeight}) {
      c.kernels[with_collectives_key(kernel(layer, pass, 8, 2))] = 1.0;
      c.kernels[crowded_key(kernel(layer, pass, 8, 2), 4)] = 3.0;
    }
  }
  CHECK(crowded_key(kernel(KernelLayer::kBlock, KernelPass::kForward, 8, 2), 4) ==
        "gpt/4,64,4,256,64/block/b8/tp2/sp0/f+tp@4");
  // 4 blocks, the embedding and the head: each 3.0 at 2 ranks per core, 1.5 per core (the
  // planner slows the compute by the crowding itself); their collectives are in those times.
  const StageCosts s = gpt.stage(crowded, 0, 16, c);
  CHECK(s.forward == doctest::Approx(6 * 1.5));
  CHECK(s.tp_forward.empty());
  // Two ranks do not crowd two cores: the "+tp" times.
  CHECK(gpt.stage(alone, 0, 16, c).forward == doctest::Approx(6 * 1.0));
  // A part missing one of its passes at that crowding falls back to "+tp" whole.
  c.kernels.erase(crowded_key(kernel(KernelLayer::kHead, KernelPass::kWeight, 8, 2), 4));
  CHECK(gpt.stage(crowded, 0, 16, c).forward == doctest::Approx(5 * 1.5 + 1.0));
  // Ranks with their own devices are never crowded.
  c.shared_cores = false;
  CHECK(gpt.stage(crowded, 0, 16, c).forward == doctest::Approx(6 * 1.0));
}

TEST_CASE("the planner ranks the GPT's layouts of 8 ranks, each within its memory") {
  const DescribedModel gpt(describe_gpt2(kShape), DType::kFloat32);
  PlanSettings settings;
  settings.engine = gpt2_engine_options(3e-3f);
  settings.global_batch = 16;
  const std::vector<Layout> layouts = enumerate_layouts(gpt, 8, 16);
  CHECK(layouts.size() > 50);
  const std::vector<Prediction> ranked = rank_layouts(gpt, layouts, cluster(), settings);
  CHECK(ranked.front().fits);
  CHECK(ranked.front().time.step() > 0);
}

// The search prunes with floors that must never exceed the plan: a floor above it would drop a
// layout that fits, or rank one below where it belongs. Every layout of 8 ranks planned, in fp32
// and in bf16 with fp32 norms (masters for the narrow tensors only), every stage, pipeline and
// schedule (ZeRO-3 pipelines keep their units gathered and their gradients whole). On links with and
// without a latency (the time floor counts the data-parallel collectives' bytes, not their messages),
// and on a link so slow that those collectives are most of the step (where their floor matters).
TEST_CASE("the search's memory and time floors are never above a layout's plan") {
  Cluster no_latency = cluster(), slow_link = cluster();
  no_latency.intra.latency = no_latency.inter.latency = 0;
  slow_link.intra = slow_link.inter = {1e6, 0};
  for (const bool bf16 : {false, true}) {
    for (const Cluster& c : {cluster(), no_latency, slow_link}) {
      CAPTURE(bf16);
      CAPTURE(c.intra.latency);
      CAPTURE(c.intra.bandwidth);
      const DescribedModel gpt(describe_gpt2(kShape, bf16), bf16 ? DType::kBFloat16 : DType::kFloat32);
      PlanSettings settings;
      settings.engine = gpt2_engine_options(3e-3f);
      settings.global_batch = 16;
      const std::vector<Layout> layouts = enumerate_layouts(gpt, 8, 16);
      const std::vector<Prediction> ranked = rank_layouts(gpt, layouts, c, settings);
      size_t planned = 0, tight = 0, refused = 0, tight_time = 0;
      for (const Prediction& p : ranked) {
        refused += p.unsupported.find("the engine refuses it") == 0 ? 1 : 0;
        if (!p.unsupported.empty() || p.estimate != Estimate::kExact) continue;
        CAPTURE(describe(p.layout));
        ++planned;
        CHECK(p.memory_floor > p.memory.activations);
        CHECK(p.memory_floor <= p.memory.device());
        CHECK(p.time_floor <= p.time.step());
        tight += p.memory_floor * 10 >= p.memory.device() * 9 ? 1 : 0;
        tight_time += p.time_floor * 10 >= p.time.step() * 9 ? 1 : 0;
      }
      CHECK(planned + refused == layouts.size());
      MESSAGE(tight << " of " << planned << " memory floors and " << tight_time << " time floors within 10% of the plan; "
                    << refused << " layouts the engine refuses");
    }
  }
}

}  // namespace
}  // namespace zero::strategy
