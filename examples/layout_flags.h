#pragma once
// The training programs' layout flags, each one field of the run's layout (layout/layout.h) read by
// the layout's own field reader, so a flag, a config file's "parallel" section and the text form
// cannot disagree on a name or a rule:
//   --layout TEXT              the text form ("dp=2,tp=2,pp=2,stage=3,micro_batches=8"), over `base`
//   --dp, --tp, --pp           the mesh's sizes (dp 0, the default: what the world leaves)
//   --stage                    the ZeRO stage
//   --micro-batches            micro-batches per data-parallel rank and step (above pp 1 the pipeline's)
//   --pp-schedule, --chunks    the pipeline's schedule and chunks per rank (interleaved)
//   --sequence-parallel        the tp groups split the residual stream too
//   --recompute                activation recompute
//   --mesh-order               the mesh's order, slowest-varying first (default pp,dp,tp)
//   --shard-group-size         hybrid sharding's shard groups (the layout's shard)
//   --offload, --offload-params
// Each flag given overrides --layout's and the base's field; an error names the flag.
#include <algorithm>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>

#include "layout/layout.h"
#include "tools/cli/flags.h"
#include "zero/engine_options.h"

namespace zero::examples {

namespace layout_flags_internal {

inline constexpr std::pair<const char*, const char*> kFlags[] = {
    {"dp", "dp"},
    {"tp", "tp"},
    {"pp", "pp"},
    {"stage", "stage"},
    {"micro-batches", "micro_batches"},
    {"pp-schedule", "schedule"},
    {"chunks", "chunks"},
    {"sequence-parallel", "sequence_parallel"},
    {"recompute", "recompute"},
    {"mesh-order", "order"},
    {"shard-group-size", "shard"},
    {"offload", "offload_optimizer"},
    {"offload-params", "offload_params"},
};

// Each flag of kFlags given on the command line (of `only`, when not empty) onto `l`.
inline void read(cli::Flags& flags, Layout& l, std::initializer_list<std::string_view> only = {}) {
  for (const auto& [flag, field] : kFlags) {
    if (only.size() > 0 && std::find(only.begin(), only.end(), flag) == only.end()) continue;
    if (flags.has(flag)) set_layout_field(l, field, flags.get(flag, ""), "--" + std::string(flag));
  }
  // --offload-params keeps the optimizer offloaded too (the engine's rule), as it always has here.
  if (l.offload_params) l.offload_optimizer = true;
}

}  // namespace layout_flags_internal

inline Layout layout_from_flags(cli::Flags& flags, const Layout& base) {
  Layout l = flags.has("layout") ? parse_layout(flags.get("layout", ""), base) : base;
  layout_flags_internal::read(flags, l);
  return l;
}

// A loop without a mesh (train_mlp: data parallelism only) reads just the ZeRO flags, --stage,
// --offload and --offload-params, as the same layout fields, into `base`.
inline EngineOptions zero_flags(cli::Flags& flags, const EngineOptions& base) {
  Layout l;
  l.stage = base.stage;
  l.offload_optimizer = base.offload.optimizer;
  l.offload_params = base.offload.params;
  l.micro_batches = base.micro_batches;
  layout_flags_internal::read(flags, l, {"stage", "offload", "offload-params"});
  return engine_options(l, base);
}

}  // namespace zero::examples
