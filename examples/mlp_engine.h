#pragma once
// The MLP's layers run in the engine's unit scopes: layer l is unit l, its forward inside
// engine.gather(l), its backward inside engine.gather_for_backward(l), its parameters read through
// the open scope (gathered at stage 3, the model's own storage below).
#include <memory>
#include <optional>
#include <vector>

#include "examples/mlp.h"
#include "zero/engine.h"

namespace zero::examples {

// `ids[i]` is the engine's id of the model's parameter i. The returned Access keeps the engine and
// the ids by reference: both must outlive it.
inline Mlp::Access unit_scope_access(Engine& engine, const std::vector<int>& ids) {
  auto scope = std::make_shared<std::optional<UnitScope>>();
  Mlp::Access access;
  access.enter = [&engine, scope](size_t layer, bool backward) {
    const int unit = static_cast<int>(layer);
    scope->emplace(backward ? engine.gather_for_backward(unit) : engine.gather(unit));
  };
  access.leave = [scope](size_t, bool) { (*scope)->close(); };
  access.param = [&ids, scope](size_t i) { return (*scope)->param_as<float>(ids[i]); };
  return access;
}

}  // namespace zero::examples
