#pragma once
// The GPT as the strategy planner sees it (parallel/strategy/model_costs.h): each pipeline stage's
// tensors (gpt_plan.h), its activations per micro-batch (Gpt::micro_batch_bytes, exact), the
// collectives of its tensor-parallel regions (Megatron's f and g around attention and the MLP, the
// vocabulary-parallel embedding and loss; all-gathers and reduce-scatters under sequence
// parallelism), what it sends to the next stage, and its compute: the model's own kernels as
// calibrate_gpt timed them on this machine (Cluster::kernels, by kernel_key), else its matrix
// FLOPs at the cluster's peak rate times its matmul efficiency.
#include <map>
#include <memory>
#include <string>
#include <tuple>

#include "base/dtype.h"
#include "examples/gpt/gpt_model.h"
#include "parallel/strategy/model_costs.h"

namespace zero::examples {

// The parts of the model whose kernels are timed: one block, the embeddings (a first stage's extra
// work) and the final LayerNorm with the head and the loss (a last stage's).
enum class GptPart { kBlock, kEmbedding, kHead };
// The three passes: forward, the backward's input part, its weight part.
enum class GptPass { kForward, kInput, kWeight };
// "block", "embedding", "head" (as kernel keys spell them).
const char* gpt_part_name(GptPart part);

class GptCosts : public strategy::ModelCosts {
 public:
  GptCosts(const GptConfig& config, DType dtype) : config_(config), dtype_(dtype) {}
  std::string name() const override;
  int sequence_length() const override { return config_.block_size; }
  std::string unsupported(const Layout& layout, int global_batch) const override;
  strategy::StageCosts stage(const Layout& layout, int stage, int global_batch,
                             const strategy::Cluster& cluster) const override;

  // Sequences per micro-batch of a layout.
  static int micro_batch_size(const Layout& layout, int global_batch);
  // "gpt/L,C,H,V,T/block/b4/tp2/sp1/f": the key of one kernel's time in Cluster::kernels, compute
  // alone (the planner adds the part's tp collectives from the link). With `collectives`
  // ("...f+tp"): timed with a real tp group, its collectives included as the run meets them
  // (waits, the communicator's threads on shared cores); where the cluster has those, they are used.
  std::string kernel_key(GptPart part, GptPass pass, int batch, int tp, bool sequence_parallel,
                         bool collectives = false) const;
  // The same with the collectives, timed by `ranks` processes on a machine whose ranks share fewer
  // cores than that ("...f+tp@4"), every tp group of them running the part at once
  // (calibrate_gpt --add-tp-parts): what a layout of that many ranks meets, its waits included,
  // which do not grow with the crowding as the compute does. Where the cluster has them, such a
  // layout uses them, scaled to one rank per core: the planner slows the compute by ranks / cores
  // (or shares the cores in a pipeline's simulation) itself.
  std::string crowded_key(GptPart part, GptPass pass, int batch, int tp, bool sequence_parallel, int ranks) const;
  // The same kernel at tp 1 timed with no other rank computing ("...f+alone"): what a layout of one
  // rank meets on a machine whose ranks share the cores, the other cores idle (memory bandwidth and
  // caches its own). Where the cluster has it, a one-rank layout uses it.
  std::string alone_key(GptPart part, GptPass pass, int batch) const;
  // Matrix FLOPs of one part's pass for `batch` sequences on one tp rank.
  double flops(GptPart part, GptPass pass, int batch, int tp) const;
  const GptConfig& config() const { return config_; }

 private:
  // How the cluster has the part's three passes timed at this layout: compute alone, with their
  // collectives, or with them by as many ranks as the layout has on too few cores.
  enum class Timed { kCompute, kWithCollectives, kCrowded };
  Timed timed_as(GptPart part, int batch, const Layout& layout, const strategy::Cluster& cluster) const;
  bool measured_with_collectives(GptPart part, int batch, const Layout& layout,
                                 const strategy::Cluster& cluster) const {
    return timed_as(part, batch, layout, cluster) != Timed::kCompute;
  }
  double seconds(GptPart part, GptPass pass, int batch, const Layout& layout,
                 const strategy::Cluster& cluster) const;
  GptConfig config_;
  DType dtype_;
  // gpt_model_spec by (tp, sp, virtual stages, stage): it records the scope schedule from a small model's pass,
  // which a search over thousands of layouts would otherwise repeat for each. (A GptCosts is used
  // from one thread, as rank_layouts does.)
  mutable std::map<std::tuple<int, bool, int, int>, std::shared_ptr<const plan::ModelSpec>> specs_;
};

}  // namespace zero::examples
