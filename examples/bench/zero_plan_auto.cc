#include "examples/bench/zero_plan_auto.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/check.h"
#include "examples/gpt/gpt_engine.h"
#include "examples/gpt/gpt_flags.h"
#include "examples/gpt/gpt_strategy.h"
#include "parallel/strategy/described_model.h"
#include "parallel/strategy/hf_llama.h"
#include "parallel/strategy/chart.h"
#include "parallel/strategy/cluster.h"
#include "parallel/strategy/predict.h"

namespace zero {
namespace {

// train_gpt's flags for a layout (dp follows from the ranks).
std::string train_flags(const strategy::Layout& l) {
  std::string s = fmt::format("--stage {}", l.zero_stage);
  if (l.tp > 1) s += fmt::format(" --tp {}", l.tp);
  if (l.sequence_parallel) s += " --sequence-parallel";
  if (l.pp > 1) s += fmt::format(" --pp {} --pp-schedule {}", l.pp, l.schedule);
  if (l.chunks > 1) s += fmt::format(" --chunks {}", l.chunks);
  if (l.micro_batches > 1 || l.pp > 1) s += fmt::format(" --micro-batches {}", l.micro_batches);
  if (l.offload) s += " --offload";
  if (l.recompute) s += " --recompute";
  return s;
}

}  // namespace

int run_strategy(examples::Flags& flags) {
  const std::string gpt = flags.get("gpt", ""), model_path = flags.get("model", ""), hf = flags.get("hf-config", "");
  if (!gpt.empty() + !model_path.empty() + !hf.empty() != 1) {
    ZERO_THROW(InvalidArgument,
               "--auto, --explain and --describe plan one model: --gpt L,C,H[,V,T], --model FILE (a model "
               "description) or --hf-config FILE (a LLaMA-family HuggingFace config.json)");
  }
  const bool has_seq_len = flags.has("seq-len");
  const int seq_len = flags.get_int("seq-len", 0);
  if (has_seq_len && (seq_len < 1 || hf.empty())) {
    ZERO_THROW(InvalidArgument, "--seq-len {}: the sequence length of a --hf-config model, positive", seq_len);
  }
  std::optional<strategy::ModelDescription> description;
  if (!model_path.empty()) description = strategy::load_model_description(model_path);
  if (!hf.empty()) description = strategy::load_llama_description(hf, seq_len);
  if (flags.get_bool("describe", false)) {
    if (!description) ZERO_THROW(InvalidArgument, "--describe writes a --model or --hf-config model's description");
    flags.check_all_used();
    std::printf("%s", strategy::to_json(*description).c_str());
    return 0;
  }
  const std::string cluster_path = flags.get("cluster", "");
  if (cluster_path.empty()) ZERO_THROW(InvalidArgument, "--auto and --explain need --cluster FILE (a cluster description)");
  const strategy::Cluster cluster = strategy::load_cluster(cluster_path);
  const int batch = flags.get_int("batch", 0);
  if (batch < 1) ZERO_THROW(InvalidArgument, "--batch (sequences per step) must be positive, got {}", batch);
  const int world = flags.get_int("world", cluster.devices());
  if (world < 1) ZERO_THROW(InvalidArgument, "--world must be positive, got {}", world);
  // The parameters' dtype: train_gpt's fp32 for the GPT, bf16 for a described one (--model, --hf-config).
  const DType dtype = parse_dtype(flags.get("dtype", gpt.empty() ? "bf16" : "fp32"));
  const int top = flags.get_int("top", 20);
  const std::string svg = flags.get("svg", "");
  const bool list = flags.get_bool("list", false);
  const std::string explain_text = flags.get("explain", "");
  flags.get_bool("auto", false);
  flags.check_all_used();
  if (dtype != DType::kFloat32 && dtype != DType::kBFloat16) {
    ZERO_THROW(InvalidArgument, "--dtype: the planner's models run in fp32 or bf16, got {}", dtype_name(dtype));
  }

  std::unique_ptr<strategy::ModelCosts> costs;
  if (!gpt.empty()) {
    costs = std::make_unique<examples::GptCosts>(examples::gpt_config_of_shape(gpt), dtype);
  } else {
    costs = std::make_unique<strategy::DescribedModel>(std::move(*description), dtype);
  }
  const strategy::ModelCosts& model = *costs;
  strategy::PlanSettings settings;
  // train_gpt's optimizer: AdamW, weight decay on group 0 and none on group 1 (a description's
  // no_decay tensors).
  settings.engine = examples::gpt_engine_options(3e-3f);
  settings.engine.grad_accum_dtype = dtype;
  settings.global_batch = batch;

  if (!explain_text.empty()) {
    const strategy::Layout l = strategy::parse_layout(explain_text);
    if (l.world() != world && flags.has("world")) {
      ZERO_THROW(InvalidArgument, "--explain '{}' is {} ranks but --world is {}", explain_text, l.world(), world);
    }
    std::printf("%s on %s, global batch %d\n%s", model.name().c_str(), cluster.name.c_str(), batch,
                strategy::explain(strategy::predict(model, l, cluster, settings)).c_str());
    return 0;
  }
  const std::vector<strategy::Layout> layouts = strategy::enumerate_layouts(model, world, batch);
  // The table ranks its --top rows exactly (the rest by their floors, which is much faster at many
  // ranks); --list (what the validation reads) and the chart, every layout.
  const bool every = list || !svg.empty();
  const std::vector<strategy::Prediction> ranked =
      strategy::rank_layouts(model, layouts, cluster, settings, every ? SIZE_MAX : static_cast<size_t>(std::max(top, 1)));
  if (list) {
    for (const strategy::Prediction& p : ranked) {
      std::printf("%s\t%s\t%d\t%.4f\t%llu\t%llu\t%d\n", strategy::layout_key(p.layout).c_str(),
                  gpt.empty() ? "-" : train_flags(p.layout).c_str(), p.layout.world(), 1e3 * p.time.step(),
                  static_cast<unsigned long long>(p.memory.device()),
                  static_cast<unsigned long long>(p.largest_activations), p.fits ? 1 : 0);
    }
    return 0;
  }
  std::printf("%s on %d ranks of %s (%s per device), global batch %d; %zu layouts\n", model.name().c_str(), world,
              cluster.name.c_str(), memory::format_bytes(static_cast<uint64_t>(cluster.device_memory)).c_str(), batch,
              ranked.size());
  std::printf("%s", strategy::table(ranked, static_cast<size_t>(top)).c_str());
  std::printf("choice: %s\n", strategy::reason(ranked).c_str());
  if (!svg.empty()) {
    std::ofstream(svg) << strategy::frontier_svg(ranked, cluster.device_memory,
                                                 fmt::format("{}: predicted step time against memory per rank, {} ranks",
                                                             model.name(), world));
    std::printf("chart: %s\n", svg.c_str());
  }
  return 0;
}

}  // namespace zero
