#include "zero/typed_view.h"

#include "base/check.h"

namespace zero {

size_t checked_view_numel(const ParamRegistry& registry, int id, ViewType v) {
  return checked_view_numel(registry, id, v, registry.param(id).dtype);
}

size_t checked_view_numel(const ParamRegistry& registry, int id, ViewType v, DType dtype) {
  const ParamSpec& p = registry.param(id);
  const bool matches = v.either_16bit ? is_float16_family(dtype) : dtype == v.dtype;
  if (!matches) {
    ZERO_THROW(InvalidArgument, "parameter '{}' (id {}) is {}{}: it cannot be viewed as {} (use {})", p.name, id,
               dtype_name(dtype), dtype == p.dtype ? "" : " in the engine (EngineOptions.param_dtype)", v.name,
               dtype == DType::kFloat32   ? "float"
               : dtype == DType::kFloat16 ? "Half or uint16_t"
                                          : "BFloat16 or uint16_t");
  }
  return registry.numel(id);
}

}  // namespace zero
