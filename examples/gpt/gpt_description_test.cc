// The GPT's description (parallel/strategy/gpt2.h, what zero_plan --gpt plans) against the model it
// describes: the activations Gpt::micro_batch_bytes counts from the model's own shapes, the tensors
// and scope schedule recorded from its passes (gpt_model_spec), and what GptPipeline measures.
#include <doctest/doctest.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "comm/mesh.h"
#include "examples/gpt/gpt_engine.h"
#include "examples/gpt/gpt_flags.h"
#include "examples/gpt/gpt_pipeline.h"
#include "examples/gpt/gpt_plan.h"
#include "parallel/engine_comms.h"
#include "parallel/pipeline/schedules.h"
#include "parallel/strategy/gpt2.h"
#include "parallel/strategy/predict.h"
#include "parallel/strategy/test_cluster.h"
#include "testing/thread_ranks.h"
#include "zero/engine.h"

namespace zero::examples {
namespace {

strategy::Cluster cluster() { return strategy::test_cluster(); }

// The description's costs with the engine's tensors and scope schedule the model itself records.
class RecordedGpt : public strategy::ModelCosts {
 public:
  RecordedGpt(const strategy::DescribedModel& described, const GptConfig& c, DType dtype)
      : described_(described), config_(c), dtype_(dtype) {}
  std::string name() const override { return described_.name(); }
  int sequence_length() const override { return described_.sequence_length(); }
  std::string unsupported(const Layout& l, int batch) const override { return described_.unsupported(l, batch); }
  strategy::StageCosts stage(const Layout& l, int s, int batch, const strategy::Cluster& cluster) const override {
    strategy::StageCosts out = described_.stage(l, s, batch, cluster);
    // Shared by the layouts that differ in the rest, as the description shares its own (the search
    // plans the engine once per distinct tensor list).
    auto& spec = specs_[std::make_tuple(l.tp, l.sequence_parallel, l.virtual_stages(), s)];
    if (!spec) {
      const std::vector<GptStage> stages = gpt_stages(config_.n_layer, l.virtual_stages());
      spec = std::make_shared<const plan::ModelSpec>(gpt_model_spec(
          config_, dtype_, l.tp, l.sequence_parallel, l.virtual_stages() > 1 ? &stages[static_cast<size_t>(s)] : nullptr));
    }
    out.engine = spec;
    return out;
  }

 private:
  const strategy::DescribedModel& described_;
  GptConfig config_;
  DType dtype_;
  mutable std::map<std::tuple<int, bool, int, int>, std::shared_ptr<const plan::ModelSpec>> specs_;
};

// Every layout of 1, 2 and 4 ranks, in fp32 and bf16 (whose gradients the loop hands over as a
// scope closes), with a vocabulary of 250 (which tp 4 pads to 252) and a shape whose context,
// width and heads differ: each stage's activations, weight work and rebuilt block are the model's
// bytes, its tensors and scope schedule the ones the model records (GptScopes registers, its passes
// open and close), and so its memory and step planned (checked on one layout in eight).
TEST_CASE("the GPT's description is the model: activations, tensors and memory at every layout") {
  struct Case {
    GptConfig config;
    DType dtype;
  };
  const Case cases[] = {{{.vocab_size = 256, .block_size = 64, .n_embd = 64, .n_head = 4, .n_layer = 4}, DType::kFloat32},
                        {{.vocab_size = 256, .block_size = 64, .n_embd = 64, .n_head = 4, .n_layer = 4}, DType::kBFloat16},
                        {{.vocab_size = 250, .block_size = 64, .n_embd = 64, .n_head = 4, .n_layer = 4}, DType::kFloat32},
                        {{.vocab_size = 97, .block_size = 24, .n_embd = 48, .n_head = 8, .n_layer = 3}, DType::kFloat32}};
  size_t layouts = 0;
  for (const Case& k : cases) {
    const GptConfig& c = k.config;
    CAPTURE(gpt2_shape_text(gpt2_shape(c)));
    CAPTURE(dtype_name(k.dtype));
    const strategy::DescribedModel described(strategy::describe_gpt2(gpt2_shape(c)), k.dtype);
    const RecordedGpt recorded(described, c, k.dtype);
    strategy::PlanSettings settings;
    settings.engine = strategy::gpt2_engine_options(3e-3f);
    settings.engine.grad_accum_dtype = k.dtype;
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
    // The scope schedule of one micro-step: the order the loop opens and closes the units and which
    // gradients it hands over in each (in what order within one run of them does not change a plan:
    // the model asks for a unit's in reverse, the description in registration order).
    auto schedule_view = [](const plan::ModelSpec& m) {
      std::vector<std::string> out;
      std::vector<size_t> grads;
      auto flush = [&] {
        std::sort(grads.begin(), grads.end());
        if (!grads.empty()) out.push_back(fmt::format("grads {}", fmt::join(grads, " ")));
        grads.clear();
      };
      for (const plan::ScopeEvent& e : m.schedule) {
        if (e.kind == plan::ScopeEvent::kGrad) {
          grads.push_back(e.tensor);
          continue;
        }
        flush();
        out.push_back(fmt::format("{} {}{}", e.kind == plan::ScopeEvent::kOpen ? "open" : "close", e.unit,
                                  e.backward ? "b" : "f"));
      }
      flush();
      return out;
    };
    for (int world : {1, 2, 4}) {
      for (const Layout& l : strategy::enumerate_layouts(described, world, 16)) {
        CAPTURE(describe(l));
        const int stages = l.virtual_stages(), B = 16 / (l.dp * l.micro_batches);
        const std::vector<GptStage> cut = gpt_stages(c.n_layer, stages);
        for (int s = 0; s < stages; ++s) {
          CAPTURE(s);
          const strategy::StageCosts d = described.stage(l, s, 16, cluster()), r = recorded.stage(l, s, 16, cluster());
          const Gpt::MicroBatchBytes bytes = Gpt::micro_batch_bytes(c, cut[static_cast<size_t>(s)], l.tp,
                                                                    l.sequence_parallel, B, c.block_size, l.recompute);
          CHECK(d.activation_bytes == bytes.forward);
          CHECK(d.weight_bytes == bytes.weight);
          CHECK(d.rebuilt_bytes == bytes.rebuilt);
          CHECK(d.input_peak_bytes == bytes.input_peak);
          CHECK(engine_view(*d.engine) == engine_view(*r.engine));
          CHECK(schedule_view(*d.engine) == schedule_view(*r.engine));
        }
        // The engine's plan of the two (the meta device's engine, the slow part): one layout in 8.
        if (layouts++ % 8 == 0) {
          const strategy::Prediction p = strategy::predict(recorded, l, cluster(), settings),
                                     q = strategy::predict(described, l, cluster(), settings);
          CHECK(p.memory.device() == q.memory.device());
          CHECK(p.time.step() == doctest::Approx(q.time.step()).epsilon(1e-9));
        }
      }
    }
  }
  CHECK(layouts > 300);
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
    GptPipeline pipe(whole, {}, mesh,
                     gpt_schedule(l.schedule, c, l.pp, l.micro_batches, l.chunks, {}, 1, false, B, c.block_size,
                                  l.recompute),
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

TEST_CASE("planned pipeline ranks equal GptPipeline's: activation peaks and engine memory, interleaved and zb-v included") {
  const GptConfig c{.vocab_size = 61, .block_size = 8, .n_embd = 16, .n_head = 4, .n_layer = 4};
  const strategy::DescribedModel gpt(strategy::describe_gpt2(gpt2_shape(c)), DType::kFloat32);
  const int B = 2;
  strategy::PlanSettings settings;
  settings.engine = strategy::gpt2_engine_options(1e-3f);
  for (const Layout& base : {Layout{.pp = 2, .micro_batches = 4, .schedule = "1f1b"},
                            Layout{.pp = 2, .micro_batches = 4, .schedule = "zb-h1"},
                            Layout{.pp = 2, .micro_batches = 4, .schedule = "zb-v", .chunks = 2},
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

}  // namespace
}  // namespace zero::examples
