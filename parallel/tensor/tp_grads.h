#pragma once
// Tensor parallelism's gradient finalizer (zero/grad_finalizer.h) over the mesh's tp group, and its
// checks of the placements (ParamSpec::tp) at finalize(): the wirings that would otherwise train
// silently wrong.
//
// A parameter registered replicated over tp (ParamSpec::tp left at its default) is one tensor that
// every tp rank holds whole, so every tp rank must hold the same values. A tensor split across tp
// but registered without its split placement holds a different part on each rank: copying tp rank
// 0's values over the others (what a data-parallel broadcast would do) trains rank 0's part
// everywhere, and counting it once in the norm is wrong too. So across tp initial_values()
// compares, it does not copy: differing values are refused naming the parameter.
//
//   claims  the split placements (held as slices across tp: checkpoints store each rank's) and the
//           partial gradients; a group of one rank claims them too, so a model written for tp runs
//           at tp 1 unchanged
//   copies  the replicated parameters (counted in the norm by tp rank 0)
//   summed  the replicated parameters whose gradient each rank holds in part (TpPlacement's
//           partial_grad: sequence parallelism's layer norms, the row-parallel biases)
#include <chrono>

#include "comm/communicator.h"
#include "memory/device.h"
#include "zero/grad_finalizer.h"

namespace zero::parallel {

class TpGrads final : public GradFinalizer {
 public:
  // `tp` must outlive this.
  explicit TpGrads(comm::Communicator& tp) : tp_(tp) {}

  std::string name() const override { return "tensor-parallel"; }
  comm::Communicator* group() const override { return &tp_; }
  comm::Communicator* splits_over() const override { return &tp_; }
  bool same_registration() const override { return true; }
  void bind(memory::Device& device, std::chrono::milliseconds timeout) override;
  void check(ParamRegistry&) override {}
  void initial_values(const ParamRegistry& registry) override;
  bool claims(const ParamSpec& p) const override { return p.tp.is_split() || p.tp.partial_grad; }
  bool copies(const ParamSpec& p) const override { return parallel() && !p.tp.is_split(); }
  bool holds(const ParamSpec&) const override { return false; }
  bool sums_reduced(const ParamSpec& p) const override { return parallel() && p.tp.partial_grad; }
  void complete_held(const ParamSpec& p, void* grad, DType dtype) override;
  // A split parameter as a part of the whole tensor: its runs by its placement, and its gather for
  // an update of the whole: each array all-gathered (host memory: the optimizers that need it run on
  // the host, so a host tp group; none on a CUDA device's), put together by the placement, updated,
  // and this rank's part taken back. Every tp rank updates the same whole tensor, so the parts stay
  // one tensor.
  SplitTensor split(const ParamSpec& p) const override;

 private:
  bool parallel() const { return tp_.size() > 1; }

  comm::Communicator& tp_;
  memory::Device* device_ = nullptr;
  std::chrono::milliseconds timeout_{};
};

}  // namespace zero::parallel
