#pragma once
// A model as the planner sees it: named tensors with shapes, units and dtypes, no values. Built from
// a parameter count, a list of named shapes, or a safetensors file's header.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "zero/tp_placement.h"

namespace zero::plan {

struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;  // under tensor parallelism: one rank's part
  int unit = 0;
  bool trainable = true;
  int group = 0;  // optimizer parameter group
  TpPlacement tp;
  bool tied = false;  // a copy another pipeline stage holds too (ParamSpec::tied)
  std::optional<DType> dtype;  // when it differs from ModelSpec::dtype (fp32 norms beside bf16 matrices)
  std::optional<DType> param_dtype;  // ParamSpec::param_dtype (fp32 norms kept over a bf16 param_dtype)
};

// One thing a training loop's micro-step does with the engine's unit scopes, in order: open a unit's
// forward or backward scope, ask for a tensor's gradient (which is when the reducer takes a bucket
// buffer for it), close the scope.
struct ScopeEvent {
  enum Kind { kOpen, kGrad, kClose };
  Kind kind = kOpen;
  int unit = 0;
  bool backward = false;
  size_t tensor = 0;  // kGrad: index into ModelSpec::tensors
};

struct ModelSpec {
  std::vector<TensorSpec> tensors;
  DType dtype = DType::kBFloat16;  // of every tensor that does not say its own
  DType dtype_of(const TensorSpec& t) const { return t.dtype.value_or(dtype); }
  // The loop's micro-step, for a plan whose transient buffers follow it exactly. Empty: every unit's
  // forward scope in registration order, then its backward scope in reverse, each trainable gradient
  // asked for as its backward scope opens (default_schedule).
  std::vector<ScopeEvent> schedule;
  uint64_t numel() const;  // trainable elements (Ψ)
};

std::vector<ScopeEvent> default_schedule(const std::vector<TensorSpec>& tensors);

// `numel` elements in `tensors` equal tensors (the last takes the remainder), one unit each.
ModelSpec model_of_count(uint64_t numel, int tensors, DType dtype);

// One tensor per line: "name d0xd1x... [unit]" (blank lines and lines starting with # skipped);
// without a unit, tensors are units in the order of the first number in their name (see
// unit_of_name). InvalidArgument naming the line.
ModelSpec model_of_shapes(const std::string& text, DType dtype, const std::string& source);

// The header of a safetensors file: names, shapes and dtypes (each F32, F16 or BF16; the first
// tensor's is the model's, others say theirs where they differ), units by unit_of_name. Only the
// header is read.
ModelSpec model_of_safetensors(const std::string& path);

// Units from names as checkpoints spell them ("h.3.attn.c_attn.weight", "layers.12.mlp.w1"): the
// first all-digit dotted component k makes unit k + 1; tensors before any numbered one are unit 0,
// those after the last are one unit past the highest.
void assign_units_by_name(std::vector<TensorSpec>& tensors);

}  // namespace zero::plan
