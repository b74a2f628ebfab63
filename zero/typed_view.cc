#include "zero/typed_view.h"

#include "base/check.h"

namespace zero {

size_t checked_view_numel(const ParamRegistry& registry, int id, ViewType v) {
  const ParamSpec& p = registry.param(id);
  const bool matches = v.either_16bit ? is_float16_family(p.dtype) : p.dtype == v.dtype;
  if (!matches) {
    ZERO_THROW(InvalidArgument, "parameter '{}' (id {}) is {}: it cannot be viewed as {} (use {})", p.name, id,
               dtype_name(p.dtype), v.name,
               p.dtype == DType::kFloat32   ? "float"
               : p.dtype == DType::kFloat16 ? "Half or uint16_t"
                                            : "BFloat16 or uint16_t");
  }
  return registry.numel(id);
}

}  // namespace zero
