// zero_plan: the per-rank memory the engine will allocate, and the bytes each rank sends per step,
// for a model, before running it. It is the engine itself on a meta device (zero/plan/engine_plan.h),
// so it needs no memory for the model and no other ranks:
//
//   bazel-bin/tools/plan/zero_plan --gpt 48,1600,25,50257,1024 --stage 3 --world 64 --offload
//   bazel-bin/tools/plan/zero_plan --params-m 7000 --tensors 32 --stages 0,1,2,3 --world 1,8,64
//   bazel-bin/tools/plan/zero_plan --safetensors model.safetensors --stage 2 --world 8
//   bazel-bin/tools/plan/zero_plan --shapes shapes.txt ...      (lines "name 768x3072 [unit]")
//
// One stage and world size: the full memory report and the traffic by collective. Lists (--stages,
// --world): one row each. Options: --dtype bf16|fp16|fp32 (the model's; a safetensors file gives its
// own), --param-dtype bf16|fp16 (stage 3 rows: fp32 parameters gathered in that dtype,
// EngineOptions.param_dtype), --fp32-norms (a --gpt model's LayerNorms and biases in fp32 beside
// its 16-bit matrices), --whole-tensors (each tensor owned whole by one rank: the padding
// it costs), --optimizer adamw (muon: a described model's block matrices in Muon, the rest in
// AdamW), --offload, --offload-params, --bucket-m (elements), --micro-steps,
// --prefetch-mb, --max-live-mb, --persist-kb, --rank (ranks differ by padding only), --cuda (a GPU's
// memory: no communicator scratch accounted). With --gpt, --tp T (--world then counts the
// data-parallel ranks; each holds one tp rank's parts) and --sequence-parallel; --pp P plans pipeline
// stage --pp-stage K (default 0) of P even stages (--pp-layers a,b,... for others), its engine running
// --micro-batches M (default 2P) backward passes per unit and step.
#include <cstdio>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "base/check.h"
#include "parallel/engine_comms.h"
#include "parallel/pipeline/stage_cut.h"
#include "parallel/strategy/gpt2.h"
#include "tools/cli/flags.h"
#include "tools/plan/report_columns.h"
#include "tools/plan/zero_plan_auto.h"
#include "zero/checkpoint/file_io.h"
#include "zero/plan/engine_plan.h"

namespace zero {
namespace {

// "bf16", or "bf16 (12 tensors fp32)" for a model of several dtypes.
std::string dtypes_of(const plan::ModelSpec& model) {
  std::map<DType, int> others;
  for (const plan::TensorSpec& t : model.tensors) {
    if (model.dtype_of(t) != model.dtype) ++others[model.dtype_of(t)];
  }
  std::string s = dtype_name(model.dtype);
  for (const auto& [d, n] : others) s += fmt::format(" ({} tensors {})", n, dtype_name(d));
  return s;
}

plan::ModelSpec read_model(cli::Flags& flags, int tp, bool sequence_parallel, int pp, int pp_stage,
                           const std::vector<int>& pp_layers) {
  const std::string gpt = flags.get("gpt", ""), shapes = flags.get("shapes", ""), st = flags.get("safetensors", "");
  if ((tp > 1 || sequence_parallel || pp > 1) && gpt.empty()) {
    ZERO_THROW(InvalidArgument, "--tp, --sequence-parallel and --pp split a --gpt model (its placements are the GPT's)");
  }
  const double millions = flags.get_double("params-m", 0);
  const int tensors = flags.get_int("tensors", 16);
  const DType dtype = parse_dtype(flags.get("dtype", "bf16"));
  const bool fp32_norms = flags.get_bool("fp32-norms", false);
  if (fp32_norms && gpt.empty()) {
    ZERO_THROW(InvalidArgument, "--fp32-norms keeps a --gpt model's LayerNorms and biases in fp32: it needs --gpt");
  }
  const int given = !gpt.empty() + !shapes.empty() + !st.empty() + (millions > 0);
  if (given != 1) ZERO_THROW(InvalidArgument, "give the model one way: --params-m, --shapes, --safetensors or --gpt");
  if (!st.empty()) return plan::model_of_safetensors(st);
  if (!shapes.empty()) return plan::model_of_shapes(read_whole_file(shapes), dtype, shapes);
  if (millions > 0) return plan::model_of_count(static_cast<uint64_t>(millions * 1e6), tensors, dtype);
  if (dtype != DType::kFloat32 && dtype != DType::kBFloat16) {
    ZERO_THROW(InvalidArgument, "--dtype: a --gpt model runs in fp32 or bf16, got {}", dtype_name(dtype));
  }
  const strategy::Gpt2Shape shape = strategy::parse_gpt2_shape(gpt);
  if (shape.n_head % tp != 0) {
    ZERO_THROW(InvalidArgument, "--tp {} does not divide the {} heads of --gpt {} (each rank holds whole heads)", tp,
               shape.n_head, gpt);
  }
  if (sequence_parallel && tp == 1) ZERO_THROW(InvalidArgument, "--sequence-parallel needs --tp above 1");
  if (pp_stage < 0 || pp_stage >= pp) ZERO_THROW(InvalidArgument, "--pp-stage {} outside [0, {})", pp_stage, pp);
  const auto [begin, end] = parallel::stage_ranges(shape.n_layer, pp, pp_layers, "--pp-layers",
                                                   fmt::format("--gpt {} has n_layer", gpt))
      [static_cast<size_t>(pp_stage)];
  const strategy::DescribedModel model(strategy::describe_gpt2(shape, fp32_norms), dtype);
  return model.stage_model({.tp = tp, .sequence_parallel = sequence_parallel, .first_block = begin, .end_block = end,
                            .first = pp_stage == 0, .last = pp_stage == pp - 1, .stages = pp});
}

double mib(uint64_t b) { return static_cast<double>(b) / (1 << 20); }

int run(int argc, char** argv) {
  cli::Flags flags(argc, argv);
  if (flags.has("auto") || flags.has("explain") || flags.has("describe")) return run_strategy(flags);
  const int tp = flags.get_int("tp", 1);
  const bool sequence_parallel = flags.get_bool("sequence-parallel", false);
  const int pp = flags.get_int("pp", 1);
  const int pp_stage = flags.get_int("pp-stage", 0);
  const int micro_batches = flags.get_int("micro-batches", 2 * pp);
  const std::vector<int> pp_layers =
      flags.has("pp-layers") ? flags.get_count_list("pp-layers", "") : std::vector<int>{};
  if (tp < 1 || pp < 1 || micro_batches < 1) {
    ZERO_THROW(InvalidArgument, "--tp {}, --pp {} and --micro-batches {} must be positive", tp, pp, micro_batches);
  }
  const plan::ModelSpec model = read_model(flags, tp, sequence_parallel, pp, pp_stage, pp_layers);
  const std::vector<int> stages = flags.get_count_list("stages", std::to_string(flags.get_int("stage", 2)));
  const std::vector<int> worlds = flags.get_count_list("world", "1");
  plan::PlanInputs in;
  in.model = model;
  in.tp = tp;
  in.pp = pp;
  in.finalizers = parallel::model_parallel_finalizers;
  // The norm's per-unit sums are sized by the largest unit count over the stages.
  for (int k = 0; k < pp && pp > 1; ++k) {
    for (const plan::TensorSpec& t : read_model(flags, tp, sequence_parallel, pp, k, pp_layers).tensors) {
      in.model_parallel_units = std::max(in.model_parallel_units, t.unit + 1);
    }
  }
  in.rank = flags.get_int("rank", 0);
  in.cuda = flags.get_bool("cuda", false);
  EngineOptions& o = in.options;
  const std::string optimizer = flags.get("optimizer", "adamw");
  int groups = 1;
  for (const plan::TensorSpec& t : model.tensors) groups = std::max(groups, t.group + 1);
  o.optimizer.groups.assign(static_cast<size_t>(groups), optim::Hyper{});
  if (optimizer == "muon") {
    // Moonlight's hybrid: the blocks' matrices in a Muon group, the rest in the model's AdamW groups.
    o.optimizer.kind = optim::OptimizerKind::kAdamW;
    o.optimizer.groups.push_back(optim::Hyper{.kind = optim::OptimizerKind::kMuon});
    for (plan::TensorSpec& t : in.model.tensors) {
      if (t.name.rfind("blocks.", 0) == 0 && t.shape.size() >= 2) t.group = groups;
    }
  } else {
    o.optimizer.kind = optim::parse_optimizer(optimizer);
  }
  std::optional<DType> param_dtype;
  if (flags.has("param-dtype")) param_dtype = parse_dtype(flags.get("param-dtype", ""));
  // EngineOptions.param_dtype is stage 3's: the rows below it plan the registered dtype.
  auto set_stage = [&](int stage) {
    o.stage = stage;
    o.param_dtype = stage == 3 ? param_dtype : std::nullopt;
    o.grad_accum_dtype = o.param_dtype.value_or(model.dtype);
  };
  o.offload.optimizer = flags.get_bool("offload", false) || flags.get_bool("offload-params", false);
  o.offload.params = flags.get_bool("offload-params", false);
  o.layout.bucket_numel = static_cast<size_t>(flags.get_double("bucket-m", 8.0) * (1 << 20));
  o.layout.whole_tensors = flags.get_bool("whole-tensors", false);
  o.micro_batches = pp > 1 ? micro_batches : flags.get_int("micro-steps", 1);
  o.prefetch_bytes = static_cast<size_t>(flags.get_double("prefetch-mb", 0) * (1 << 20));
  o.max_live_gathered_bytes = static_cast<size_t>(flags.get_double("max-live-mb", 0) * (1 << 20));
  o.param_persistence_bytes = static_cast<size_t>(flags.get_double("persist-kb", 0) * 1024);
  flags.check_all_used();

  std::printf("model: %zu tensors, %llu trainable parameters%s, %s; optimizer %s%s\n", model.tensors.size(),
              static_cast<unsigned long long>(model.numel()),
              tp > 1 || pp > 1 ? fmt::format(" per rank of pipeline stage {} of {}, tp {}{}", pp_stage, pp, tp,
                                             sequence_parallel ? ", sequence parallel" : "").c_str()
                               : "",
              dtypes_of(model).c_str(), optim::optimizer_label(o.optimizer).c_str(),
              o.offload.params ? ", optimizer and parameters offloaded" : o.offload.optimizer ? ", optimizer offloaded" : "");
  if (stages.size() == 1 && worlds.size() == 1) {
    set_stage(stages[0]);
    in.world_size = worlds[0];
    std::printf("%s", plan::plan_engine(in).table().c_str());
    return 0;
  }
  std::string head = fmt::format("{:>5} {:>5}", "stage", "N");
  for (const std::string& column : plan::report_column_names()) head += fmt::format(" {:>10}", column);
  head += fmt::format(" {:>11} {:>10} {:>12}", "total MiB", "formula", "sent/step");
  std::printf("rank %d's peak MiB by category\n%s\n", in.rank, head.c_str());
  for (int stage : stages) {
    for (int world : worlds) {
      set_stage(stage);
      in.world_size = world;
      const plan::EnginePlan p = plan::plan_engine(in);
      const std::vector<uint64_t> cols = p.memory.column_peaks();
      std::string line = fmt::format("{:>5} {:>5}", stage, world);
      for (uint64_t c : cols) line += fmt::format(" {:>10.1f}", mib(c));
      line += fmt::format(" {:>11.1f} {:>10.1f} {:>12.1f}", mib(plan::sum_of(cols)),
                          mib(p.memory.formula_predicted() + p.memory.host_predicted()), mib(p.wire_bytes()));
      std::printf("%s\n", line.c_str());
    }
  }
  return 0;
}

}  // namespace
}  // namespace zero

int main(int argc, char** argv) { return zero::cli::run_program("zero_plan", zero::run, argc, argv); }
