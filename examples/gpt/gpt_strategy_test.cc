#include "examples/gpt/gpt_strategy.h"

#include <doctest/doctest.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "comm/mesh.h"
#include "examples/gpt/gpt_engine.h"
#include "examples/gpt/gpt_pipeline.h"
#include "parallel/engine_comms.h"
#include "parallel/pipeline/schedules.h"
#include "parallel/strategy/described_model.h"
#include "parallel/strategy/predict.h"
#include "testing/thread_ranks.h"
#include "zero/engine.h"

namespace zero::examples {
namespace {

using strategy::TpCollective;

GptConfig config() {
  GptConfig c;
  c.n_layer = 4;
  c.n_embd = 64;
  c.n_head = 4;
  c.vocab_size = 256;
  c.block_size = 64;
  return c;
}

strategy::Cluster cluster() {
  strategy::Cluster c;
  c.name = "test";
  c.devices_per_node = 8;
  c.device_memory = 1e12;
  c.peak_flops = 1e10;
  c.intra = c.inter = {1e9, 1e-5};
  c.optimizer_rate = 1e8;
  return c;
}

TEST_CASE("what the GPT cannot run is named") {
  const GptCosts gpt(config(), DType::kFloat32);
  CHECK(gpt.unsupported({.tp = 8}, 16) == "tp 8 does not divide the 4 heads");
  CHECK(gpt.unsupported({.pp = 8}, 16) == "pp 8 is more stages than the 4 layers");
  CHECK(gpt.unsupported({.dp = 2, .micro_batches = 3}, 16) == "the batch 16 does not divide into dp 2 x 3 micro-batches");
  CHECK(gpt.unsupported({.dp = 2, .tp = 2, .pp = 2, .micro_batches = 4}, 16).empty());
}

TEST_CASE("a stage's costs: its activations are the model's, its tp collectives Megatron's f and g") {
  const GptCosts gpt(config(), DType::kFloat32);
  const Layout l{.dp = 1, .tp = 2, .pp = 2, .micro_batches = 4};
  const strategy::StageCosts first = gpt.stage(l, 0, 16, cluster()), last = gpt.stage(l, 1, 16, cluster());
  const Gpt::MicroBatchBytes want = Gpt::micro_batch_bytes(config(), GptStage{0, 2, true, false}, 2, false, 4, 64);
  CHECK(first.activation_bytes == want.forward);
  CHECK(first.weight_work_bytes == want.weight_work);
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
  // Without calibrated kernels: the matrix FLOPs at the cluster's rate.
  CHECK(first.forward == doctest::Approx(2 * gpt.flops(GptPart::kBlock, GptPass::kForward, 4, 2) / 1e10));
  // With sequence parallelism the regions all-gather and reduce-scatter, and a stage sends its rows.
  const strategy::StageCosts sp = gpt.stage({.tp = 2, .pp = 2, .micro_batches = 4, .sequence_parallel = true}, 0, 16,
                                            cluster());
  CHECK(sp.tp_forward[0].kind == TpCollective::kAllGather);
  CHECK(sp.send_bytes == first.send_bytes / 2);
}

TEST_CASE("the engine's own tp collectives are in the step: sequence parallelism's partial gradients") {
  const GptCosts gpt(config(), DType::kFloat32);
  strategy::PlanSettings settings;
  settings.engine = gpt_engine_options(1e-3f);
  settings.global_batch = 16;
  const strategy::Prediction plain = strategy::predict(gpt, {.tp = 2, .stage = 1, .micro_batches = 2}, cluster(), settings);
  const strategy::Prediction sp = strategy::predict(
      gpt, {.tp = 2, .stage = 1, .micro_batches = 2, .sequence_parallel = true}, cluster(), settings);
  // Without sp only the norm's sum crosses the tp group; with it the partial gradients of the
  // parameters it replicates (wpe, the LayerNorms', the row-parallel biases') are summed over it
  // too, in one packed all-reduce: one call's two messages and its bytes (fp32, each once on the
  // wire at tp 2), not a call per tensor.
  CHECK(plain.time.engine_tp > 0);
  const GptConfig g = config();
  const double partial_bytes = 4.0 * (g.block_size + 6 * g.n_layer + 2) * g.n_embd;
  const strategy::Link link = cluster().intra;
  CHECK(sp.time.engine_tp - plain.time.engine_tp ==
        doctest::Approx(2 * link.latency + partial_bytes / link.bandwidth).epsilon(1e-9));
  CHECK(sp.time.dp_comm == sp.time.engine_tp);  // dp 1: nothing else
  CHECK(sp.time.dp_exposed == doctest::Approx(sp.time.engine_tp / 6).epsilon(1e-9));  // one unit's share at least
}

TEST_CASE("more ranks than a shared-core machine's cores: the tp parts timed at that crowding, per core") {
  const GptCosts gpt(config(), DType::kFloat32);
  strategy::Cluster c = cluster();
  c.devices_per_node = 2;
  c.shared_cores = true;
  // dp 2 x tp 2 on 2 cores: 2 ranks per core; micro-batches of 8 sequences, as tp 2 x 2 micro-batches.
  const Layout crowded{.dp = 2, .tp = 2, .micro_batches = 1}, alone{.tp = 2, .micro_batches = 2};
  for (GptPart part : {GptPart::kBlock, GptPart::kEmbedding, GptPart::kHead}) {
    for (GptPass pass : {GptPass::kForward, GptPass::kInput, GptPass::kWeight}) {
      c.kernels[gpt.kernel_key(part, pass, 8, 2, false, true)] = 1.0;
      c.kernels[gpt.crowded_key(part, pass, 8, 2, false, 4)] = 3.0;
    }
  }
  CHECK(gpt.crowded_key(GptPart::kBlock, GptPass::kForward, 8, 2, false, 4) == "gpt/4,64,4,256,64/block/b8/tp2/sp0/f+tp@4");
  // 4 blocks, the embedding and the head: each 3.0 at 2 ranks per core, 1.5 per core (the
  // planner slows the compute by the crowding itself); their collectives are in those times.
  const strategy::StageCosts s = gpt.stage(crowded, 0, 16, c);
  CHECK(s.forward == doctest::Approx(6 * 1.5));
  CHECK(s.tp_forward.empty());
  // Two ranks do not crowd two cores: the "+tp" times.
  CHECK(gpt.stage(alone, 0, 16, c).forward == doctest::Approx(6 * 1.0));
  // A part missing one of its passes at that crowding falls back to "+tp" whole.
  c.kernels.erase(gpt.crowded_key(GptPart::kHead, GptPass::kWeight, 8, 2, false, 4));
  CHECK(gpt.stage(crowded, 0, 16, c).forward == doctest::Approx(5 * 1.5 + 1.0));
  // Ranks with their own devices are never crowded.
  c.shared_cores = false;
  CHECK(gpt.stage(crowded, 0, 16, c).forward == doctest::Approx(6 * 1.0));
}

TEST_CASE("calibrated kernels take the place of the FLOP estimate") {
  const GptCosts gpt(config(), DType::kFloat32);
  strategy::Cluster c = cluster();
  c.kernels[gpt.kernel_key(GptPart::kBlock, GptPass::kForward, 16, 1, false)] = 0.5;
  c.kernels[gpt.kernel_key(GptPart::kHead, GptPass::kForward, 16, 1, false)] = 0.25;
  CHECK(gpt.kernel_key(GptPart::kBlock, GptPass::kForward, 16, 1, false) == "gpt/4,64,4,256,64/block/b16/tp1/sp0/f");
  const strategy::StageCosts s = gpt.stage({}, 0, 16, c);
  CHECK(s.forward == doctest::Approx(4 * 0.5 + 0.25));  // the embedding's lookups cost no FLOPs
  // Timed alone too: one rank on a machine whose ranks share the cores uses those; more ranks, or
  // ranks with their own devices, do not.
  c.kernels[gpt.alone_key(GptPart::kBlock, GptPass::kForward, 16)] = 0.375;
  CHECK(gpt.alone_key(GptPart::kBlock, GptPass::kForward, 16) == "gpt/4,64,4,256,64/block/b16/tp1/sp0/f+alone");
  CHECK(gpt.stage({}, 0, 16, c).forward == doctest::Approx(4 * 0.5 + 0.25));
  c.shared_cores = true;
  CHECK(gpt.stage({}, 0, 16, c).forward == doctest::Approx(4 * 0.375 + 0.25));
  CHECK(gpt.stage({.pp = 2}, 0, 16, c).forward == doctest::Approx(2 * 0.5));  // two ranks: two blocks each
}

TEST_CASE("the planner ranks the GPT's layouts of 8 ranks, each within its memory") {
  const GptCosts gpt(config(), DType::kFloat32);
  strategy::PlanSettings settings;
  settings.engine.optimizer.kind = optim::OptimizerKind::kAdamW;
  settings.engine.optimizer.groups = {optim::Hyper{}, optim::Hyper{}};
  settings.global_batch = 16;
  const std::vector<Layout> layouts = strategy::enumerate_layouts(gpt, 8, 16);
  CHECK(layouts.size() > 50);
  const std::vector<strategy::Prediction> ranked = strategy::rank_layouts(gpt, layouts, cluster(), settings);
  CHECK(ranked.front().fits);
  CHECK(ranked.front().time.step() > 0);
}

// One pipeline rank as the engine measured it: its activation peak over its chunks, and its memory
// report's peaks by category.
struct RankMeasured {
  size_t activations = 0;
  std::map<std::string, uint64_t> peaks;
};

// Two steps of `l` (dp 1, tp 1) of a small GPT through GptPipeline, pipeline ranks as threads.
std::vector<RankMeasured> run_pipeline(const GptConfig& c, const Layout& l, int B, const EngineOptions& base) {
  std::vector<RankMeasured> out(static_cast<size_t>(l.pp));
  std::mutex mu;
  testing::run_thread_ranks(l.pp, [&](comm::Communicator& world) {
    comm::Mesh mesh(world, comm::MeshShape{.pp = l.pp, .dp = 1, .tp = 1});
    const Gpt whole(c, 3);
    EngineOptions o = base;
    o.stage = l.stage;
    o.micro_batches = l.micro_batches;
    Engine engine(parallel::engine_comms(mesh), o);
    GptPipeline pipe(whole, {}, mesh, parallel::make_schedule(l.schedule, l.pp, l.micro_batches, l.chunks, c.n_layer),
                     {}, engine);
    for (Gpt& chunk : pipe.chunks()) chunk.set_recompute(l.recompute);
    pipe.finalize();
    std::vector<MicroBatch> batches;
    for (int q = 0; q < l.micro_batches; ++q) {
      MicroBatch m{{}, {}, B, c.block_size};
      for (int i = 0; i < B * c.block_size; ++i) {
        m.inputs.push_back((i * 17 + 5 * q + 3) % c.vocab_size);
        m.targets.push_back((i * 29 + 7 * q + 11) % c.vocab_size);
      }
      batches.push_back(std::move(m));
    }
    size_t activations = 0;
    for (int step = 0; step < 2; ++step) {
      activations = std::max(activations, pipe.train_step(batches, engine.loss_scale()).peak_activation_bytes);
      engine.step();
    }
    RankMeasured r{activations, {}};
    for (const MemoryReport::Row& row : engine.memory_report().rows) r.peaks[row.category] = row.peak;
    std::lock_guard<std::mutex> lock(mu);
    out[static_cast<size_t>(mesh.coord().pp)] = r;
  });
  return out;
}

TEST_CASE("planned pipeline ranks equal GptPipeline's: activation peaks and engine memory, interleaved included") {
  const GptConfig c{.vocab_size = 61, .block_size = 8, .n_embd = 16, .n_head = 4, .n_layer = 4};
  const GptCosts gpt(c, DType::kFloat32);
  const int B = 2;
  strategy::PlanSettings settings;
  settings.engine = gpt_engine_options(1e-3f);
  for (const Layout& base : {Layout{.pp = 2, .micro_batches = 4, .schedule = "1f1b"},
                            Layout{.pp = 2, .micro_batches = 4, .schedule = "zb-h1"},
                            Layout{.pp = 2, .micro_batches = 4, .schedule = "interleaved", .chunks = 2},
                            Layout{.pp = 2, .micro_batches = 2, .schedule = "interleaved", .chunks = 2}}) {
    for (int stage : {1, 3}) {
      for (bool recompute : {false, true}) {
        Layout l = base;
        l.stage = stage;
        l.recompute = recompute;
        CAPTURE(describe(l));
        settings.global_batch = B * l.micro_batches;
        const strategy::Prediction p = strategy::predict(gpt, l, cluster(), settings);
        REQUIRE(p.unsupported.empty());
        const std::vector<RankMeasured> measured = run_pipeline(c, l, B, settings.engine);
        size_t largest = 0;
        for (const RankMeasured& r : measured) largest = std::max(largest, r.activations);
        CHECK(p.largest_activations == largest);
        const RankMeasured& r = measured[static_cast<size_t>(p.memory_stage)];
        CHECK(p.memory.activations == r.activations);
        CHECK(p.memory.grads == r.peaks.at("grads"));
        CHECK(p.memory.master == r.peaks.at("master_params"));
        CHECK(p.memory.optimizer == r.peaks.at("optimizer_state"));
        CHECK(p.memory.buffers == r.peaks.at("comm_buffer"));
        CHECK(p.memory.params == r.peaks.at(stage == 3 ? "params (shard)" : "params (user)"));
        if (stage == 3) CHECK(p.memory.window == r.peaks.at("gather_window"));
      }
    }
  }
}

// examples/models/gpt_4layer.json describes this GPT; the planner must see the same model through
// it as through GptCosts (on a cluster without calibrated kernels, where both cost FLOPs): the
// engine's tensors, the compute, the tp collectives, the sends and the activations of every stage
// of every layout of 1, 2 and 4 ranks, and so the same memory and step.
// Also in bf16 (whose gradients the loop hands over as a scope closes) and with a vocabulary of 250,
// which tp 4 pads to 252 (the description's tensors and its "vocab" terms).
TEST_CASE("the GPT described in JSON is planned as the GPT itself") {
  for (const auto& [dtype, vocab] : {std::pair{DType::kFloat32, 256}, std::pair{DType::kBFloat16, 256},
                                     std::pair{DType::kFloat32, 250}}) {
    CAPTURE(dtype_name(dtype));
    CAPTURE(vocab);
    GptConfig c = config();
    c.vocab_size = vocab;
    const GptCosts gpt(c, dtype);
    strategy::ModelDescription description = strategy::load_model_description("examples/models/gpt_4layer.json");
    if (vocab != 256) {
      description.name = gpt.name();
      description.embedding.tensors[0].shape[0] = description.head.tensors[2].shape[0] = vocab;
      description.head.activations[2].bytes = 4.0 * vocab;  // the whole vocabulary's probabilities at tp 1
      description.head.weight_work[0].bytes = 4.0 * vocab;  // the logits' gradients
    }
    const strategy::DescribedModel described(description, dtype);
    CHECK(described.name() == gpt.name());
    strategy::PlanSettings settings;
    settings.engine = gpt_engine_options(3e-3f);
    settings.engine.grad_accum_dtype = dtype;
    settings.global_batch = 16;
    // What the engine's plan reads of a tensor (its name aside), in registration order.
    auto engine_view = [](const plan::ModelSpec& m) {
      std::vector<std::string> out;
      for (const plan::TensorSpec& t : m.tensors) {
        out.push_back(fmt::format("{} {} unit {} group {} {}{}", fmt::join(t.shape, "x"), dtype_name(m.dtype_of(t)),
                                  t.unit, t.group, describe(t.tp), t.tied ? " tied" : ""));
      }
      return out;
    };
    auto sorted = [](std::vector<TpCollective> v) {
      std::vector<std::pair<int, double>> out;
      for (const TpCollective& c : v) out.emplace_back(static_cast<int>(c.kind), c.bytes);
      std::sort(out.begin(), out.end());
      return out;
    };
    size_t layouts = 0;
    for (int world : {1, 2, 4}) {
      const std::vector<Layout> ls = strategy::enumerate_layouts(gpt, world, 16);
      CHECK(strategy::enumerate_layouts(described, world, 16) == ls);
      for (const Layout& l : ls) {
        CAPTURE(describe(l));
        REQUIRE(described.unsupported(l, 16) == gpt.unsupported(l, 16));
        if (vocab != 256 && l.tp != 4) continue;  // the padded vocabulary: where tp pads it
        for (int s = 0; s < l.virtual_stages(); ++s) {
          const strategy::StageCosts a = gpt.stage(l, s, 16, cluster()), b = described.stage(l, s, 16, cluster());
          CAPTURE(s);
          CHECK(engine_view(*a.engine) == engine_view(*b.engine));
          CHECK(a.units == b.units);
          CHECK(a.forward == doctest::Approx(b.forward).epsilon(1e-12));
          CHECK(a.backward_input == doctest::Approx(b.backward_input).epsilon(1e-12));
          CHECK(a.backward_weight == doctest::Approx(b.backward_weight).epsilon(1e-12));
          CHECK(sorted(a.tp_forward) == sorted(b.tp_forward));
          CHECK(sorted(a.tp_backward) == sorted(b.tp_backward));
          CHECK(a.send_bytes == b.send_bytes);
          CHECK(a.activation_bytes == b.activation_bytes);
          CHECK(a.weight_work_bytes == b.weight_work_bytes);
          CHECK(a.rebuilt_bytes == b.rebuilt_bytes);
        }
        const strategy::Prediction p = strategy::predict(gpt, l, cluster(), settings),
                                   q = strategy::predict(described, l, cluster(), settings);
        CHECK(p.memory.device() == q.memory.device());
        CHECK(p.time.step() == doctest::Approx(q.time.step()).epsilon(1e-9));
        ++layouts;
      }
    }
    CHECK(layouts > (vocab == 256 ? 100 : 10));
  }
}

}  // namespace
}  // namespace zero::examples
