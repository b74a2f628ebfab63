#pragma once
// One way to run a model on a world of ranks: the mesh (dp x tp x pp), the ZeRO stage, the
// micro-batches and the pipeline schedule, sequence parallelism, activation recompute and offload.
#include <string>

namespace zero::strategy {

struct Layout {
  int dp = 1, tp = 1, pp = 1;
  int zero_stage = 0;
  // Micro-batches per data-parallel rank and step: run one after another (accumulation) at pp 1,
  // through the schedule above.
  int micro_batches = 1;
  std::string schedule = "1f1b";  // pp > 1: "gpipe", "1f1b", "zb-h1" or "interleaved"
  // Model chunks per pipeline rank (above 1 exactly when the schedule is interleaved): rank s holds
  // virtual stages s, pp + s, 2 pp + s, ... of the model cut into pp x chunks.
  int chunks = 1;
  bool sequence_parallel = false;
  bool offload = false;  // the optimizer's master and state in host memory (stages 1-3)
  bool recompute = false;  // the blocks' forward run again in their backward (activation checkpointing)
  int world() const { return dp * tp * pp; }
  int virtual_stages() const { return pp * chunks; }
  bool operator==(const Layout&) const = default;
};

// "dp 2 x tp 2 x pp 2, stage 3, 1f1b x 4, sp, offload, recompute" (the schedule only above pp 1;
// "interleaved x 4, 2 chunks").
std::string describe(const Layout& layout);

// The form train_gpt's flags take: "dp=2,tp=2,pp=2,stage=3,m=4,schedule=1f1b,sp,offload,recompute" (any order;
// dp, tp, pp default to 1, stage to 0, m to 1; "schedule=interleaved,chunks=2"). InvalidArgument
// naming the item otherwise.
Layout parse_layout(const std::string& text);

// The same as a short key: "dp2.tp2.pp2.z3.m4.1f1b.sp.off.rc" ("...m4.interleaved.v2...").
std::string layout_key(const Layout& layout);

}  // namespace zero::strategy
