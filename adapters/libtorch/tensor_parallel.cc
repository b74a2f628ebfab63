#include "adapters/libtorch/tensor_parallel.h"

#include <torch/csrc/autograd/custom_function.h>
#include <torch/nn/functional/linear.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/utils.h>

#include <cstring>
#include <vector>

#include "base/check.h"
#include "base/error.h"

namespace zero::libtorch {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

DType comm_dtype(const torch::Tensor& t, const char* what) {
  switch (t.scalar_type()) {
    case at::kFloat: return DType::kFloat32;
    case at::kBFloat16: return DType::kBFloat16;
    case at::kHalf: return DType::kFloat16;
    default:
      ZERO_THROW(InvalidArgument, "{}: the tensor is {}; tensor-parallel regions take float, bfloat16 or half", what,
                 c10::toString(t.scalar_type()));
  }
}

// The communicator travels through the autograd context as an integer (the context holds IValues).
int64_t handle(comm::Communicator& c) { return static_cast<int64_t>(reinterpret_cast<intptr_t>(&c)); }
comm::Communicator& group_of(int64_t handle) { return *reinterpret_cast<comm::Communicator*>(static_cast<intptr_t>(handle)); }
comm::Communicator& group_of(AutogradContext* ctx) { return group_of(ctx->saved_data["tp"].toInt()); }

// `x` summed over tp (a new tensor).
torch::Tensor summed(const torch::Tensor& x, comm::Communicator& tp) {
  torch::Tensor out = x.contiguous().clone();
  tp.all_reduce(out.data_ptr(), static_cast<size_t>(out.numel()), comm_dtype(out, "all-reduce"), comm::ReduceOp::kSum)
      ->wait();
  return out;
}

int64_t checked_dim(const torch::Tensor& x, int64_t dim, const char* what) {
  if (dim < -x.dim() || dim >= x.dim()) {
    ZERO_THROW(InvalidArgument, "{}: dimension {} is out of range for a {}-dimensional tensor", what, dim, x.dim());
  }
  return dim < 0 ? dim + x.dim() : dim;
}

// The ranks' slices along `dim` concatenated in rank order.
torch::Tensor gathered(const torch::Tensor& x, comm::Communicator& tp, int64_t dim) {
  const torch::Tensor local = x.contiguous();
  std::vector<int64_t> sizes{tp.size()};
  sizes.insert(sizes.end(), local.sizes().begin(), local.sizes().end());
  torch::Tensor all = torch::empty(sizes, local.options());
  tp.all_gather(local.data_ptr(), all.data_ptr(), static_cast<size_t>(local.numel()), comm_dtype(local, "all-gather"))
      ->wait();
  return torch::cat(all.unbind(0), dim);
}

void check_divides(const torch::Tensor& x, comm::Communicator& tp, int64_t dim, const char* what) {
  if (x.size(dim) % tp.size() != 0) {
    ZERO_THROW(InvalidArgument, "{}: dimension {} has {} elements, which tp = {} does not divide", what, dim, x.size(dim),
               tp.size());
  }
}

// This rank's slice along `dim` of the sum over tp of `x`.
torch::Tensor scattered_sum(const torch::Tensor& x, comm::Communicator& tp, int64_t dim) {
  check_divides(x, tp, dim, "reduce_scatter_to_sequence");
  const torch::Tensor stacked = torch::stack(x.chunk(tp.size(), dim), 0).contiguous();
  torch::Tensor out = torch::empty(stacked.sizes().slice(1), x.options());
  tp.reduce_scatter(stacked.data_ptr(), out.data_ptr(), static_cast<size_t>(out.numel()),
                    comm_dtype(x, "reduce-scatter"), comm::ReduceOp::kSum)
      ->wait();
  return out;
}

torch::Tensor own_slice(const torch::Tensor& x, comm::Communicator& tp, int64_t dim) {
  return x.chunk(tp.size(), dim)[static_cast<size_t>(tp.rank())].contiguous();
}

struct CopyToTp : torch::autograd::Function<CopyToTp> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, int64_t tp) {
    ctx->saved_data["tp"] = tp;
    return x;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    return {summed(grad[0], group_of(ctx)), torch::Tensor()};
  }
};

struct ReduceFromTp : torch::autograd::Function<ReduceFromTp> {
  static torch::Tensor forward(AutogradContext*, const torch::Tensor& x, int64_t tp) {
    return summed(x, group_of(tp));
  }
  static variable_list backward(AutogradContext*, variable_list grad) { return {grad[0], torch::Tensor()}; }
};

struct GatherFromSequence : torch::autograd::Function<GatherFromSequence> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, int64_t tp, int64_t dim) {
    ctx->saved_data["tp"] = tp;
    ctx->saved_data["dim"] = dim;
    return gathered(x, group_of(ctx), dim);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    return {scattered_sum(grad[0], group_of(ctx), ctx->saved_data["dim"].toInt()), torch::Tensor(), torch::Tensor()};
  }
};

struct ReduceScatterToSequence : torch::autograd::Function<ReduceScatterToSequence> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, int64_t tp, int64_t dim) {
    ctx->saved_data["tp"] = tp;
    ctx->saved_data["dim"] = dim;
    return scattered_sum(x, group_of(ctx), dim);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    return {gathered(grad[0], group_of(ctx), ctx->saved_data["dim"].toInt()), torch::Tensor(), torch::Tensor()};
  }
};

struct GatherLastDim : torch::autograd::Function<GatherLastDim> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, int64_t tp) {
    ctx->saved_data["tp"] = tp;
    return gathered(x, group_of(ctx), x.dim() - 1);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    return {own_slice(grad[0], group_of(ctx), grad[0].dim() - 1), torch::Tensor()};
  }
};

// The cross-entropy's forward computes the unit-scale gradient as well (the library's kernel keeps
// the softmax for it anyway); backward scales it by the incoming gradient.
struct VocabCrossEntropy : torch::autograd::Function<VocabCrossEntropy> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& logits, const torch::Tensor& targets,
                               int64_t tp, int64_t vocab, int64_t padded, int64_t begin, int64_t end) {
    comm::Communicator& group = group_of(tp);
    const parallel::VocabRange range{.vocab = vocab, .padded = padded, .begin = begin, .end = end};
    const torch::Tensor local = logits.to(torch::kFloat).contiguous();
    const torch::Tensor t = targets.to(torch::kInt).contiguous();
    parallel::VocabParallelCrossEntropy ce;
    const float loss = ce.forward(group, range, local.data_ptr<float>(), t.data_ptr<int>(), static_cast<size_t>(local.size(0)));
    torch::Tensor unit_grad = torch::empty_like(local);
    ce.backward(1.0f, unit_grad.data_ptr<float>());
    ctx->save_for_backward({unit_grad.to(logits.scalar_type())});
    return torch::full({}, loss, torch::TensorOptions().dtype(torch::kFloat));
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    const torch::Tensor unit_grad = ctx->get_saved_variables()[0];
    return {unit_grad * grad[0].to(unit_grad.scalar_type()), torch::Tensor(), torch::Tensor(), torch::Tensor(),
            torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

void check_split(int64_t features, comm::Communicator& tp, const char* module, const char* field) {
  if (features <= 0 || features % tp.size() != 0) {
    ZERO_THROW(InvalidArgument, "{}: {} = {} must be a positive multiple of tp = {}", module, field, features, tp.size());
  }
}

[[noreturn]] void unknown_parameter(const char* module, const std::string& name) {
  ZERO_THROW(InvalidArgument, "{}: no parameter '{}'", module, name);
}

}  // namespace

torch::Tensor copy_to_tp(const torch::Tensor& x, comm::Communicator& tp) { return CopyToTp::apply(x, handle(tp)); }
torch::Tensor reduce_from_tp(const torch::Tensor& x, comm::Communicator& tp) { return ReduceFromTp::apply(x, handle(tp)); }
torch::Tensor gather_from_sequence(const torch::Tensor& x, comm::Communicator& tp, int64_t dim) {
  return GatherFromSequence::apply(x, handle(tp), checked_dim(x, dim, "gather_from_sequence"));
}
torch::Tensor reduce_scatter_to_sequence(const torch::Tensor& x, comm::Communicator& tp, int64_t dim) {
  return ReduceScatterToSequence::apply(x, handle(tp), checked_dim(x, dim, "reduce_scatter_to_sequence"));
}
torch::Tensor gather_last_dim(const torch::Tensor& x, comm::Communicator& tp) { return GatherLastDim::apply(x, handle(tp)); }

ColumnParallelLinearImpl::ColumnParallelLinearImpl(int64_t in_features, int64_t out_features, comm::Communicator& tp,
                                                   ParallelLinearOptions options)
    : tp_(&tp), options_(options) {
  check_split(out_features, tp, "ColumnParallelLinear", "out_features");
  // The unsplit layer's initialization, then this rank's rows.
  torch::nn::Linear whole(torch::nn::LinearOptions(in_features, out_features).bias(options.bias));
  torch::NoGradGuard no_grad;
  weight = register_parameter("weight", own_slice(whole->weight, tp, 0).clone());
  if (options.bias) bias = register_parameter("bias", own_slice(whole->bias, tp, 0).clone());
}

torch::Tensor ColumnParallelLinearImpl::forward(const torch::Tensor& x) {
  const torch::Tensor in = options_.sequence_parallel ? gather_from_sequence(x, *tp_, options_.sequence_dim)
                                                      : copy_to_tp(x, *tp_);
  const torch::Tensor y = torch::nn::functional::linear(in, weight, bias);
  return options_.gather_output ? gather_last_dim(y, *tp_) : y;
}

TpPlacement ColumnParallelLinearImpl::tp_placement(const std::string& name) const {
  if (name == "weight" || (name == "bias" && bias.defined())) return TpPlacement::split(0);
  unknown_parameter("ColumnParallelLinear", name);
}

RowParallelLinearImpl::RowParallelLinearImpl(int64_t in_features, int64_t out_features, comm::Communicator& tp,
                                             ParallelLinearOptions options)
    : tp_(&tp), options_(options) {
  check_split(in_features, tp, "RowParallelLinear", "in_features");
  torch::nn::Linear whole(torch::nn::LinearOptions(in_features, out_features).bias(options.bias));
  torch::NoGradGuard no_grad;
  weight = register_parameter("weight", own_slice(whole->weight, tp, 1).clone());
  if (options.bias) bias = register_parameter("bias", whole->bias.clone());
}

torch::Tensor RowParallelLinearImpl::forward(const torch::Tensor& x) {
  const torch::Tensor partial = torch::nn::functional::linear(x, weight);
  torch::Tensor y = options_.sequence_parallel ? reduce_scatter_to_sequence(partial, *tp_, options_.sequence_dim)
                                               : reduce_from_tp(partial, *tp_);
  return bias.defined() ? y + bias : y;
}

TpPlacement RowParallelLinearImpl::tp_placement(const std::string& name) const {
  if (name == "weight") return TpPlacement::split(1);
  // Under sequence parallelism the bias is added to this rank's rows only: its gradient is partial.
  if (name == "bias" && bias.defined()) {
    return options_.sequence_parallel ? TpPlacement::replicated_partial() : TpPlacement::replicated();
  }
  unknown_parameter("RowParallelLinear", name);
}

VocabParallelEmbeddingImpl::VocabParallelEmbeddingImpl(int64_t vocab, int64_t dim, comm::Communicator& tp,
                                                       bool sequence_parallel, int64_t sequence_dim)
    : tp_(&tp), range_(parallel::vocab_range(vocab, tp.rank(), tp.size())), sequence_parallel_(sequence_parallel),
      sequence_dim_(sequence_dim) {
  torch::nn::Embedding whole(vocab, dim);
  torch::NoGradGuard no_grad;
  torch::Tensor local = torch::zeros({range_.rows(), dim}, whole->weight.options());
  const int64_t real = range_.real_rows();
  if (real > 0) local.slice(0, 0, real).copy_(whole->weight.slice(0, range_.begin, range_.begin + real));
  weight = register_parameter("weight", local);
}

torch::Tensor VocabParallelEmbeddingImpl::forward(const torch::Tensor& tokens) {
  if (tokens.numel() > 0) {
    const torch::Tensor flat = tokens.reshape({-1});
    const torch::Tensor bad = ((flat < 0) | (flat >= range_.vocab)).nonzero();
    if (bad.numel() > 0) {
      const int64_t at = bad[0].item<int64_t>();
      ZERO_THROW(InvalidArgument, "VocabParallelEmbedding: token {} at position {} is outside [0, {})",
                 flat[at].item<int64_t>(), at, range_.vocab);
    }
  }
  const torch::Tensor outside = (tokens < range_.begin) | (tokens >= range_.end);
  const torch::Tensor local = (tokens - range_.begin).masked_fill(outside, 0);
  const torch::Tensor rows = torch::embedding(weight, local).masked_fill(outside.unsqueeze(-1), 0.0);
  return sequence_parallel_ ? reduce_scatter_to_sequence(rows, *tp_, sequence_dim_) : reduce_from_tp(rows, *tp_);
}

TpPlacement VocabParallelEmbeddingImpl::tp_placement(const std::string& name) const {
  if (name == "weight") return TpPlacement::split(0);
  unknown_parameter("VocabParallelEmbedding", name);
}

torch::Tensor vocab_parallel_cross_entropy(const torch::Tensor& local_logits, const torch::Tensor& targets,
                                           const parallel::VocabRange& range, comm::Communicator& tp) {
  if (local_logits.dim() != 2 || local_logits.size(1) != range.rows() || targets.numel() != local_logits.size(0)) {
    ZERO_THROW(InvalidArgument,
               "vocab_parallel_cross_entropy: logits {} and targets of {} elements; expected [N, {}] (this rank's "
               "vocabulary rows) and N targets",
               c10::str(local_logits.sizes()), targets.numel(), range.rows());
  }
  return VocabCrossEntropy::apply(local_logits, targets.reshape({-1}), handle(tp), range.vocab, range.padded,
                                  range.begin, range.end);
}

}  // namespace zero::libtorch
