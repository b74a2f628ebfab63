#pragma once
// A decoder-only transformer described in JSON, for the strategy planner (zero_plan --auto --model
// FILE): what a model's checkpoint cannot say and the planner needs. A safetensors header gives names
// and shapes, but not how each tensor splits under tensor parallelism, which tensors a pipeline's
// first and last stage hold, the collectives of the tp regions, the compute per token, or the
// activations a micro-batch keeps. The description gives these for three layers, the Megatron-LM
// shape every GPT, LLaMA or Mistral has:
//
//   embedding            on the first pipeline stage (unit 0)
//   block x blocks       cut into the pipeline's stages as evenly as they go, the first stages
//                        taking one more (units 1 .. blocks); what recompute runs again
//   head                 the final norm, the output layer and the loss, on the last stage (unit
//                        blocks + 1); a tensor "tied_to" an embedding tensor is that tensor (its
//                        copy, marked tied, on the last stage when the pipeline has several)
//
// A layer (each field optional):
//   "tensors":         [{"name", "shape" (whole, unsplit), "split", "dtype" (fp32, bf16 or fp16),
//                      "no_decay", "tied_to"}]
//                      split: "replicated" (the default; under sequence parallelism its gradient is
//                      a partial sum over tp), "column" (dim 0: a column-parallel [out, in] weight
//                      and its bias), "row" (dim 1), "vocab" (dim 0 padded to a multiple of tp, as
//                      Megatron pads its vocabulary), or {"dim": d, "blocks": k} (parallel/tensor's
//                      fused blocks, q|k|v along one dimension); dtype: the tensor kept in it
//                      beside the model's (fp32 norms in a bf16 model), also where stage 3 gathers
//                      the others in a narrower param_dtype
//   "flops_per_token": {"forward", "backward_input", "backward_weight"} at tp 1 (divided by tp);
//                      without it, 2 x the elements of the layer's matrices on one tp rank (tensors
//                      of two or more dimensions, a tied one included) for each pass, and none for
//                      the embedding (lookups)
//   "tp":              {"enter": n, "leave": n, "all_reduces_per_token": [bytes, ...]}: Megatron's f
//                      and g. Entering a region is the identity forward and an all-reduce of the
//                      residual stream backward, leaving one the converse; under sequence
//                      parallelism an all-gather and a reduce-scatter. The extra forward
//                      all-reduces are the loss's (a vocabulary-parallel cross entropy's three).
//   "activations":     what a micro-batch holds from its forward to its backward, a list of terms
//   "weight_reads":    of those, what a split backward's weight part reads (each linear layer's
//                      input): the input part frees the rest. Absent: all of them (it frees nothing)
//   "weight_work":     what a split backward's input part adds for its weight part (the output
//                      gradients, column sums), held until the weight part
//     term:            {"per_token": bytes | "per_micro_batch": bytes, "split": "none" | "tp" |
//                      "sequence" | "vocab", "when": "any" | "tp1" | "tp>1"}: "tp" divided by tp,
//                      "sequence" divided by tp under sequence parallelism (the residual stream's
//                      rows), "vocab" as the vocabulary splits (a rank's rows of it padded to a
//                      multiple of tp: the logits); "when" a term the layer holds only unsplit or
//                      only split
// Top level: "name", "kernels" (optional: the prefix of the model's calibrated kernel times in a
// cluster file, parallel/strategy/kernel_times.h; where the cluster has them they replace the
// FLOPs, and a layer timed with its tp collectives adds none besides), "sequence_length", "hidden" (the residual stream's width: the tp collectives,
// the stages' sends, the input recompute keeps), "heads" (tp must divide them; and "kv_heads", the
// key and value heads of grouped-query attention, when fewer), "blocks",
// "activation_dtype" ("fp32", "bf16" or "fp16"; default fp32), "embedding", "block", "head", and a
// "comment" the planner does not read.
//
// The memory of the parameters, gradients, optimizer state and buffers is the engine's plan of the
// tensors on the meta device, exact whatever the description; the activations are what the
// description says. Compute comes from the calibrated kernels where the description names them and
// the cluster has them, else from the FLOPs at the cluster's peak rate times its matmul efficiency.
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "base/dtype.h"
#include "parallel/strategy/model_costs.h"
#include "zero/engine_options.h"
#include "zero/tp_placement.h"

namespace zero::strategy {

struct DescribedTensor {
  std::string name;
  std::vector<int64_t> shape;  // whole
  TpPlacement tp;
  bool vocab = false;  // split(0) with dim 0 padded to a multiple of tp
  std::optional<DType> dtype;
  bool no_decay = false;  // optimizer group 1
  std::string tied_to;    // a head tensor that is this embedding tensor
};

// Bytes a micro-batch holds.
struct ActivationTerm {
  enum class Per { kToken, kMicroBatch };
  enum class Split { kNone, kTp, kSequence, kVocab };
  enum class When { kAny, kTp1, kAboveTp1 };
  Per per = Per::kToken;
  double bytes = 0;
  Split split = Split::kNone;
  When when = When::kAny;
};

struct DescribedLayer {
  std::vector<DescribedTensor> tensors;
  std::optional<double> forward, backward_input, backward_weight;  // FLOPs per token at tp 1
  int enter = 0, leave = 0;
  std::vector<double> all_reduces_per_token;
  std::vector<ActivationTerm> activations, weight_work;
  std::optional<std::vector<ActivationTerm>> weight_reads;  // absent: the activations
};

struct ModelDescription {
  std::string name;
  std::string kernels;  // the calibrated kernels' key prefix; empty: FLOPs only
  int sequence_length = 0, hidden = 0, heads = 0, kv_heads = 0, blocks = 0;
  DType activation_dtype = DType::kFloat32;
  DescribedLayer embedding, block, head;
};

// InvalidArgument naming `source` and the field ("block.tensors[2].split: ...") for a missing,
// mistyped, negative, too large or unknown field, a tied_to naming no embedding tensor (or one tied
// twice), a duplicate name, a "vocab" term with no vocabulary.
ModelDescription parse_model_description(std::string_view text, const std::string& source);
ModelDescription load_model_description(const std::string& path);  // IoError when unreadable
// The rows of the description's vocabulary-split tensor (0 when it has none).
int64_t vocabulary(const ModelDescription& description);
// The JSON above; parse_model_description reads it back to the same description. `comment` goes in
// as the description's comment when not empty.
std::string to_json(const ModelDescription& description, const std::string& comment = "");

// A described model puts its decayed tensors in optimizer group 0 and its no_decay ones in group 1
// (the examples' models do the same), so a single group in `o` (a DeepSpeed file has one) gets the
// second as a copy without weight decay; any count other than one or two is refused naming
// `source` and `program`.
void two_optimizer_groups(EngineOptions& o, const std::string& source, const char* program);

class DescribedModel : public ModelCosts {
 public:
  // `dtype`: the parameters' (a tensor's "dtype" overrides it).
  DescribedModel(ModelDescription description, DType dtype);
  std::string name() const override { return description_.name; }
  int sequence_length() const override { return description_.sequence_length; }
  std::string unsupported(const Layout& layout, int global_batch) const override;
  StageCosts stage(const Layout& layout, int stage, int global_batch, const Cluster& cluster) const override;
  const ModelDescription& description() const { return description_; }

  // One pipeline stage's tensors and scope schedule for the engine's plan: blocks [first_block,
  // end_block), the embedding where `first`, the head where `last` (a cut of the user's choosing;
  // stage() cuts evenly), its tied copies marked when the pipeline has several stages.
  struct StagePart {
    int tp = 1;
    bool sequence_parallel = false;
    int first_block = 0, end_block = 0;
    bool first = true, last = true;
    int stages = 1;
  };
  plan::ModelSpec stage_model(const StagePart& part) const;

 private:
  std::shared_ptr<const plan::ModelSpec> spec(int tp, bool sequence_parallel, int stages, int stage) const;
  ModelDescription description_;
  DType dtype_;
  // The engine's tensors by (tp, sp, virtual stages, stage), shared by the layouts that differ in
  // the rest (used from one thread, as rank_layouts does).
  mutable std::mutex specs_mutex_;  // a search's threads share the model
  mutable std::map<std::tuple<int, bool, int, int>, std::shared_ptr<const plan::ModelSpec>> specs_;
};

}  // namespace zero::strategy
