#pragma once
// The gradients the finalizers hold back from the data-parallel reduction (zero/grad_finalizer.h:
// "held", the tied copies' today) until finish_backward(), which has their finalizer complete them
// and marks them ready. Private to the engine (engine.cc, unit_scope.cc).
#include <set>
#include <vector>

#include "zero/grad_finalizer.h"
#include "zero/grad_reducer.h"
#include "zero/param_registry.h"
#include "zero/stage_policy.h"

namespace zero {

class HeldGrads {
 public:
  HeldGrads() = default;
  // `tensor_param`: layout tensor -> parameter id. A parameter is held by the first finalizer that
  // holds it.
  HeldGrads(const GradFinalizers& finalizers, const ParamRegistry& registry, const std::vector<int>& tensor_param);

  bool param(int id) const { return param_[static_cast<size_t>(id)]; }
  bool unit(int unit) const { return units_.count(unit) > 0; }

  // finish_backward(): each held gradient not yet ready completed by its finalizer (when the
  // micro-step reduces: a no_sync one keeps accumulating the local part), then marked ready, in
  // layout order.
  void complete(GradReducer& reducer, const ParamRegistry& registry, const ModelDtypes& dtypes) const;

 private:
  struct Held {
    size_t tensor;  // in the layout
    int param;      // its id
    GradFinalizer* finalizer;
  };
  std::vector<Held> held_;     // in layout order
  std::vector<bool> param_;    // parameter id -> held
  std::set<int> units_;        // units holding one
};

}  // namespace zero
