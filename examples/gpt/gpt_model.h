#pragma once
// A GPT-2-style transformer with its forward and backward written by hand (Eigen for the matrix
// products), float32: token and learned position embeddings, pre-LayerNorm blocks with causal
// multi-head self-attention (fused qkv projection) and a tanh-GELU MLP, a final LayerNorm, the output
// head tied to the token embedding, mean cross-entropy. Parameter names, shapes and layout are
// GPT-2's (PyTorch's [out, in] linear weights, row-major): see tests/data/pytorch/README.md.
//
// Tensor parallelism (Megatron-LM's split; parallel/tensor): a model made with `Gpt(full, parallel)`
// holds one tp rank's parts: the attention heads and the MLP split (c_attn and c_fc column-parallel,
// the two c_proj row-parallel with their biases added once after the sum), the tied embedding and
// the loss vocabulary-parallel (the vocabulary padded to a multiple of tp, the padding rows zero
// and never given a gradient), LayerNorms and wpe replicated. With sequence parallelism the residual
// stream between the regions holds this rank's part of every sequence (T must divide by tp), and
// the replicated parameters' gradients are partial sums the engine adds over tp.
//
// Units, for the engine's scopes: 0 = the embeddings (wte, wpe), 1 + i = block i, n_layer + 1 = the
// final LayerNorm. The tied head reads wte after the final LayerNorm, so unit 0 is entered again for
// it in forward, and its backward scope stays open from the head's backward to the embeddings' (the
// gradient of wte has two parts and is complete only after both).
//
// Pipeline parallelism (parallel/pipeline): a model made with `Gpt(full, parallel, stage)` holds one
// stage's part: a contiguous range of blocks, the embeddings on the first stage, the final LayerNorm
// and the head on the last. A last stage that is not also the first holds its own copy of wte (unit
// 0; both copies are Param::tied: the engine sums their gradients over the embedding group). Each
// micro-batch's activations are kept apart (forward_micro_batch .. backward_micro_batch, or
// weight_micro_batch where the backward is split into its input and weight parts, zero-bubble
// style), so a schedule can run several micro-batches' forwards before their backwards.
#include <Eigen/Dense>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "comm/communicator.h"
#include "parallel/tensor/tp_regions.h"
#include "parallel/tensor/vocab_parallel.h"
#include "zero/tp_placement.h"

namespace zero::examples {

// How a model is split over a tensor-parallel group; tp null: not split.
struct GptParallel {
  comm::Communicator* tp = nullptr;
  bool sequence_parallel = false;
};

// The blocks [first_layer, end_layer) of a pipeline stage, and whether it is the first (embeddings)
// and the last (final LayerNorm, head, loss).
struct GptStage {
  int first_layer = 0;
  int end_layer = 0;
  bool first = true;
  bool last = true;
};

struct GptConfig {
  int vocab_size = 256;
  int block_size = 64;  // T, the longest context
  int n_embd = 64;
  int n_head = 4;
  int n_layer = 2;
};

class Gpt {
 public:
  // A parameter's name, shape, unit and initialization (normal with std_dev when > 0, else filled),
  // in the order the model registers them: what a planner needs without the values.
  struct ParamLayout {
    std::string name;
    std::vector<int64_t> shape;
    int unit = 0;
    bool decay = false;
    float std_dev = 0, fill = 0;
  };
  static std::vector<ParamLayout> layout(const GptConfig& config);

  struct Param {
    std::string name;
    std::vector<int64_t> shape;  // of the values this model holds (its tp part)
    std::vector<float> values;
    bool decay = false;  // matrices and embeddings decay; LayerNorm parameters and biases do not
    int unit = 0;
    TpPlacement tp;      // how the part lies on tp (replicated without tensor parallelism)
    bool tied = false;   // wte where the first and the last pipeline stage each hold a copy
  };
  // What a unit is entered for: a forward, a whole backward, or (a split backward) its input or its
  // weight part (zero::BackwardPart's kInput and kWeight).
  enum class Pass { kForward, kBackward, kBackwardInput, kBackwardWeight };
  // Where parameters and gradients are while a unit runs (as examples::Mlp::Access): by default the
  // model's own storage and gradient buffers; an engine's loop opens unit scopes in enter/leave.
  struct Access {
    std::function<void(int unit, Pass pass)> enter = [](int, Pass) {};
    std::function<void(int unit, Pass pass)> leave = [](int, Pass) {};
    std::function<const float*(size_t param)> param;  // empty: params()[i].values
    std::function<float*(size_t param)> grad;         // where backward adds (+=) parameter i's gradient
  };

  // GPT-2's initialisation from `seed`: weights N(0, 0.02), the residual projections N(0, 0.02 /
  // sqrt(2 n_layer)), biases 0, LayerNorm 1 and 0.
  Gpt(const GptConfig& config, uint64_t seed);
  // `full`'s tensor-parallel part for this rank of parallel.tp (which must outlive the model). Throws
  // InvalidArgument naming n_head and tp when tp does not divide the heads.
  Gpt(const Gpt& full, const GptParallel& parallel);
  // `full`'s part for pipeline stage `stage` (and, with parallel.tp, this rank's tensor-parallel
  // part of it). Throws InvalidArgument naming the layers when the range is empty of everything
  // (no block, not first, not last) or outside [0, n_layer].
  Gpt(const Gpt& full, const GptParallel& parallel, const GptStage& stage);
  // Whether pipeline stage `stage` holds parameter `index` of layout(config) (wte on the first and
  // the last stage, wpe on the first, the blocks of its range, ln_f on the last).
  static bool holds(const GptConfig& config, const GptStage& stage, size_t index);
  // Each parameter's placement on tp (`sequence_parallel`: replicated ones have partial gradients).
  static TpPlacement placement(const std::string& name, bool sequence_parallel);

  const GptConfig& config() const { return config_; }
  const GptStage& stage() const { return stage_; }
  std::vector<Param>& params() { return params_; }
  const std::vector<Param>& params() const { return params_; }
  size_t num_params() const;
  int num_units() const { return config_.n_layer + 2; }  // of the whole model
  std::vector<int> units() const;                       // this model's, in registration order
  const GptParallel& parallel() const { return parallel_; }
  int tp_size() const { return parallel_.tp ? parallel_.tp->size() : 1; }
  int tp_rank() const { return parallel_.tp ? parallel_.tp->rank() : 0; }
  // This rank's rows of the (padded) vocabulary: [0, vocab_size) without tensor parallelism.
  const parallel::VocabRange& vocab_range() const { return vocab_; }

  // Mean cross-entropy of predicting targets[b][t] from tokens[b][0..t]; `tokens` and `targets` are
  // B x T row-major, T <= block_size. Keeps the activations for backward. (The whole model: micro-batch 0.)
  float forward(const std::vector<int>& tokens, const std::vector<int>& targets, int B, int T, const Access& access);
  // Gradients of the mean loss (times loss_scale), unit by unit from the head, added (+=) into
  // access.grad(i).
  void backward(float loss_scale, const Access& access);
  // The next-token logits at the last position of `context` (at most block_size tokens), no
  // activations kept: for sampling.
  std::vector<float> next_logits(const std::vector<int>& context, const Access& access);

  // A pipeline stage's part of micro-batch `mb` (parallel/pipeline/runner.h's stage functions).
  // forward: the first stage embeds `tokens`, the others read `input` (the previous stage's output,
  // activation_numel(B, T) floats); the last stage returns the micro-batch's mean loss (targets), the
  // others fill `output` and return 0. The activations are kept until mb's backward (and weight pass).
  float forward_micro_batch(int mb, const std::vector<int>& tokens, const std::vector<int>& targets, int B, int T,
                            const float* input, std::vector<float>* output, const Access& access);
  // backward: from the loss (times loss_scale) on the last stage, from `grad_output` (the next
  // stage's input gradient) on the others; fills `grad_input` except on the first stage. With
  // `with_weight` false only the input gradient is computed (units entered as kBackwardInput); the
  // parameter gradients wait for weight_micro_batch(mb), which enters each unit once as
  // kBackwardWeight and adds exactly what the whole backward would have, in the same order.
  void backward_micro_batch(int mb, float loss_scale, const float* grad_output, std::vector<float>* grad_input,
                            bool with_weight, const Access& access);
  void weight_micro_batch(int mb, const Access& access);
  // Drops mb's activations (after a forward-only pass: validation, sampling).
  void forget(int mb) { acts_.erase(mb); }
  // The next-token log-probabilities at position T-1 of micro-batch mb's first sequence (last stage,
  // after its forward): for sampling through a pipeline.
  std::vector<float> last_position_logits(int mb, const Access& access);
  // Elements of the activation a stage passes on for a B x T micro-batch (this rank's rows of the
  // residual stream: B*T/tp of them under sequence parallelism).
  size_t activation_numel(int B, int T) const;
  // Bytes of activations kept for the micro-batches in flight (forward done, backward or weight pass
  // not yet), now and at most since the last reset_peak_activation_bytes().
  size_t activation_bytes() const;
  size_t peak_activation_bytes() const { return peak_activation_bytes_; }
  void reset_peak_activation_bytes() { peak_activation_bytes_ = activation_bytes(); }
  // Activation recompute (checkpointing): after its forward a block keeps only its input, and its
  // backward starts by running its forward again inside the unit's backward scope, where the engine
  // holds its parameters (gathered at stage 3, as for the backward itself). The same bits: the
  // forward reads the same input and parameters again. A whole backward drops the rebuilt block
  // after its backward; a split one keeps it for the weight part, which reads it. The blocks only:
  // the embeddings and the head keep what they keep.
  void set_recompute(bool on) { recompute_ = on; }
  bool recompute() const { return recompute_; }

  // What one B x T micro-batch holds on a stage of `config` cut by `stage` at tensor-parallel size
  // `tp` (1: no tp communicator, as train_gpt builds it; sequence_parallel: sp), in the bytes
  // activation_bytes() counts, so that a planner can replay a schedule without running the model
  // (parallel/pipeline/held_activations.h's HeldBytes, field for field):
  // `forward` from the end of its forward until its backward. A split backward's input part
  // (with_weight false) keeps only what the weight part reads, `weight`, until weight_micro_batch:
  // each linear layer's input (h1, att_y, h2, the GELU's output; the head's hf) and its output
  // gradient, the biases' and LayerNorms' column sums (computed in the input part, C floats each),
  // and the first stage's embedding gradients; the rest (q|k|v, the MLP's product, the attention
  // probabilities, the LayerNorms' normalized inputs, the softmax) is freed. Nothing is held after
  // the weight part, after a whole backward, or after forget. A stage's bytes are the sum over the
  // micro-batches in flight, and peak_activation_bytes() their largest sum at the end of a forward
  // or an input part, or while a recompute rebuilds a block. Exact: the same shapes
  // forward_micro_batch and backward_micro_batch allocate. Not counted (by either): a pass's
  // temporaries, the LayerNorms' rstd (rows held per LayerNorm), and under tensor parallelism the
  // vocab-parallel loss's softmax (B*T x V'/tp floats, which probs_out counts at tp 1).
  // With `recompute` (set_recompute): a block holds its input after the forward; a whole backward
  // holds one rebuilt block at a time (`rebuilt`, on top of what is held when it starts); an input
  // part rebuilds each block, keeps what its weight part reads and drops the rest with the input
  // (`weight` as without recompute), so while it runs it holds at most `input_peak` more than when
  // it began (at the last block's rebuild). Throws InvalidArgument, as the model would, when tp does
  // not divide n_head or (sp) T.
  struct MicroBatchBytes {
    size_t forward = 0;     // after the forward, until the backward
    size_t weight = 0;      // after a split backward's input part, until the weight part
    size_t rebuilt = 0;     // recompute: held besides while a whole backward runs a block
    size_t input_peak = 0;  // recompute: held besides (at most) while an input part runs
  };
  static MicroBatchBytes micro_batch_bytes(const GptConfig& config, const GptStage& stage, int tp,
                                           bool sequence_parallel, int B, int T, bool recompute = false);

 private:
  using Matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  struct LayerNormCache {
    Matrix xhat;
    Eigen::VectorXf rstd;
  };
  struct BlockCache {
    Matrix input;  // the block's input, kept alone under recompute
    // Recompute: everything but the input dropped (rebuilt by the backward).
    void keep_input_only() { *this = BlockCache{.input = std::move(input)}; }
    // After a split backward's input part: the four linear layers' inputs, which the weight part
    // reads (the objects stay, so the weight work's pointers to them hold).
    void keep_for_weight() {
      *this = BlockCache{.h1 = std::move(h1), .att_y = std::move(att_y), .h2 = std::move(h2), .gelu = std::move(gelu)};
    }
    Matrix h1, qkv, att_y, h2, fc, gelu;  // h1, h2: the layers' whole inputs (gathered under sp)
    LayerNormCache ln1, ln2;
    std::vector<Matrix> probs;  // per (b, head): T x T
  };
  // Parameter indices in this model (a stage holds a subset of the full model's, in its order).
  size_t local(size_t full_index) const;
  size_t p_wte() const { return local(0); }
  size_t p_wpe() const { return local(1); }
  size_t p_block(int layer, int k) const { return local(2 + static_cast<size_t>(layer) * 12 + static_cast<size_t>(k)); }
  size_t p_lnf(int k) const { return local(2 + static_cast<size_t>(config_.n_layer) * 12 + static_cast<size_t>(k)); }
  const float* value(const Access& a, size_t i) const { return a.param ? a.param(i) : params_[i].values.data(); }
  // The tensor-parallel regions (identities without tp): a replicated (or sequence-split)
  // activation of `rows` rows entering a column-parallel layer, and a row-parallel layer's partial
  // output leaving one, with their backward forms.
  parallel::SequenceShape sequence_shape(Eigen::Index cols) const;  // [B, T, cols]
  Matrix enter_region(const Matrix& x) const;
  Matrix enter_region_backward(Matrix&& dx_full) const;
  Matrix leave_region(Matrix&& partial) const;
  Matrix leave_region_backward(const Matrix& dy) const;
  int rows_held() const;  // rows of the residual stream this rank holds: B*T, or B*T/tp under sp
  int position_of_row(int row, int T) const;  // the sequence position of a held row of the residual stream
  void embed(const std::vector<int>& tokens, const Access& access, Matrix& x) const;
  void embed_backward(const Matrix& dx, const Access& access);
  float head(const Access& access);
  Matrix head_backward(float loss_scale, const Access& access);
  // One micro-batch's activations (and, in a split backward, its weight-gradient work).
  struct Activations {
    int B = 0, T = 0;
    std::vector<int> tokens, targets;
    std::vector<BlockCache> blocks;  // this stage's
    Matrix hf, probs_out;  // after ln_f (gathered under sp); softmax(logits) without tp
    LayerNormCache lnf;
    parallel::VocabParallelCrossEntropy loss;  // the head under tensor parallelism
    // A split backward's parameter-gradient work, per unit in the order the units were reached.
    std::vector<std::pair<int, std::vector<std::function<void(const Access&)>>>> weight_work;
    size_t weight_work_bytes = 0;  // what that work holds (the output gradients it needs)
    size_t bytes() const;
  };
  // Block l's forward from x (updated to the block's output), filling k from the micro-batch cur_.
  void block_forward(int l, Matrix& x, BlockCache& k, const Access& access);
  Activations& begin_micro_batch(int mb, const std::vector<int>& tokens, const std::vector<int>& targets, int B, int T);
  // Runs `work` now (a whole backward) or keeps it for weight_micro_batch (a split one).
  void weight_grad(int unit, std::function<void(const Access&)> work, const Access& access, size_t bytes);
  Pass backward_pass() const { return with_weight_ ? Pass::kBackward : Pass::kBackwardInput; }
  void note_activation_bytes();

  GptConfig config_;
  GptParallel parallel_;
  GptStage stage_;
  parallel::VocabRange vocab_;
  std::vector<Param> params_;
  std::vector<int64_t> local_;  // full-model parameter index -> this model's (-1: another stage's)
  std::map<int, Activations> acts_;  // by micro-batch
  // The micro-batch being computed, and whether its backward includes the weight part.
  Activations* cur_ = nullptr;
  bool with_weight_ = true;
  bool recompute_ = false;
  size_t peak_activation_bytes_ = 0;
};

// The dtypes one GPT parameter is registered and kept in, as GptScopes registers them and the
// planner's model (gpt_model_spec) mirrors them: `dtype` (fp32 or bf16), except that with
// `fp32_norms` the LayerNorm weights and biases (the parameters without decay) are registered fp32
// and kept fp32 over EngineOptions.param_dtype (ParamSpec.param_dtype).
struct GptParamDtypes {
  DType registered = DType::kFloat32;
  std::optional<DType> param_dtype;
};
inline GptParamDtypes gpt_param_dtypes(bool decay, DType dtype, bool fp32_norms) {
  if (fp32_norms && !decay) return {DType::kFloat32, DType::kFloat32};
  return {dtype, std::nullopt};
}

}  // namespace zero::examples
