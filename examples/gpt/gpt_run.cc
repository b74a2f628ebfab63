#include "examples/gpt/gpt_run.h"

#include <algorithm>
#include <cstdio>

#include "base/check.h"
#include "comm/mesh.h"
#include "examples/gpt/gpt_engine.h"
#include "examples/gpt/gpt_flags.h"
#include "examples/gpt/gpt_pipeline.h"
#include "examples/gpt/text_data.h"
#include "examples/layout_flags.h"
#include "layout/shrink.h"
#include "zero/engine.h"

namespace zero::examples {

GptRun GptRun::read(cli::Flags& flags) {
  GptRun r;
  r.config = ConfigFlag::read(flags);
  r.steps = flags.get_int("steps", 400);
  if (flags.has("batch")) r.batch = flags.get_int("batch", 16);
  r.model = gpt_config_from_flags(flags, {.block_size = 64, .n_embd = 64, .n_head = 4, .n_layer = 2});
  // The example's options without --config: stage 3 (each flag still overrides them).
  EngineOptions defaults = strategy::gpt2_engine_options(3e-3f);
  defaults.stage = 3;
  EngineOptions& opt = r.options = r.config.engine_options(flags, defaults, "train_gpt");
  r.warmup = flags.get_int("warmup", std::min(20, r.steps / 10));  // the default fits short runs
  r.min_lr_ratio = flags.get_double("min-lr-ratio", 0.1);
  r.val_every = flags.get_int("val-every", 50);
  r.val_batches = flags.get_int("val-batches", 4);
  r.corpus = flags.get("data", default_corpus());
  r.seed = flags.get_int("seed", 1);
  r.sample_tokens = flags.get_int("sample-tokens", 160);
  r.top_k = flags.get_int("top-k", 5);  // 0: greedy
  r.log_every = r.config.log_every(flags);
  r.metrics = flags.get("metrics", "");
  r.run_flags = RunFlags::read(flags);
  // The layout: a --config file's (zero_plan --write-config) or the example's, with the engine
  // options' stage, offload and micro-batches, then each layout flag. Without a file or a flag that
  // says, a pipeline runs 2 micro-batches per stage.
  const std::optional<EngineConfig>& file = r.config.config;
  Layout base = file ? file->layout : Layout{.dp = 0};
  base.stage = opt.stage;
  base.offload_optimizer = opt.offload.optimizer;
  base.offload_params = opt.offload.params;
  base.micro_batches = opt.micro_batches;
  r.layout = layout_from_flags(flags, base);
  const bool m_given = file || flags.has("micro-steps") || flags.has("micro-batches") ||
                       r.layout.micro_batches != base.micro_batches;
  if (r.layout.pp > 1 && !m_given) r.layout.micro_batches = 2 * r.layout.pp;
  r.infer_micro_batches = file && file->loop.infer_micro_batches && !flags.has("micro-steps") &&
                          r.layout.micro_batches == base.micro_batches;
  r.layout_source = file ? "the layout (" + file->source + ", then the flags)" : "the layout (the flags)";
  r.pp_layers = parse_layer_counts(flags.get("pp-layers", ""));
  r.timeline = flags.get("timeline", "");
  // A file's own settings stand unless a flag is given (they are what zero_plan planned with).
  if (flags.has("micro-batch-reduce")) opt.micro_batch_reduce = parse_micro_batch_reduce(flags.get("micro-batch-reduce", ""));
  if (flags.has("micro-batch-gather")) opt.micro_batch_gather = parse_micro_batch_gather(flags.get("micro-batch-gather", ""));
  r.dtype = parse_dtype(flags.get("dtype", r.config.model_dtype() ? dtype_name(*r.config.model_dtype()) : "fp32"));
  if (flags.has("param-dtype")) opt.param_dtype = parse_dtype(flags.get("param-dtype", ""));
  if (flags.has("reduce-dtype")) opt.reduce_dtype = parse_dtype(flags.get("reduce-dtype", ""));
  // Stage 3's quantized gathers (ZeRO++ qwZ): --quantized-weights int8|int4 (both passes, blocks of 256).
  if (flags.has("quantized-weights")) {
    opt.quantized_weights.bits = parse_quantized_bits(flags.get("quantized-weights", ""), "--quantized-weights");
  }
  // ZeRO++'s hpZ (--hpz-size N: the secondary shard within groups of N data-parallel ranks) and qgZ
  // (--quantized-gradients int8|int4, --quantized-gradients-stochastic); without --hpz-size the node
  // size comes from the launcher.
  if (flags.has("hpz-size")) {
    const int hpz = flags.get_int("hpz-size", 1);
    if (hpz < 1) ZERO_THROW(InvalidArgument, "--hpz-size must be at least 1 (1: no hpZ), got {}", hpz);
    if (hpz > 1) {
      opt.node_size = hpz;
      opt.secondary_shard = true;
    }
  }
  if (flags.has("quantized-gradients")) {
    opt.quantized_gradients.bits = parse_quantized_bits(flags.get("quantized-gradients", ""), "--quantized-gradients");
  }
  opt.quantized_gradients.stochastic = flags.get_bool("quantized-gradients-stochastic", false);
  if (flags.has("quantized-block")) {
    const int block = flags.get_int("quantized-block", 256);
    if (block < 1) ZERO_THROW(InvalidArgument, "--quantized-block must be positive, got {}", block);
    opt.quantized_weights.block = opt.quantized_gradients.block = static_cast<size_t>(block);
  }
  r.fp32_norms = flags.get_bool("fp32-norms", false);
  // --check-replicas K: the data-parallel replicas compare checksums every K steps (docs/reliability.md).
  if (flags.has("check-replicas")) opt.replica_check_every = flags.get_int("check-replicas", 0);
  const std::string faults = flags.get("fault", "");
  const int fault_rank = flags.get_int("fault-rank", 0);
  for (size_t at = 0; at < faults.size();) {
    const size_t comma = std::min(faults.find(',', at), faults.size());
    const std::string item = faults.substr(at, comma - at);
    const size_t where = item.find('@');
    Fault f{.plan = fault::parse_plan(item.substr(0, where)), .rank = fault_rank};  // refused by name before the launch
    if (where != std::string::npos) {
      const std::string target = item.substr(where + 1);
      const size_t slash = target.find('/');
      try {
        f.rank = std::stoi(target.substr(0, slash));
        if (slash != std::string::npos) f.attempt = std::stoi(target.substr(slash + 1));
      } catch (const std::exception&) {
        ZERO_THROW(InvalidArgument, "--fault '{}': expected PLAN@RANK or PLAN@RANK/ATTEMPT", item);
      }
    }
    for (const Fault& g : r.faults) {
      if (g.rank == f.rank && g.attempt == f.attempt) {
        ZERO_THROW(InvalidArgument, "--fault '{}': rank {} already has a plan in attempt {} (one per rank and attempt)",
                   item, f.rank, f.attempt);
      }
    }
    r.faults.push_back(f);
    at = comma + 1;
  }
  flags.check_all_used();
  if (r.fp32_norms && r.dtype != DType::kBFloat16 && !opt.param_dtype) {
    ZERO_THROW(InvalidArgument,
               "--fp32-norms keeps LayerNorms and biases in fp32 beside bf16 matrices: it needs --dtype bf16 or --param-dtype bf16");
  }
  if (r.dtype != DType::kFloat32 && r.dtype != DType::kBFloat16) {
    ZERO_THROW(InvalidArgument, "the GPT runs in fp32 or bf16, got {}{}", dtype_name(r.dtype),
               flags.has("dtype") ? "" : " (model_dtype of " + file->source + ")");
  }
  // A bf16 model keeps a bf16 gradient shard (2Ψ/N), and its reduced gradients are then the same
  // bits at every stage. A config file says for itself.
  if (!file) opt.grad_accum_dtype = opt.param_dtype.value_or(r.dtype);
  if (r.layout.pp == 1 && (!r.pp_layers.empty() || !r.timeline.empty() || flags.has("pp-schedule"))) {
    ZERO_THROW(InvalidArgument, "--pp-schedule, --pp-layers and --timeline need --pp above 1");
  }
  opt = engine_options(r.layout, opt);
  return r;
}

const fault::Plan* GptRun::fault_for(int rank, int attempt) const {
  for (const Fault& f : faults) {
    if (f.rank == rank && f.attempt == attempt) return &f.plan;
  }
  return nullptr;
}

Layout GptRun::at_world(int world, int first_world) {
  if (first_world > world) {
    const Layout planned = at_world(first_world);
    const int rows = global_batch(planned.dp);
    const ShrunkLayout s =
        shrink_layout(planned, rows, world, fmt::format("{} on {} of the {} ranks launched", layout_source, world, first_world));
    batch = rows;
    spares = s.spares;
    options = engine_options(s.layout, options);
    return s.layout;
  }
  Layout l = with_world(layout, world, layout_source);
  if (infer_micro_batches) {
    l.micro_batches = resolve_micro_batches(*config.config, l.dp);
    l = with_world(l, world, layout_source);  // the inferred count against the schedule's rules
    options = engine_options(l, options);
  }
  return l;
}

int GptRun::global_batch(int world) const {
  const int m = options.micro_batches;
  const int b = batch ? *batch : config.global_batch(m, world).value_or(16);
  if (b % (world * m) != 0) {
    ZERO_THROW(InvalidArgument, "--batch {} is not a multiple of {} data-parallel ranks x {} micro-batches", b, world, m);
  }
  return b;
}

}  // namespace zero::examples
