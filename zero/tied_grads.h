#pragma once
// Copies of one weight that several pipeline stages hold (a tied input embedding and output head,
// ParamSpec::tied over EngineComms::tied, the first and the last stage): one rule for them at
// finalize() and at the end of each micro-step, kept out of the engine's front.
//
//   finalize()         the group's ranks must tie the same tensors (else every rank of it fails,
//                      naming the first difference); a tied parameter without the group is a local
//                      error for the registry's cross-rank report; every copy starts as the group's
//                      rank 0's values.
//   finish_backward()  each copy's gradient is summed over the group in place, where backward
//                      accumulated it, then marked complete, so the data-parallel reduction sees the
//                      whole gradient. Only a micro-step that reduces sums: a no_sync one keeps
//                      accumulating the local part. The norm counts the copy on the group's rank 0
//                      only (the stage policy's counted blocks).
#include <chrono>
#include <memory>
#include <set>
#include <vector>

#include "comm/communicator.h"
#include "memory/device.h"
#include "zero/collective_order.h"
#include "zero/grad_reducer.h"
#include "zero/param_registry.h"
#include "zero/stage_policy.h"

namespace zero {

class TiedGrads {
 public:
  // `group` may be null (then no parameter may be tied). It and `device` must outlive this.
  TiedGrads(comm::Communicator* group, memory::Device& device, std::chrono::milliseconds timeout);

  // finalize(), before the registry's cross-rank check (collective over the group).
  void check(ParamRegistry& registry);
  // finalize(), after the data-parallel initial values (collective over the group).
  void broadcast_initial(const ParamRegistry& registry);
  // finalize(), once the layout's tensor order is known: which tensors and units hold a copy.
  void attach(const ParamRegistry& registry, const std::vector<int>& tensor_param);

  bool holds_unit(int unit) const { return units_.count(unit) > 0; }
  // finish_backward(): the copies' gradients summed (when the micro-step reduces), then complete.
  void complete(GradReducer& reducer, const ParamRegistry& registry, const std::vector<int>& tensor_param,
                const ModelDtypes& dtypes);

 private:
  comm::Communicator* group_;
  memory::Device& device_;
  std::chrono::milliseconds timeout_;
  std::unique_ptr<CollectiveOrder> order_;
  std::vector<size_t> tensors_;  // layout tensors of tied parameters
  std::set<int> units_;          // units holding one
};

}  // namespace zero
