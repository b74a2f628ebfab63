#pragma once
// Typed views of a registered parameter's storage (Engine::grad_as / grad_span, UnitScope::param_as
// / param_span / grad_as / grad_span). The element type must match the dtype the parameter was
// registered with, so grad_as<float> on a bf16 parameter is an error naming the parameter, not a
// read or write past the end of its storage.
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "base/dtype.h"
#include "zero/param_registry.h"

namespace zero {

// The element type of a view: float (fp32), Half (fp16), BFloat16 (bf16), or uint16_t (the raw bits
// of either 16-bit float type), each possibly const.
struct ViewType {
  const char* name;
  DType dtype;
  bool either_16bit;  // uint16_t: fp16 or bf16
};

template <typename T>
constexpr ViewType view_type() {
  using U = std::remove_const_t<T>;
  if constexpr (std::is_same_v<U, uint16_t>) {
    return {"uint16_t", DType::kFloat16, true};
  } else if constexpr (std::is_same_v<U, float>) {
    return {"float", DType::kFloat32, false};
  } else if constexpr (std::is_same_v<U, Half>) {
    return {"Half", DType::kFloat16, false};
  } else {
    static_assert(std::is_same_v<U, BFloat16>, "a parameter view is of float, Half, BFloat16 or uint16_t");
    return {"BFloat16", DType::kBFloat16, false};
  }
}

// The element count of parameter `id` when a view of type `v` matches its registered dtype; else
// throws InvalidArgument naming the parameter, its dtype and the view's type.
size_t checked_view_numel(const ParamRegistry& registry, int id, ViewType v);
// The same against `dtype`, the dtype of the memory viewed (the engine's, with
// EngineOptions.param_dtype).
size_t checked_view_numel(const ParamRegistry& registry, int id, ViewType v, DType dtype);

}  // namespace zero
