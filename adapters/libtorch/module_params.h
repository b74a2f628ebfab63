#pragma once
// What the LibTorch adapters (TorchEngine, TorchPipeline) share about registering a torch::nn
// module's parameters with the engine: which dtypes it takes, the checks a parameter must pass, the
// placements tensor-parallel modules give, and the pointing of a parameter's storage at the
// engine's memory (stage 3). Internal to adapters/libtorch; header only.
#include <ATen/ops/from_blob.h>
#include <c10/core/StorageImpl.h>
#include <torch/nn/module.h>
#include <torch/types.h>

#include <functional>
#include <map>
#include <optional>
#include <string>

#include "adapters/libtorch/tensor_parallel_module.h"
#include "base/check.h"
#include "base/dtype.h"
#include "base/error.h"
#include "zero/tp_placement.h"

namespace zero::libtorch {

inline c10::StorageImpl& storage_of(const torch::Tensor& t) {
  return *t.unsafeGetTensorImpl()->storage().unsafeGetStorageImpl();
}

// Points `t`'s storage at `ptr` (the engine's gathered copy), or at nothing.
inline void point_storage(const torch::Tensor& t, void* ptr) {
  storage_of(t).set_data_ptr_noswap(c10::DataPtr(ptr, c10::Device(c10::kCPU)));
}

// A non-owning view of the engine's memory with `like`'s shape and dtype.
inline torch::Tensor view_of(void* ptr, const torch::Tensor& like) {
  return at::from_blob(ptr, like.sizes(), at::TensorOptions().dtype(like.scalar_type()).device(at::kCPU));
}

// The engine's dtype of a parameter's scalar type: fp32, bf16 or fp16 (each parameter its own: a
// module kept in fp32 beside bf16 ones), or none.
inline std::optional<DType> engine_dtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return DType::kFloat32;
    case at::kBFloat16: return DType::kBFloat16;
    case at::kHalf: return DType::kFloat16;
    default: return std::nullopt;
  }
}

// Throws InvalidArgument naming parameter `name` (`who`: the adapter) when the engine cannot take
// it: not float, bfloat16 or half, not CPU or not contiguous, or, where its storage will point at
// gathered copies (`own_storage`: stage 3), sharing its storage with other tensors.
inline void check_registrable(const char* who, const std::string& name, const torch::Tensor& t, bool own_storage) {
  if (!engine_dtype(t.scalar_type()) || !t.device().is_cpu() || !t.is_contiguous()) {
    ZERO_THROW(InvalidArgument,
               "{}: parameter '{}' is {} on {}{}: the adapter takes CPU contiguous tensors of float, bfloat16 or half",
               who, name, c10::toString(t.scalar_type()), t.device().str(), t.is_contiguous() ? "" : ", not contiguous");
  }
  if (own_storage && t.requires_grad() &&
      (t.storage_offset() != 0 || storage_of(t).nbytes() != static_cast<size_t>(t.numel() * t.element_size()))) {
    ZERO_THROW(InvalidArgument,
               "{}: parameter '{}' shares its storage with other tensors (offset {}, {} bytes for {} elements); stage 3 "
               "points each parameter's storage at its gathered copy, so each needs its own",
               who, name, t.storage_offset(), storage_of(t).nbytes(), t.numel());
  }
}

// The placements that the tensor-parallel modules under `model` (itself included) give their own
// parameters, by tensor.
using ModulePlacements = std::map<const c10::TensorImpl*, TpPlacement>;
inline ModulePlacements module_placements(const torch::nn::Module& model) {
  ModulePlacements out;
  for (const auto& item : model.named_modules(/*name_prefix=*/"", /*include_self=*/true)) {
    const auto* tp_module = dynamic_cast<const TensorParallelModule*>(item.value().get());
    if (tp_module == nullptr) continue;
    for (const auto& param : item.value()->named_parameters(/*recurse=*/false)) {
      out[param.value().unsafeGetTensorImpl()] = tp_module->tp_placement(param.key());
    }
  }
  return out;
}

// Parameter `name`'s placement: its tensor-parallel module's, else `given`'s, else replicated.
// `given` may restate a module's placement, not change it (InvalidArgument naming both).
inline TpPlacement placement_of(
    const std::string& name, const torch::Tensor& t, const ModulePlacements& placements,
    const std::function<std::optional<TpPlacement>(const std::string&, const torch::Tensor&)>& given = {}) {
  const std::optional<TpPlacement> option = given ? given(name, t) : std::nullopt;
  const auto it = placements.find(t.unsafeGetTensorImpl());
  if (it == placements.end()) return option.value_or(TpPlacement::replicated());
  if (option && *option != it->second) {
    ZERO_THROW(InvalidArgument,
               "TorchEngine: parameter '{}' belongs to a tensor-parallel module that places it {}; "
               "TorchEngineOptions.placement says {}",
               name, describe(it->second), describe(*option));
  }
  return it->second;
}

}  // namespace zero::libtorch
