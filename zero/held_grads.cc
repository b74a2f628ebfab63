#include "zero/held_grads.h"

namespace zero {

HeldGrads::HeldGrads(const GradFinalizers& finalizers, const ParamRegistry& registry,
                     const std::vector<int>& tensor_param)
    : param_(registry.params().size(), false) {
  for (size_t t = 0; t < tensor_param.size(); ++t) {
    const ParamSpec& p = registry.param(tensor_param[t]);
    for (const auto& f : finalizers) {
      if (!f->holds(p)) continue;
      held_.push_back({t, tensor_param[t], f.get()});
      param_[static_cast<size_t>(tensor_param[t])] = true;
      units_.insert(p.unit);
      break;
    }
  }
}

void HeldGrads::complete(GradReducer& reducer, const ParamRegistry& registry, const ModelDtypes& dtypes) const {
  for (const Held& h : held_) {
    if (reducer.is_ready(h.tensor)) continue;
    if (reducer.micro_step_syncs()) {
      const ParamSpec& p = registry.param(h.param);
      h.finalizer->complete_held(p, p.grad.ptr != nullptr ? p.grad.ptr : reducer.grad(h.tensor), dtypes.compute(p));
    }
    reducer.tensor_ready(h.tensor);
  }
}

}  // namespace zero
