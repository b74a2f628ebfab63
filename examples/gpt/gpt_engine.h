#pragma once
// The GPT's units in the engine's scopes: register_gpt() hands the model's parameters to the engine
// (unit as the model numbers them, group 0 for the decayed ones, 1 for the rest); GptScopes turns the
// model's enter/leave into gather / gather_for_backward scopes, and reads parameters and writes
// gradients through the open scope of their unit (more than one is open while unit 0's backward
// spans the others).
#include <map>
#include <optional>
#include <vector>

#include "examples/gpt/gpt_model.h"
#include "zero/engine.h"

namespace zero::examples {

inline std::vector<int> register_gpt(Engine& engine, Gpt& model) {
  std::vector<int> ids;
  for (Gpt::Param& p : model.params()) {
    ids.push_back(engine.add_param({.name = p.name, .shape = p.shape, .dtype = DType::kFloat32,
                                    .data = {p.values.data(), p.values.size()}, .unit = p.unit,
                                    .group = p.decay ? 0 : 1}));
  }
  return ids;
}

class GptScopes {
 public:
  // Keeps the engine and the model by reference.
  GptScopes(Engine& engine, const Gpt& model, std::vector<int> ids)
      : engine_(engine), model_(model), ids_(std::move(ids)) {}
  GptScopes(const GptScopes&) = delete;
  GptScopes& operator=(const GptScopes&) = delete;

  Gpt::Access access() {
    Gpt::Access a;
    a.enter = [this](int unit, bool backward) {
      open_[unit].emplace(backward ? engine_.gather_for_backward(unit) : engine_.gather(unit));
    };
    a.leave = [this](int unit, bool) { open_.at(unit).reset(); };
    a.param = [this](size_t i) { return scope_of(i).param_as<float>(ids_[i]); };
    a.grad = [this](size_t i) { return scope_of(i).grad_as<float>(ids_[i]); };
    return a;
  }

 private:
  UnitScope& scope_of(size_t i) {
    std::optional<UnitScope>& s = open_.at(model_.params()[i].unit);
    return *s;
  }
  Engine& engine_;
  const Gpt& model_;
  std::vector<int> ids_;
  std::map<int, std::optional<UnitScope>> open_;
};

}  // namespace zero::examples
