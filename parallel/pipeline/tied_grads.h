#pragma once
// Copies of one weight that several pipeline stages hold (a tied input embedding and output head,
// ParamSpec::tied, over the mesh's tied group: the first and the last stage): a gradient finalizer
// (zero/grad_finalizer.h).
//
//   check()           the group's ranks must tie the same tensors (else every rank of it fails,
//                     naming the first difference)
//   initial_values()  every copy starts as the group's rank 0's values
//   claims, copies,   each copy's gradient is summed over the group in place, where backward
//   held              accumulated it, at the end of each micro-step that reduces (a no_sync one keeps
//                     accumulating the local part), before the data-parallel reduction sees it; the
//                     norm counts the copy on the group's rank 0 only
#include <chrono>
#include <memory>

#include "comm/communicator.h"
#include "memory/device.h"
#include "zero/collective_order.h"
#include "zero/grad_finalizer.h"

namespace zero::parallel {

class TiedGrads final : public GradFinalizer {
 public:
  // `group` must outlive this.
  explicit TiedGrads(comm::Communicator& group) : group_(group) {}

  std::string name() const override { return "tied"; }
  comm::Communicator* group() const override { return &group_; }
  comm::Communicator* splits_over() const override { return nullptr; }
  bool same_registration() const override { return false; }  // the stages between register others
  void bind(memory::Device& device, std::chrono::milliseconds timeout) override;
  void check(ParamRegistry& registry) override;
  void initial_values(const ParamRegistry& registry) override;
  bool claims(const ParamSpec& p) const override { return p.tied; }
  bool copies(const ParamSpec& p) const override { return p.tied; }
  bool holds(const ParamSpec& p) const override { return p.tied; }
  bool sums_reduced(const ParamSpec&) const override { return false; }
  void complete_held(const ParamSpec& p, void* grad, DType dtype) override;

 private:
  comm::Communicator& group_;
  memory::Device* device_ = nullptr;
  std::chrono::milliseconds timeout_{};
  std::unique_ptr<CollectiveOrder> order_;
};

}  // namespace zero::parallel
