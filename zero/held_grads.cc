#include "zero/held_grads.h"

namespace zero {

HeldGrads::HeldGrads(const GradFinalizers& finalizers, const ParamRegistry& registry,
                     const std::vector<int>& tensor_param)
    : param_(registry.params().size(), false) {
  for (size_t t = 0; t < tensor_param.size(); ++t) {
    const ParamSpec& p = registry.param(tensor_param[t]);
    for (const auto& f : finalizers) {
      if (!f->holds(p)) continue;
      tensors_.emplace_back(t, f.get());
      tensor_param_.push_back(tensor_param[t]);
      param_[static_cast<size_t>(tensor_param[t])] = true;
      units_.insert(p.unit);
      break;
    }
  }
}

void HeldGrads::complete(GradReducer& reducer, const ParamRegistry& registry, const ModelDtypes& dtypes) const {
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const auto [t, finalizer] = tensors_[i];
    if (reducer.is_ready(t)) continue;
    if (reducer.micro_step_syncs()) {
      const ParamSpec& p = registry.param(tensor_param_[i]);
      finalizer->complete_held(p, p.grad.ptr != nullptr ? p.grad.ptr : reducer.grad(t), dtypes.compute(p));
    }
    reducer.tensor_ready(t);
  }
}

}  // namespace zero
