#pragma once
// Megatron-LM's tensor parallelism for torch::nn models (docs/libtorch.md): the region operators f
// and g as autograd functions over the library's communicator, and the modules built on them. A
// block half is
//
//   x --f--> ColumnParallelLinear --> nonlinearity --> RowParallelLinear --g--> y
//
// with f = copy_to_tp (identity forward, gradients summed over tp backward) and g = reduce_from_tp
// (outputs summed forward, identity backward), or under sequence parallelism f =
// gather_from_sequence and g = reduce_scatter_to_sequence along the sequence dimension
// (parallel/tensor/tp_regions.h is the same pair for hand-written models).
//
// Initialization: each module draws its whole tensors first, exactly as the unsplit torch::nn module
// of the same sizes would (the same calls on the same generator), and keeps its rank's slice. So a
// model built of them after torch::manual_seed(s) on every rank holds the slices of the unsplit
// model built after the same seed: the runs compare element for element (the whole tensor exists
// for a moment on every rank, as Megatron's CPU initialization does).
//
// Placements: every parameter of these modules says how it lies on the tp group (tp_placement());
// TorchEngine registers each with it, and refuses a parameter of a tensor-parallel module that it is
// told to place otherwise. The communicator must outlive the module. Collectives block until done.
#include <cstdint>
#include <optional>
#include <string>

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include "adapters/libtorch/tensor_parallel_module.h"
#include "comm/communicator.h"
#include "parallel/tensor/vocab_parallel.h"
#include "zero/tp_placement.h"

namespace zero::libtorch {

// f: a replicated activation enters a tensor-parallel region.
torch::Tensor copy_to_tp(const torch::Tensor& x, comm::Communicator& tp);
// g: the ranks' partial outputs leave the region, summed.
torch::Tensor reduce_from_tp(const torch::Tensor& x, comm::Communicator& tp);
// f under sequence parallelism: this rank's slice along `dim` in, the whole tensor (the slices in
// rank order) out; backward, the gradient summed over tp and this rank's slice kept.
torch::Tensor gather_from_sequence(const torch::Tensor& x, comm::Communicator& tp, int64_t dim);
// g under sequence parallelism: a partial whole tensor in, this rank's slice of the sum out.
torch::Tensor reduce_scatter_to_sequence(const torch::Tensor& x, comm::Communicator& tp, int64_t dim);
// The slices of the last dimension gathered in rank order (a column-parallel output made whole);
// backward keeps this rank's slice.
torch::Tensor gather_last_dim(const torch::Tensor& x, comm::Communicator& tp);

struct ParallelLinearOptions {
  bool bias = true;
  // Sequence parallelism: the input (column) or output (row) split along `sequence_dim`.
  bool sequence_parallel = false;
  int64_t sequence_dim = 1;
  // ColumnParallelLinear: gather the output's columns (a whole output on every rank).
  bool gather_output = false;
};

// y = x W^T + b with W's rows (the outputs) split over tp: weight [out / tp, in], bias [out / tp].
class ColumnParallelLinearImpl : public torch::nn::Module, public TensorParallelModule {
 public:
  // Throws InvalidArgument naming out_features and tp when tp does not divide it.
  ColumnParallelLinearImpl(int64_t in_features, int64_t out_features, comm::Communicator& tp,
                           ParallelLinearOptions options = {});
  torch::Tensor forward(const torch::Tensor& x);
  TpPlacement tp_placement(const std::string& name) const override;
  comm::Communicator& tp_group() const override { return *tp_; }

  torch::Tensor weight, bias;

 private:
  comm::Communicator* tp_;
  ParallelLinearOptions options_;
};
TORCH_MODULE(ColumnParallelLinear);

// y = x W^T + b with W's columns (the inputs) split over tp: weight [out, in / tp], bias [out] whole.
// Its input is already split (a column-parallel layer's output); the partial products are summed
// over tp (g) before the bias is added.
class RowParallelLinearImpl : public torch::nn::Module, public TensorParallelModule {
 public:
  // Throws InvalidArgument naming in_features and tp when tp does not divide it.
  RowParallelLinearImpl(int64_t in_features, int64_t out_features, comm::Communicator& tp,
                        ParallelLinearOptions options = {});
  torch::Tensor forward(const torch::Tensor& x);
  TpPlacement tp_placement(const std::string& name) const override;
  comm::Communicator& tp_group() const override { return *tp_; }

  torch::Tensor weight, bias;

 private:
  comm::Communicator* tp_;
  ParallelLinearOptions options_;
};
TORCH_MODULE(RowParallelLinear);

// torch::nn::Embedding with the vocabulary's rows split over tp (the vocabulary padded to a multiple
// of tp; the padding rows are zero and never looked up): weight [padded / tp, dim]. Each rank looks
// up the tokens it holds and the ranks' rows are summed (g, or its sequence-parallel form).
class VocabParallelEmbeddingImpl : public torch::nn::Module, public TensorParallelModule {
 public:
  VocabParallelEmbeddingImpl(int64_t vocab, int64_t dim, comm::Communicator& tp, bool sequence_parallel = false,
                             int64_t sequence_dim = 1);
  // tokens: int64, any shape; the result has a trailing dim. Throws InvalidArgument naming the
  // position of a token outside [0, vocab).
  torch::Tensor forward(const torch::Tensor& tokens);
  TpPlacement tp_placement(const std::string& name) const override;
  comm::Communicator& tp_group() const override { return *tp_; }
  const parallel::VocabRange& range() const { return range_; }

  torch::Tensor weight;

 private:
  comm::Communicator* tp_;
  parallel::VocabRange range_;
  bool sequence_parallel_;
  int64_t sequence_dim_;
};
TORCH_MODULE(VocabParallelEmbedding);

// The mean cross-entropy of logits whose vocabulary is split over tp (local_logits [N, rows of
// `range`], targets int64 [N]), the same on every rank, without the whole logits on any rank; the
// padding columns take no part. Differentiable in local_logits (fp32 math).
torch::Tensor vocab_parallel_cross_entropy(const torch::Tensor& local_logits, const torch::Tensor& targets,
                                           const parallel::VocabRange& range, comm::Communicator& tp);

}  // namespace zero::libtorch
