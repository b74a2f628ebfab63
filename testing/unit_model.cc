#include "testing/unit_model.h"

#include <string>
#include <utility>

namespace zero::testing {

UnitModel::UnitModel(Engine& engine, std::vector<size_t> sizes, const std::function<float(size_t u, size_t e)>& init)
    : engine_(engine), sizes_(std::move(sizes)), storage_(sizes_.size()) {
  for (size_t u = 0; u < sizes_.size(); ++u) {
    storage_[u].resize(sizes_[u]);
    for (size_t e = 0; e < sizes_[u]; ++e) storage_[u][e] = init(u, e);
    initial_.push_back(storage_[u]);
    ids_.push_back(engine_.add_param({.name = "unit" + std::to_string(u) + ".w",
                                      .shape = {static_cast<int64_t>(sizes_[u])}, .dtype = DType::kFloat32,
                                      .data = {storage_[u].data(), storage_[u].size()}, .unit = static_cast<int>(u)}));
  }
}

std::vector<float> UnitModel::read(UnitScope& s, size_t u) const {
  const float* p = s.param_as<float>(ids_[u]);
  return std::vector<float>(p, p + sizes_[u]);
}

UnitReads UnitModel::gather_step(const Backward& backward) {
  UnitReads r;
  r.forward.assign(units(), {});
  r.backward.assign(units(), {});
  for (size_t u = 0; u < units(); ++u) {
    UnitScope s = engine_.gather(static_cast<int>(u));
    r.forward[u] = read(s, u);
  }
  for (size_t u = units(); backward && u-- > 0;) {
    UnitScope s = engine_.gather_for_backward(static_cast<int>(u));
    r.backward[u] = read(s, u);
    backward(u, r.backward[u], s.grad_as<float>(ids_[u]));
  }
  return r;
}

}  // namespace zero::testing
