#pragma once
// What a model tells the strategy planner about one pipeline stage of a layout (one model chunk under
// an interleaved schedule, where a rank holds several): its tensors (for the
// engine's plan on the meta device), its compute per micro-batch, the collectives of its tensor-
// parallel regions, what it sends to the next stage and the activations it holds. A model described
// in JSON implements it (described_model.h; gpt2.h and hf_llama.h build such descriptions); any model
// can, from its own shapes.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "parallel/strategy/cluster.h"
#include "layout/layout.h"
#include "zero/plan/model_spec.h"

namespace zero::strategy {

// A collective over the tp group: all-reduce of `bytes`, all-gather into `bytes` (the whole
// output), or reduce-scatter of `bytes` (the whole input).
struct TpCollective {
  enum Kind { kAllReduce, kAllGather, kReduceScatter };
  Kind kind = kAllReduce;
  double bytes = 0;
};

// Megatron's f and g for a layer that enters `enter` tensor-parallel regions and leaves `leave`,
// over a residual stream of `bytes` (whole): entering is the identity forward and an all-reduce
// backward, leaving the converse; under sequence parallelism entering all-gathers forward and
// reduce-scatters backward, leaving the converse. Appended to `forward` and `backward`.
inline void add_region_collectives(int enter, int leave, bool sequence_parallel, double bytes,
                                   std::vector<TpCollective>& forward, std::vector<TpCollective>& backward) {
  const bool sp = sequence_parallel;
  for (int k = 0; k < enter; ++k) {
    if (sp) forward.push_back({TpCollective::kAllGather, bytes});
    backward.push_back({sp ? TpCollective::kReduceScatter : TpCollective::kAllReduce, bytes});
  }
  for (int k = 0; k < leave; ++k) {
    forward.push_back({sp ? TpCollective::kReduceScatter : TpCollective::kAllReduce, bytes});
    if (sp) backward.push_back({TpCollective::kAllGather, bytes});
  }
}

struct StageCosts {
  // The stage's tensors as tp rank 0 holds them, its scope schedule: they may depend on the mesh,
  // sequence parallelism and the stage only (the search shares plans across the rest). Shared, since
  // a search holds the stages of thousands of layouts and a model can hand out one per stage.
  std::shared_ptr<const plan::ModelSpec> engine;
  int units = 0;           // the largest unit id + 1 over the whole model (the engine's norm vector)
  // Seconds of compute per micro-batch: the forward, the backward's input part and its weight part.
  double forward = 0, backward_input = 0, backward_weight = 0;
  std::vector<TpCollective> tp_forward, tp_backward;  // per micro-batch
  double send_bytes = 0;  // to the next stage per micro-batch (and as much back)
  // Activations per micro-batch, as parallel/pipeline/held_activations.h's HeldBytes: held from its
  // forward until its backward; where the backward is split, held instead from the input part until
  // the weight part (what the weight part reads, and the gradients the input part adds for it).
  uint64_t activation_bytes = 0, weight_bytes = 0;
  // Under activation recompute: held besides while a whole backward runs (its rebuilt forward), and
  // at most while an input part runs.
  uint64_t rebuilt_bytes = 0, input_peak_bytes = 0;
};

// A search with PlanSettings::threads above 1 calls unsupported() and stage() from that many
// threads at once.
class ModelCosts {
 public:
  virtual ~ModelCosts() = default;
  virtual std::string name() const = 0;
  virtual int sequence_length() const = 0;
  // Why the model cannot run `layout` with `global_batch` sequences per step ("" when it can): tp
  // not dividing the heads, more stages than layers, the batch not dividing into micro-batches.
  virtual std::string unsupported(const Layout& layout, int global_batch) const = 0;
  // Virtual stage `stage` (0 .. pp x chunks - 1, the model cut in that many parts in order) of
  // `layout`; compute times from the cluster's calibrated kernels where it has them, else from its
  // peak rate and matmul efficiency.
  virtual StageCosts stage(const Layout& layout, int stage, int global_batch, const Cluster& cluster) const = 0;
};

}  // namespace zero::strategy
