#include "tools/plan/zero_plan_auto.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "base/check.h"
#include "parallel/strategy/chart.h"
#include "parallel/strategy/cluster.h"
#include "parallel/strategy/described_model.h"
#include "parallel/strategy/gpt2.h"
#include "parallel/strategy/hf_llama.h"
#include "parallel/strategy/megatron_gpt.h"
#include "parallel/strategy/predict.h"
#include "zero/config/engine_config.h"

namespace zero {
namespace {

// The engine options the search plans with: train_gpt's (AdamW, weight decay on group 0 and none on
// group 1, a description's no_decay tensors), or a --config file's (its optimizer, dtypes, buckets,
// windows), in two groups. The stage, offload and micro-batches are each layout's.
EngineOptions base_options(const std::optional<EngineConfig>& file, DType dtype) {
  if (!file) {
    EngineOptions o = strategy::gpt2_engine_options(3e-3f);  // train_gpt's learning rate
    o.grad_accum_dtype = dtype;
    return o;
  }
  if (file->layout.shard != 0) {
    ZERO_THROW(InvalidArgument, "{}: parallel.shard: the planner shards over every data-parallel rank "
                                "(hybrid sharding is not searched); leave it out", file->source);
  }
  EngineOptions o = file->engine;
  strategy::two_optimizer_groups(o, file->source, "zero_plan");
  return o;
}

// The config a run of layout `l` reads (docs/config.md): the planned engine options, the model's
// dtype, the global batch and the layout; a --config file's other keys (log interval) kept.
EngineConfig layout_config(const Layout& l, const EngineOptions& base, int devices_per_node, DType dtype, int batch,
                           const std::optional<EngineConfig>& file) {
  EngineConfig c = file.value_or(EngineConfig{});
  c.engine = strategy::planned_options(l, base, devices_per_node);
  c.model_dtype = dtype;
  c.loop.global_batch_size = batch;
  c.loop.micro_batch_size.reset();  // follows from the batch and the layout
  c.layout = l;
  return c;
}

void write_config(const std::string& path, const EngineConfig& c, const Layout& l) {
  std::ofstream out(path);
  out << to_native_json(c);
  out.close();
  if (!out) ZERO_THROW(IoError, "--write-config {}: cannot write it", path);
  std::printf("wrote %s: %s on %d ranks (train_gpt --config %s; a loop of its own reads it with "
              "zero::load_engine_config)\n",
              path.c_str(), layout_key(l).c_str(), l.world(), path.c_str());
}

}  // namespace

int run_strategy(cli::Flags& flags) {
  const std::string gpt = flags.get("gpt", ""), model_path = flags.get("model", ""), hf = flags.get("hf-config", "");
  const std::string megatron = flags.get("megatron", "");
  if (!gpt.empty() + !model_path.empty() + !hf.empty() + !megatron.empty() != 1) {
    ZERO_THROW(InvalidArgument,
               "--auto, --explain and --describe plan one model: --gpt L,C,H[,V,T], --model FILE (a model "
               "description) or --hf-config FILE (a LLaMA-family HuggingFace config.json); or, beside published runs, "
               "--megatron L,C,H,V,T (Megatron-LM's GPT as its papers count it)");
  }
  const bool has_seq_len = flags.has("seq-len");
  const int seq_len = flags.get_int("seq-len", 0);
  if (has_seq_len && (seq_len < 1 || hf.empty())) {
    ZERO_THROW(InvalidArgument, "--seq-len {}: the sequence length of a --hf-config model, positive", seq_len);
  }
  std::optional<strategy::ModelDescription> description;
  if (!gpt.empty()) description = strategy::describe_gpt2(strategy::parse_gpt2_shape(gpt));
  if (!model_path.empty()) description = strategy::load_model_description(model_path);
  if (!hf.empty()) description = strategy::load_llama_description(hf, seq_len);
  if (!megatron.empty()) {
    // All five: a published run's vocabulary and sequence, not the example GPT's defaults.
    if (std::count(megatron.begin(), megatron.end(), ',') != 4) {
      ZERO_THROW(InvalidArgument, "--megatron '{}': expected L,C,H,V,T (layers, hidden, heads, vocabulary, sequence)",
                 megatron);
    }
    description = strategy::describe_megatron_gpt(strategy::parse_gpt2_shape(megatron, "--megatron"));
  }
  if (flags.get_bool("describe", false)) {
    flags.check_all_used();
    std::printf("%s", strategy::to_json(*description).c_str());
    return 0;
  }
  const std::string config_path = flags.get("config", "");
  std::optional<EngineConfig> file;
  if (!config_path.empty()) file = load_engine_config(config_path);
  const std::string write_path = flags.get("write-config", "");
  const std::string cluster_path = flags.get("cluster", "");
  if (cluster_path.empty()) ZERO_THROW(InvalidArgument, "--auto and --explain need --cluster FILE (a cluster description)");
  const strategy::Cluster cluster = strategy::load_cluster(cluster_path);
  const int batch = flags.get_int("batch", file && file->loop.global_batch_size ? *file->loop.global_batch_size : 0);
  if (batch < 1) ZERO_THROW(InvalidArgument, "--batch (sequences per step) must be positive, got {}", batch);
  const int world = flags.get_int("world", cluster.devices());
  if (world < 1) ZERO_THROW(InvalidArgument, "--world must be positive, got {}", world);
  // The parameters' dtype: train_gpt's fp32 for the GPT, bf16 for a described one (--model, --hf-config).
  const DType dtype = parse_dtype(
      flags.get("dtype", file && file->model_dtype ? dtype_name(*file->model_dtype) : gpt.empty() ? "bf16" : "fp32"));
  const int top = flags.get_int("top", 20);
  const std::string svg = flags.get("svg", "");
  const bool list = flags.get_bool("list", false);
  const std::string explain_text = flags.get("explain", "");
  // --tp N, --pp N: only the layouts of that degree (a published run's, to set beside the choice).
  const int only_tp = flags.get_int("tp", 0), only_pp = flags.get_int("pp", 0);
  if ((flags.has("tp") && only_tp < 1) || (flags.has("pp") && only_pp < 1)) {
    ZERO_THROW(InvalidArgument, "--tp {} --pp {}: the degrees to keep are positive", only_tp, only_pp);
  }
  if ((only_tp > 0 || only_pp > 0) && !explain_text.empty()) {
    ZERO_THROW(InvalidArgument, "--tp and --pp restrict --auto's search; --explain names its own layout");
  }
  // ZeRO++ at stage 3, priced in the layouts at stage 3: quantized gathers (qwZ), secondary shards
  // in each node (hpZ), quantized gradient reduction in two hops (qgZ).
  const int quantized_bits = parse_quantized_bits(flags.get("quantized-weights", "off"), "--quantized-weights");
  const int gradient_bits = parse_quantized_bits(flags.get("quantized-gradients", "off"), "--quantized-gradients");
  const bool hpz = flags.get_bool("hpz", false);
  // --zeropp auto: each stage 3 layout also priced with ZeRO++'s combinations, the fastest kept.
  const std::string zeropp = flags.get("zeropp", "off");
  if (zeropp != "off" && zeropp != "auto") ZERO_THROW(InvalidArgument, "--zeropp takes auto or off, got '{}'", zeropp);
  if (zeropp == "auto" && (quantized_bits != 0 || gradient_bits != 0 || hpz)) {
    ZERO_THROW(InvalidArgument, "--zeropp auto chooses qwZ, hpZ and qgZ itself: leave out --quantized-weights, "
               "--quantized-gradients and --hpz");
  }
  // The search's threads (default: the machine's cores) and its time limit (0: none).
  const int threads = flags.get_int("threads", static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  if (threads < 1) ZERO_THROW(InvalidArgument, "--threads must be positive, got {}", threads);
  const double time_limit = flags.get_double("time-limit", 0);
  if (!(time_limit >= 0)) ZERO_THROW(InvalidArgument, "--time-limit (seconds) must be positive, got {}", time_limit);
  if (flags.has("time-limit") && time_limit == 0) {
    ZERO_THROW(InvalidArgument, "--time-limit (seconds) must be positive, got 0 (leave it out for no limit)");
  }
  flags.get_bool("auto", false);
  flags.check_all_used();
  if (dtype != DType::kFloat32 && dtype != DType::kBFloat16 && (dtype != DType::kFloat16 || !gpt.empty())) {
    ZERO_THROW(InvalidArgument, "--dtype: the planner's models run in fp32, bf16 or (described ones) fp16, got {}{}",
               dtype_name(dtype), dtype == DType::kFloat16 ? " for --gpt (train_gpt runs fp32 or bf16)" : "");
  }
  if (!write_path.empty() && list) ZERO_THROW(InvalidArgument, "--write-config writes one layout: not with --list");

  const strategy::DescribedModel model(std::move(*description), dtype);
  strategy::PlanSettings settings;
  settings.engine = base_options(file, dtype);
  if (quantized_bits != 0) settings.engine.quantized_weights = {.bits = quantized_bits};
  if (gradient_bits != 0) settings.engine.quantized_gradients = {.bits = gradient_bits};
  settings.engine.secondary_shard = settings.engine.secondary_shard || hpz;
  settings.global_batch = batch;
  settings.threads = threads;
  settings.time_limit = time_limit;

  if (!explain_text.empty()) {
    const Layout l = parse_layout(explain_text);
    if (l.world() != world && flags.has("world")) {
      ZERO_THROW(InvalidArgument, "--explain '{}' is {} ranks but --world is {}", explain_text, l.world(), world);
    }
    std::printf("%s on %s, global batch %d\n%s", model.name().c_str(), cluster.name.c_str(), batch,
                strategy::explain(strategy::predict(model, l, cluster, settings)).c_str());
    if (!write_path.empty()) {
      write_config(write_path, layout_config(l, settings.engine, cluster.devices_per_node, dtype, batch, file), l);
    }
    return 0;
  }
  std::vector<Layout> layouts = strategy::enumerate_layouts(model, world, batch);
  std::erase_if(layouts, [&](const Layout& l) { return (only_tp > 0 && l.tp != only_tp) || (only_pp > 0 && l.pp != only_pp); });
  if (layouts.empty() && (only_tp > 0 || only_pp > 0)) {
    ZERO_THROW(InvalidArgument, "--tp {} --pp {}: the model runs no layout of that degree on {} ranks with batch {}",
               only_tp, only_pp, world, batch);
  }
  // A search that takes a while says where it stands, on stderr (stdout stays the table or --list).
  const auto started = std::chrono::steady_clock::now();
  bool reported = false;
  settings.progress = [&](const strategy::SearchProgress& p) {
    if (p.done && !reported) return;
    reported = true;
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    std::string best = "none planned yet";
    if (p.best) best = fmt::format("best {} at {:.2f} ms", describe(*p.best), 1e3 * p.best_step);
    std::fprintf(stderr, "searching: %zu of %zu layouts examined, %zu within memory by their floors (fastest floor %.2f ms), "
                 "%zu planned, %s (%.0f s)%s\n",
                 p.examined, p.layouts, p.fitting_floors, 1e3 * p.fastest_floor, p.planned, best.c_str(), elapsed,
                 p.done ? ", done" : "");
  };
  // The table ranks its --top rows exactly (the rest by their floors, which is much faster at many
  // ranks); --list (what the validation reads) and the chart, every layout.
  const bool every = list || !svg.empty();
  const size_t exact = every ? SIZE_MAX : static_cast<size_t>(std::max(top, 1));
  const std::vector<strategy::Prediction> ranked =
      zeropp == "auto" ? strategy::rank_layouts_with_zeropp(model, layouts, cluster, settings, exact)
                       : strategy::rank_layouts(model, layouts, cluster, settings, exact);
  if (list) {
    for (const strategy::Prediction& p : ranked) {
      std::printf("%s\t%s\t%d\t%.4f\t%llu\t%llu\t%d\n", layout_key(p.layout).c_str(),
                  gpt.empty() ? "-" : ("--layout " + layout_text(p.layout)).c_str(), p.layout.world(), 1e3 * p.time.step(),
                  static_cast<unsigned long long>(p.memory.device()),
                  static_cast<unsigned long long>(p.largest_activations), p.fits ? 1 : 0);
    }
    return 0;
  }
  std::printf("%s on %d ranks of %s (%s per device, %s usable: %s for the runtime, %.0f%% of the rest for "
              "fragmentation), global batch %d; %zu layouts\n",
              model.name().c_str(), world, cluster.name.c_str(),
              memory::format_bytes(static_cast<uint64_t>(cluster.device_memory)).c_str(),
              memory::format_bytes(static_cast<uint64_t>(cluster.usable_memory())).c_str(),
              memory::format_bytes(static_cast<uint64_t>(cluster.runtime_reserve)).c_str(), 100 * cluster.fragmentation,
              batch, ranked.size());
  std::printf("%s", strategy::table(ranked, static_cast<size_t>(top)).c_str());
  std::printf("choice: %s\n", strategy::reason(ranked).c_str());
  if (!write_path.empty()) {
    if (ranked.empty() || !ranked.front().fits) {
      ZERO_THROW(InvalidArgument, "--write-config {}: no layout fits, so none was written", write_path);
    }
    const Layout& l = ranked.front().layout;
    const EngineOptions chosen = strategy::zeropp_options(settings.engine, ranked.front().zeropp);
    write_config(write_path, layout_config(l, chosen, cluster.devices_per_node, dtype, batch, file), l);
  }
  if (!svg.empty()) {
    std::ofstream(svg) << strategy::frontier_svg(ranked, cluster.usable_memory(),
                                                 fmt::format("{}: predicted step time against memory per rank, {} ranks",
                                                             model.name(), world));
    std::printf("chart: %s\n", svg.c_str());
  }
  return 0;
}

}  // namespace zero
