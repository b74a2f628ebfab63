#include "parallel/strategy/described_model.h"

#include <doctest/doctest.h>

#include <string>

#include "base/error.h"
#include "parallel/strategy/predict.h"
#include "parallel/strategy/test_cluster.h"

namespace zero::strategy {
namespace {

// A small model: two blocks of a column-parallel and a row-parallel matrix around a norm, a
// vocabulary of 10 (padded under tp), a head tied to the embedding.
const char* kSmall = R"({
  "name": "small", "sequence_length": 8, "hidden": 4, "heads": 2, "blocks": 2,
  "embedding": {"tensors": [{"name": "wte", "shape": [10, 4], "split": "vocab"}],
                "flops_per_token": {"forward": 0, "backward_input": 0, "backward_weight": 0},
                "tp": {"leave": 1}},
  "block": {"tensors": [{"name": "norm", "shape": [4], "no_decay": true},
                        {"name": "up", "shape": [8, 4], "split": "column"},
                        {"name": "down", "shape": [4, 8], "split": "row"}],
            "tp": {"enter": 1, "leave": 1},
            "activations": [{"per_token": 16, "split": "sequence"}, {"per_token": 32, "split": "tp"},
                            {"per_micro_batch": 100}],
            "weight_work": [{"per_token": 8, "when": "tp>1"}, {"per_token": 4, "when": "tp1"}]},
  "head": {"tensors": [{"name": "out", "shape": [10, 4], "split": "vocab", "tied_to": "wte"}],
           "tp": {"enter": 1, "all_reduces_per_token": [4]}}
})";

Cluster cluster() { return test_cluster(); }

std::string error_of(const std::string& text) {
  try {
    parse_model_description(text, "m.json");
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

// `text` with `from` replaced by `to` (once).
std::string with_in(std::string text, const std::string& from, const std::string& to) {
  const size_t at = text.find(from);
  REQUIRE(at != std::string::npos);
  return text.replace(at, from.size(), to);
}

std::string with(const std::string& from, const std::string& to) { return with_in(kSmall, from, to); }

TEST_CASE("a model description's tensors as each stage and tp rank holds them") {
  const DescribedModel m(parse_model_description(kSmall, "m.json"), DType::kBFloat16);
  // pp 1, tp 2 with sequence parallelism: the tied head is the embedding's tensor itself; the
  // vocabulary padded to 10 rows (5 a rank), the norm's gradient partial.
  const StageCosts whole = m.stage({.tp = 2, .sequence_parallel = true}, 0, 4, cluster());
  REQUIRE(whole.engine->tensors.size() == 7);
  const plan::TensorSpec& wte = whole.engine->tensors[0];
  CHECK(wte.shape == std::vector<int64_t>{5, 4});
  CHECK_FALSE(wte.tied);
  CHECK(whole.engine->tensors[1].name == "blocks.0.norm");
  CHECK(whole.engine->tensors[1].tp == TpPlacement::replicated_partial());
  CHECK(whole.engine->tensors[1].group == 1);
  CHECK(whole.engine->tensors[2].shape == std::vector<int64_t>{4, 4});
  CHECK(whole.engine->tensors[3].shape == std::vector<int64_t>{4, 4});
  CHECK(whole.engine->tensors[6].unit == 2);
  CHECK(whole.units == 4);
  // tp 4: the vocabulary of 10 padded to 12, 3 rows a rank.
  CHECK(m.stage({.tp = 4}, 0, 4, cluster()).engine->tensors[0].shape == std::vector<int64_t>{3, 4});
  CHECK(m.unsupported({.tp = 4}, 4) == "tp 4 does not divide the 2 heads");

  // pp 2: the first stage holds the embedding (marked tied) and block 0, the last a tied copy,
  // block 1 and no head tensor of its own.
  const Layout l{.pp = 2, .micro_batches = 2};
  const StageCosts first = m.stage(l, 0, 4, cluster()), last = m.stage(l, 1, 4, cluster());
  REQUIRE(first.engine->tensors.size() == 4);
  CHECK(first.engine->tensors[0].tied);
  REQUIRE(last.engine->tensors.size() == 4);
  CHECK(last.engine->tensors[0].name == "wte");
  CHECK(last.engine->tensors[0].tied);
  CHECK(last.engine->tensors[0].unit == 0);
  CHECK(last.engine->tensors[1].name == "blocks.1.norm");
  CHECK(last.engine->tensors[1].unit == 2);
  // Micro-batches of 2 sequences: 16 tokens. The default FLOPs: 2 x (8 x 4 + 4 x 8) per token a
  // pass for a block, 2 x 10 x 4 for the head (its tied matrix).
  CHECK(first.forward == doctest::Approx(16 * 128 / 1e10));
  CHECK(last.forward == doctest::Approx(16 * (128 + 80) / 1e10));
  CHECK(first.send_bytes == 16 * 4 * 4);
  CHECK(last.send_bytes == 0);
  CHECK(first.activation_bytes == 16 * 16 + 16 * 32 + 100);
  // No weight_reads: a split backward's input part frees nothing and adds its weight work.
  CHECK(first.weight_bytes == first.activation_bytes + 16 * 4);
}

TEST_CASE("a term split as the vocabulary counts a rank's rows of the padded vocabulary") {
  // The head's logits, 4 bytes per token and vocabulary entry: at tp 4 a rank holds 3 of the 12
  // padded rows, 12 bytes per token; at tp 2, 5 of 10.
  const std::string text = with(R"("heads": 2)", R"("heads": 4)");
  const DescribedModel without(parse_model_description(text, "m.json"), DType::kFloat32);
  const DescribedModel with_logits(parse_model_description(with_in(text, R"("all_reduces_per_token": [4]})",
                                                                   R"("all_reduces_per_token": [4]},
                                         "activations": [{"per_token": 40, "split": "vocab"}])"),
                                                           "m.json"),
                                   DType::kFloat32);
  for (const auto& [tp, per_token] : {std::pair{4, 12}, std::pair{2, 20}, std::pair{1, 40}}) {
    CAPTURE(tp);
    const Layout l{.tp = tp};
    CHECK(with_logits.unsupported(l, 4).empty());
    CHECK(with_logits.stage(l, 0, 4, cluster()).activation_bytes - without.stage(l, 0, 4, cluster()).activation_bytes ==
          static_cast<uint64_t>(per_token) * 4 * 8);
  }
}

TEST_CASE("a described model's tp collectives and activations under tp, sp and recompute") {
  const DescribedModel m(parse_model_description(kSmall, "m.json"), DType::kFloat32);
  const double stream = 16.0 * 4 * 4;  // 16 tokens of 4 fp32
  const StageCosts plain = m.stage({.tp = 2, .micro_batches = 2}, 0, 4, cluster());
  // The embedding leaves a region, each block enters and leaves one, the head enters one and sums
  // the loss: forward all-reduces 1 + 2 + 1 (the loss's, 4 bytes a token), backward 2 + 1.
  CHECK(plain.tp_forward.size() == 4);
  CHECK(plain.tp_backward.size() == 3);
  CHECK(plain.tp_forward.back().bytes == 16 * 4);
  CHECK(plain.tp_forward.front().bytes == stream);
  CHECK(plain.activation_bytes == 2 * (16 * 16 + 16 * 32 / 2 + 100));
  CHECK(plain.weight_bytes == plain.activation_bytes + 2 * 16 * 8);
  const StageCosts sp = m.stage({.tp = 2, .micro_batches = 2, .sequence_parallel = true}, 0, 4, cluster());
  CHECK(sp.tp_forward.size() == 1 + 4 + 2);  // reduce-scatter; (gather, scatter) x 2; gather, the loss's
  CHECK(sp.tp_backward.size() == 1 + 4 + 1);
  CHECK(sp.activation_bytes == 2 * (16 * 16 / 2 + 16 * 32 / 2 + 100));
  CHECK(sp.send_bytes == 0);
  const StageCosts rc = m.stage({.tp = 2, .micro_batches = 2, .sequence_parallel = true, .recompute = true}, 0, 4,
                                cluster());
  // Each block keeps its input rows; its forward runs again, collectives and all.
  CHECK(rc.activation_bytes == 2 * static_cast<uint64_t>(stream / 2));
  CHECK(rc.rebuilt_bytes == 16 * 16 / 2 + 16 * 32 / 2 + 100);
  // An input part keeps every rebuilt block for its weight part (no weight_reads) and frees the
  // inputs; it peaks at the second block's rebuild: the first's keep and the second's input and
  // rebuilt block on top of what was held.
  const uint64_t block = rc.rebuilt_bytes, keep = block + 16 * 8;
  CHECK(rc.weight_bytes == 2 * keep);
  CHECK(rc.input_peak_bytes == keep - static_cast<uint64_t>(stream / 2) + block);
  // With weight_reads the input part frees the rest: a block keeps its 32-byte term and its work.
  const DescribedModel reads(parse_model_description(with(R"("weight_work": [)", R"("weight_reads": [{"per_token": 32, "split": "tp"}],
            "weight_work": [)"), "m.json"), DType::kFloat32);
  const StageCosts r = reads.stage({.tp = 2, .micro_batches = 2}, 0, 4, cluster());
  CHECK(r.activation_bytes == plain.activation_bytes);
  CHECK(r.weight_bytes == 2 * (16 * 32 / 2 + 16 * 8));
  CHECK(r.input_peak_bytes == 0);  // only the ends of actions count without recompute
  CHECK(rc.tp_backward.size() == sp.tp_backward.size() + 4);
  CHECK(rc.backward_input == doctest::Approx(sp.backward_input + 2 * 16 * 64 / 1e10));  // 2 x (4 x 4 + 4 x 4) at tp 2
}

TEST_CASE("a model description's errors name the field") {
  CHECK(error_of(with(R"("hidden": 4, )", "")) == "m.json: missing field hidden");
  CHECK(error_of(with(R"("split": "row")", R"("split": "rows")")) ==
        R"(m.json: block.tensors[2].split must be one of replicated, column, row, vocab, got "rows")");
  CHECK(error_of(with(R"("per_token": 32)", R"("per_token": -1)")) ==
        "m.json: block.activations[1].per_token must be >= 0, got -1");
  CHECK(error_of(with(R"("per_micro_batch": 100)", R"("per_micro_batch": 100, "per_token": 1)")) ==
        "m.json: block.activations[2] needs one of per_token and per_micro_batch");
  CHECK(error_of(with(R"("tied_to": "wte")", R"("tied_to": "wpe")")) ==
        "m.json: head.tensors[0].tied_to: no embedding tensor named wpe");
  CHECK(error_of(with(R"("shape": [8, 4], "split": "column")", R"("shape": [8, 4], "split": {"dim": 2})")) ==
        "m.json: block.tensors[1].split splits dimension 2 of a 2-dimensional tensor");
  CHECK(error_of(with(R"("name": "down")", R"("name": "up")")) == "m.json: block.tensors[2]: a second tensor named up");
  CHECK(error_of(with(R"("leave": 1}},)", R"("leav": 1}},)")).find(
            "unknown key embedding.tp.leav (did you mean embedding.tp.leave?); parallel/strategy/described_model.h "
            "lists the keys") != std::string::npos);
  CHECK(error_of(with(R"("split": "column")", R"("split": "column", "dtype": "int32")")) ==
        "m.json: block.tensors[1].dtype must be fp32, bf16 or fp16, got int32");
  CHECK(error_of(with(R"("shape": [8, 4])", R"("shape": [])")) == "m.json: block.tensors[1].shape needs at least one dimension");
  CHECK(error_of(with(R"("split": "column")", R"("split": 3)")).find("block.tensors[1].split must be a name") !=
        std::string::npos);
  CHECK(error_of(with(R"("tied_to": "wte")", R"("tied_to": "wte", "no_decay": true)")) ==
        "m.json: head.tensors[0]: a tied tensor is wte, whose dtype and no_decay it takes");
  CHECK(error_of(with(R"("heads": 2)", R"("heads": 4, "kv_heads": 3)")) == "m.json: kv_heads 3 does not divide heads 4");
  CHECK(error_of(with(R"("blocks": 2)", R"("blocks": 2000000)")).find("blocks") != std::string::npos);
  // A term split as the vocabulary needs a vocabulary.
  std::string columns = kSmall;
  for (size_t at; (at = columns.find(R"("split": "vocab")")) != std::string::npos;) {
    columns.replace(at, 16, R"("split": "column")");
  }
  columns = with_in(columns, R"("all_reduces_per_token": [4]})", R"("all_reduces_per_token": [4]},
                    "activations": [{"per_token": 40, "split": "vocab"}])");
  CHECK(error_of(columns) == R"(m.json: head.activations[0].split: "vocab" needs a tensor split "vocab")");
  // A split that does not divide is a layout the model cannot run, named.
  std::string text = with(R"("heads": 2)", R"("heads": 4)");
  text.replace(text.find("[8, 4]"), 6, "[6, 4]");
  const DescribedModel odd(parse_model_description(text, "m.json"), DType::kFloat32);
  CHECK(odd.unsupported({.tp = 2}, 4) == "");
  CHECK(odd.unsupported({.tp = 4}, 4) == "tp 4 does not divide dimension 0 (6) of up");
}

// LLaMA-2 7B (examples/models/llama2_7b.json): its parameter count, and two layouts on 8 devices
// of 80 GB (the whole search is docs/strategy.md's; too slow for a test under ASan).
TEST_CASE("LLaMA-2 7B described: 6.74 billion parameters, planned on 8 x 80 GB") {
  const DescribedModel m(load_model_description("examples/models/llama2_7b.json"), DType::kBFloat16);
  CHECK(m.stage({}, 0, 1, cluster()).engine->numel() == 6738415616ull);
  Cluster c = cluster();
  c.device_memory = 80e9;
  c.peak_flops = 312e12;
  c.matmul_efficiency = 0.5;
  c.intra = {150e9, 5e-6};
  c.optimizer_rate = 1e10;
  PlanSettings settings;
  settings.engine.optimizer.kind = optim::OptimizerKind::kAdamW;
  settings.engine.optimizer.groups = {optim::Hyper{.weight_decay = 0.1f}, optim::Hyper{}};  // decayed, no_decay
  settings.global_batch = 256;
  // ZeRO-3 at 2 sequences per micro-batch fits: a rank holds an eighth of the optimizer state and
  // 33 GiB of activations, the description's per token (131712 bytes per block: two norms' inputs,
  // two gathered inputs, q k v, the attention output, the MLP's three products, the log-sum-exp; and
  // the head's 144384) at 8192 tokens.
  const Prediction fits = predict(m, {.dp = 8, .stage = 3, .micro_batches = 16}, c, settings);
  CHECK(fits.fits);
  CHECK(fits.memory.optimizer == doctest::Approx(6738415616.0 * 8 / 8).epsilon(0.01));
  CHECK(fits.memory.activations == 8192ull * (32 * 131712 + 144384));
  // 32 sequences at once do not.
  CHECK_FALSE(predict(m, {.dp = 8, .stage = 3, .micro_batches = 1}, c, settings).fits);
}

// LLaMA-2 70B: grouped-query attention's 8 key and value heads bound tp.
TEST_CASE("LLaMA-2 70B described: 68.98 billion parameters, tp bounded by its key and value heads") {
  const DescribedModel m(load_model_description("examples/models/llama2_70b.json"), DType::kBFloat16);
  CHECK(m.stage({}, 0, 1, cluster()).engine->numel() == 68976648192ull);
  CHECK(m.unsupported({.tp = 8}, 8).empty());
  CHECK(m.unsupported({.tp = 16}, 8) == "tp 16 does not divide the 8 key and value heads");
  // tp 8: each rank holds one key and value head (128 of wk's 1024 rows).
  CHECK(m.stage({.tp = 8}, 0, 8, cluster()).engine->tensors[3].shape == std::vector<int64_t>{128, 8192});
}

}  // namespace
}  // namespace zero::strategy
