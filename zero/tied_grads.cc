#include "zero/tied_grads.h"

#include <string>

#include <fmt/format.h>

#include "zero/rank_agreement.h"

namespace zero {

TiedGrads::TiedGrads(comm::Communicator* group, memory::Device& device, std::chrono::milliseconds timeout)
    : group_(group), device_(device), timeout_(timeout) {
  // The pairing is checked now, not at the first collective.
  if (group_ != nullptr) order_ = std::make_unique<CollectiveOrder>(device_, *group_, timeout_);
}

void TiedGrads::check(ParamRegistry& registry) {
  std::vector<AgreementEntry> tied;
  for (const ParamSpec& p : registry.params()) {
    if (!p.tied) continue;
    if (group_ == nullptr) {
      registry.note_error(fmt::format("parameter '{}' is tied (ParamSpec.tied) but EngineComms.tied is null", p.name));
    }
    tied.push_back({"tied parameter '" + p.name + "'", fmt::format("{} {}", shape_string(p.shape), dtype_name(p.dtype))});
  }
  if (group_ == nullptr) return;
  tied.push_back({"tied parameters", std::to_string(tied.size())});
  check_agreement(*group_, {.what = "tied parameters", .verb = "registers"}, tied, "", timeout_, &device_);
}

void TiedGrads::broadcast_initial(const ParamRegistry& registry) {
  memory::Stream& compute = device_.compute_stream();
  for (const ParamSpec& p : registry.params()) {
    if (!p.tied) continue;
    order_->before_issue(compute);
    order_->after(*group_->broadcast(p.data.ptr, p.data.numel, p.dtype, 0), compute);
  }
}

void TiedGrads::attach(const ParamRegistry& registry, const std::vector<int>& tensor_param) {
  for (size_t t = 0; t < tensor_param.size(); ++t) {
    if (registry.param(tensor_param[t]).tied) {
      tensors_.push_back(t);
      units_.insert(registry.param(tensor_param[t]).unit);
    }
  }
}

void TiedGrads::complete(GradReducer& reducer, const ParamRegistry& registry, const std::vector<int>& tensor_param,
                         const ModelDtypes& dtypes) {
  for (size_t t : tensors_) {
    if (reducer.is_ready(t)) continue;
    if (reducer.micro_step_syncs()) {
      const ParamSpec& p = registry.param(tensor_param[t]);
      void* g = p.grad.ptr != nullptr ? p.grad.ptr : reducer.grad(t);
      memory::Stream& compute = device_.compute_stream();
      order_->before_issue(compute);
      comm::CallLabel label(*group_, "tied " + p.name);
      order_->after(*group_->all_reduce(g, p.data.numel, dtypes.compute(p), comm::ReduceOp::kSum), compute);
    }
    reducer.tensor_ready(t);
  }
}

}  // namespace zero
