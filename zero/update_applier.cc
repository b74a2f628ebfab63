#include "zero/update_applier.h"

#include <chrono>

#include "base/check.h"
#include "zero/param_registry.h"

namespace zero {

namespace {

// A tensor as a matrix: rows = shape[0], cols = the other dimensions; {0, 0} below two dimensions.
std::pair<size_t, size_t> matrix_shape(const std::vector<int64_t>& shape) {
  if (shape.size() < 2) return {0, 0};
  size_t cols = 1;
  for (size_t d = 1; d < shape.size(); ++d) cols *= static_cast<size_t>(shape[d]);
  return {static_cast<size_t>(shape[0]), cols};
}

// Whether the optimizer of `t`'s group updates it as the whole tensor it is a part of.
bool updated_whole(const UpdateTensor& t, const optim::OptimizerOptions& o) {
  if (!t.split || o.custom) return false;
  const optim::OptimizerKind kind = optim::group_kind(o, t.group);
  if (kind == optim::OptimizerKind::kMuon) return !o.groups[static_cast<size_t>(t.group)].muon.per_part;
  return kind == optim::OptimizerKind::kAdafactor;
}

// The shape `t`'s optimizer sees.
const std::vector<int64_t>& optimizer_shape(const UpdateTensor& t, const optim::OptimizerOptions& o) {
  return updated_whole(t, o) ? t.split.whole_shape : t.shape;
}

}  // namespace

std::vector<optim::Segment> optimizer_segments(const ShardOwnership& own, const std::vector<UpdateTensor>& tensors,
                                               const optim::OptimizerOptions& options) {
  std::vector<optim::Segment> segments;
  for (const OwnedPiece& p : own.pieces()) {
    const UpdateTensor& t = tensors[p.tensor];
    const auto [rows, cols] = matrix_shape(optimizer_shape(t, options));
    segments.push_back({p.opt_offset, p.opt_offset + (p.tensor_end - p.tensor_begin), t.group, t.name, p.tensor_begin,
                        t.split.gather, rows, cols, shape_numel(t.shape)});
  }
  return segments;
}

namespace {

std::unique_ptr<MatrixExchange> make_matrix_exchange(const ApplierInputs& in, memory::Device& host) {
  std::vector<ExchangedMatrix> matrices;
  for (size_t t = 0; t < in.tensors.size(); ++t) {
    const UpdateTensor& u = in.tensors[t];
    if (in.optimizer.custom || optim::group_kind(in.optimizer, u.group) != optim::OptimizerKind::kMuon) continue;
    const bool whole = updated_whole(u, in.optimizer);
    const auto [rows, cols] = matrix_shape(optimizer_shape(u, in.optimizer));
    if (rows == 0) {
      ZERO_THROW(InvalidArgument,
                 "parameter '{}' has {} dimension(s) but its group ({}) runs Muon, which updates matrices: put "
                 "vectors and scalars (biases, norms) in a group of an elementwise kind (adamw)",
                 u.name, u.shape.size(), u.group);
    }
    if (whole && !u.split.gather) {
      ZERO_THROW(InvalidArgument,
                 "parameter '{}' is split across {} ranks and its group ({}) runs Muon, which orthogonalizes the "
                 "whole matrix, gathered in host memory, but the group that splits it takes device memory only: "
                 "give the engine a host group for it, or set optimizer.groups[{}].muon.per_part to orthogonalize "
                 "each rank's part by itself",
                 u.name, u.split.over->size(), u.group, u.group);
    }
    const optim::Hyper& h = in.optimizer.groups[static_cast<size_t>(u.group)];
    matrices.push_back({t, rows, cols, optim::NewtonSchulzOptions{.steps = h.muon.ns_steps, .bf16 = h.muon.bf16},
                        whole ? u.split.gather : optim::WholeTensorGather{}});
  }
  if (matrices.empty()) return nullptr;
  if (host.kind() == memory::DeviceKind::kCuda) {
    ZERO_THROW(InvalidArgument, "optimizer: Muon runs in host memory; on {} set offload.optimizer", host.name());
  }
  return std::make_unique<MatrixExchange>(*in.layout, *in.ownership, std::move(matrices), in.shard, host, in.timeout);
}

std::unique_ptr<AdafactorStats> make_adafactor_stats(const ApplierInputs& in) {
  std::vector<FactoredTensor> tensors;
  for (size_t t = 0; t < in.tensors.size(); ++t) {
    const UpdateTensor& u = in.tensors[t];
    if (in.optimizer.custom || optim::group_kind(in.optimizer, u.group) != optim::OptimizerKind::kAdafactor) continue;
    if (u.split && !u.split.over->accepts(memory::DeviceKind::kHost)) {
      ZERO_THROW(InvalidArgument,
                 "parameter '{}' is split across {} ranks and its group ({}) runs Adafactor, whose statistics of the "
                 "whole tensor are summed over the parts in host memory, but the group that splits it takes device "
                 "memory only ({}): give the engine a host group for it, or put it in an AdamW group",
                 u.name, u.split.over->size(), u.group, u.split.over->backend_name());
    }
    const std::vector<int64_t>& shape = optimizer_shape(u, in.optimizer);
    const auto [rows, cols] = matrix_shape(shape);
    tensors.push_back({t, u.name, rows, cols, shape_numel(shape), u.group, u.split});
  }
  if (tensors.empty()) return nullptr;
  return std::make_unique<AdafactorStats>(*in.layout, *in.ownership, std::move(tensors), in.shard, in.timeout);
}

}  // namespace

OwnedExchanges make_optimizer_exchanges(const ApplierInputs& in, memory::Device& host) {
  return {make_matrix_exchange(in, host), make_adafactor_stats(in)};
}

namespace {

class DeviceApplier final : public UpdateApplier {
 public:
  explicit DeviceApplier(const ApplierInputs& in)
      : layout_(*in.layout), ownership_(*in.ownership), device_(*in.device), timeout_(in.timeout) {
    const size_t numel = ownership_.numel();
    master_ = device_.allocate_elements(static_cast<int64_t>(numel), DType::kFloat32, memory::Category::kMasterParams);
    // The padding between the owned pieces stays zero: the update writes it back with the rest (at
    // stage 3 into the parameter shard, where quantized gathers take each block's scale from it).
    device_.fill_zero(master_.data(), master_.size_bytes(), device_.compute_stream());
    for (const OwnedPiece& p : ownership_.pieces()) {
      const UpdateTensor& t = in.tensors[p.tensor];
      device_.convert(static_cast<const char*>(t.data) + p.tensor_begin * dtype_size(t.dtype), t.dtype,
                      master_.as<float>() + p.opt_offset, DType::kFloat32, p.tensor_end - p.tensor_begin,
                      device_.compute_stream());
    }
    exchanges_ = make_optimizer_exchanges(in, device_);
    optimizer_ = make_shard_optimizer(device_, in.optimizer, numel,
                                      optimizer_segments(ownership_, in.tensors, in.optimizer), in.timeout,
                                      exchanges_.view());
  }

  void apply(const GradReducer& grads, float grad_scale, ParamWriteback& writeback) override {
    optimizer_->begin_step();
    // The gradients are complete in compute-stream order (the optimizer's; a kind that prepares
    // runs on the host).
    auto input = [&](size_t b) {
      const OwnedRange own = ownership_.range(b);
      const GradReducer::Reduced g = grads.reduced(b);
      optim::StepInput in;
      in.master = master_.as<float>() + own.opt_begin;
      in.grad = g.ptr;
      in.grad_dtype = g.dtype;
      in.grad_scale = grad_scale;
      in.model_dtype = layout_.buckets()[b].dtype;
      return in;
    };
    for (size_t b = 0; b < layout_.buckets().size(); ++b) {
      const OwnedRange own = ownership_.range(b);
      if (optimizer_->prepares(own.opt_begin)) optimizer_->prepare_range(input(b), own.opt_begin, own.opt_begin + own.len);
    }
    for (size_t b = 0; b < layout_.buckets().size(); ++b) {
      const OwnedRange own = ownership_.range(b);
      optim::StepInput in = input(b);
      in.model_out = writeback.owned_out(b, own);
      optimizer_->step_range(in, own.opt_begin, own.opt_begin + own.len, device_.compute_stream());
      writeback.publish(b);
    }
    writeback.finish();
  }

  ShardOptimizer& optimizer() override { return *optimizer_; }

  void read_master(size_t begin, size_t n, float* out) override {
    memory::Stream& compute = device_.compute_stream();
    device_.copy(out, master_.as<float>() + begin, n * sizeof(float), compute);
    device_.synchronize(compute, timeout_);
  }
  float* host_master() override { return device_.kind() == memory::DeviceKind::kCuda ? nullptr : master_.as<float>(); }
  void write_master(size_t begin, size_t n, const float* in) override {
    memory::Stream& compute = device_.compute_stream();
    device_.copy(master_.as<float>() + begin, in, n * sizeof(float), compute);
    device_.synchronize(compute, timeout_);
  }
  void publish_master(ParamWriteback& writeback) override {
    for (size_t b = 0; b < layout_.buckets().size(); ++b) {
      const OwnedRange own = ownership_.range(b);
      device_.convert(master_.as<float>() + own.opt_begin, DType::kFloat32, writeback.owned_out(b, own),
                      layout_.buckets()[b].dtype, own.len, device_.compute_stream());
      writeback.publish(b);
    }
    writeback.finish();
  }

 private:
  const ShardLayout& layout_;
  const ShardOwnership& ownership_;
  memory::Device& device_;
  std::chrono::milliseconds timeout_;
  memory::Buffer master_;
  OwnedExchanges exchanges_;  // Muon's and Adafactor's (null without); the optimizer uses them
  std::unique_ptr<ShardOptimizer> optimizer_;
};

}  // namespace

std::unique_ptr<UpdateApplier> make_device_applier(const ApplierInputs& in) { return std::make_unique<DeviceApplier>(in); }

}  // namespace zero
