#pragma once
// The MLP's layers run in the engine's unit scopes: layer l is unit l, its forward inside
// engine.gather(l), its backward inside engine.gather_for_backward(l), its parameters read through
// the open scope (gathered at stage 3, the model's own storage below).
#include <memory>
#include <optional>
#include <vector>

#include "examples/mlp.h"
#include "examples/optimizer_groups.h"
#include "zero/engine.h"

namespace zero::examples {

// Registers the model's parameters (fp32, its own storage): layer l's weight and bias are unit l;
// with `decay_groups` the weights are optimizer group 0 (Muon's group 2 where the engine has one:
// examples/optimizer_groups.h) and the biases group 1, else all group 0.
// Returns the engine's id of each parameter, in the model's order.
inline std::vector<int> register_mlp(Engine& engine, Mlp& model, bool decay_groups = false) {
  std::vector<int> ids;
  for (size_t i = 0; i < model.params().size(); ++i) {
    auto& p = model.params()[i];
    ids.push_back(engine.add_param({.name = p.name, .shape = p.shape, .dtype = DType::kFloat32,
                                    .data = {p.values.data(), p.values.size()}, .unit = static_cast<int>(i / 2),
                                    .group = decay_groups ? example_group(engine.options(), p.decay, p.shape.size() == 2) : 0}));
  }
  return ids;
}

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
