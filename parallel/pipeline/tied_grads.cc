#include "parallel/pipeline/tied_grads.h"

#include <string>
#include <vector>

#include <fmt/format.h>

#include "base/check.h"
#include "zero/rank_agreement.h"

namespace zero::parallel {

void TiedGrads::bind(memory::Device& device, std::chrono::milliseconds timeout) {
  if (device_ != nullptr) {
    ZERO_THROW(InvalidArgument, "the tied copies' gradient finalizer serves one engine; it is bound already");
  }
  // The pairing is checked now, not at the first collective.
  order_ = std::make_unique<CollectiveOrder>(device, group_, timeout);
  device_ = &device;
  timeout_ = timeout;
}

void TiedGrads::check(ParamRegistry& registry) {
  std::vector<AgreementEntry> tied;
  for (const ParamSpec& p : registry.params()) {
    if (p.tied) {
      tied.push_back({"tied parameter '" + p.name + "'", fmt::format("{} {}", shape_string(p.shape), dtype_name(p.dtype))});
    }
  }
  tied.push_back({"tied parameters", std::to_string(tied.size())});
  check_agreement(group_, {.what = "tied parameters", .verb = "registers"}, tied, "", timeout_, device_);
}

void TiedGrads::initial_values(const ParamRegistry& registry) {
  memory::Stream& compute = device_->compute_stream();
  for (const ParamSpec& p : registry.params()) {
    if (!p.tied) continue;
    order_->before_issue(compute);
    order_->after(*group_.broadcast(p.data.ptr, p.data.numel, p.dtype, 0), compute);
  }
}

void TiedGrads::complete_held(const ParamSpec& p, void* grad, DType dtype) {
  memory::Stream& compute = device_->compute_stream();
  order_->before_issue(compute);
  comm::CallLabel label(group_, "tied " + p.name);
  order_->after(*group_.all_reduce(grad, p.data.numel, dtype, comm::ReduceOp::kSum), compute);
}

}  // namespace zero::parallel
