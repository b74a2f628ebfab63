#include "zero/param_registry.h"

#include <algorithm>
#include <limits>

#include "base/check.h"
#include "zero/rank_agreement.h"

namespace zero {

size_t shape_numel(const std::vector<int64_t>& shape) {
  size_t n = 1;
  for (int64_t d : shape) {
    if (d <= 0) ZERO_THROW(InvalidArgument, "shape {} has a non-positive dimension", shape_string(shape));
    if (n > std::numeric_limits<size_t>::max() / static_cast<size_t>(d)) {
      ZERO_THROW(InvalidArgument, "shape {} overflows the element count", shape_string(shape));
    }
    n *= static_cast<size_t>(d);
  }
  return n;
}

std::string needs_finalizer(const ParamSpec& p) {
  if (p.tp.is_split()) return fmt::format("split over tensor parallelism (ParamSpec.tp = {})", describe(p.tp));
  if (p.tied) return "tied (ParamSpec.tied)";
  return "";
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += fmt::format("{}{}", i ? ", " : "", shape[i]);
  return s + "]";
}

void ParamRegistry::note_error(const std::string& message) {
  if (local_error_.empty()) local_error_ = message;
}

int ParamRegistry::add(const ParamSpec& spec) {
  const int id = static_cast<int>(params_.size());
  size_t n = 0;
  try {
    if (spec.name.empty()) ZERO_THROW(InvalidArgument, "parameter #{} has an empty name", id);
    if (spec.name.find_first_of("\t\n") != std::string::npos) {
      ZERO_THROW(InvalidArgument, "parameter #{}: name '{}' holds a tab or a newline", id, spec.name);
    }
    if (find(spec.name)) ZERO_THROW(InvalidArgument, "parameter '{}' is registered twice", spec.name);
    if (spec.dtype != DType::kFloat32 && spec.dtype != DType::kFloat16 &&
        spec.dtype != DType::kBFloat16) {
      ZERO_THROW(InvalidArgument, "parameter '{}': dtype {} is not fp32, fp16 or bf16", spec.name,
                 dtype_name(spec.dtype));
    }
    if (spec.param_dtype && *spec.param_dtype != spec.dtype &&
        (spec.dtype != DType::kFloat32 || !is_float16_family(*spec.param_dtype))) {
      ZERO_THROW(InvalidArgument,
                 "parameter '{}': ParamSpec.param_dtype {} with dtype {}: it must be the registered dtype, or fp16 or "
                 "bf16 for an fp32 parameter",
                 spec.name, dtype_name(*spec.param_dtype), dtype_name(spec.dtype));
    }
    try {
      n = shape_numel(spec.shape);
    } catch (const InvalidArgument& e) {
      ZERO_THROW(InvalidArgument, "parameter '{}': {}", spec.name, e.what());
    }
    if (spec.data.ptr == nullptr) {
      ZERO_THROW(InvalidArgument, "parameter '{}': data pointer is null", spec.name);
    }
    if (spec.data.numel != n) {
      ZERO_THROW(InvalidArgument, "parameter '{}': data holds {} elements but shape {} needs {}",
                 spec.name, spec.data.numel, shape_string(spec.shape), n);
    }
    if (spec.grad.ptr != nullptr && spec.grad.numel != n) {
      ZERO_THROW(InvalidArgument,
                 "parameter '{}': gradient pointer holds {} elements but shape {} needs {}",
                 spec.name, spec.grad.numel, shape_string(spec.shape), n);
    }
    if (spec.group < 0) ZERO_THROW(InvalidArgument, "parameter '{}': group {} < 0", spec.name, spec.group);
    if (spec.unit < 0) ZERO_THROW(InvalidArgument, "parameter '{}': unit {} < 0", spec.name, spec.unit);
    check_local(spec.name, spec.shape, spec.tp);
  } catch (const InvalidArgument& e) {
    note_error(e.what());
  }
  params_.push_back(spec);
  numels_.push_back(n);
  by_name_.emplace(spec.name, id);
  std::vector<int>& of_unit = unit_params_[spec.unit];
  if (of_unit.empty()) units_.push_back(spec.unit);
  of_unit.push_back(id);
  return id;
}

const ParamSpec& ParamRegistry::param(int id) const {
  if (id < 0 || static_cast<size_t>(id) >= params_.size()) {
    ZERO_THROW(InvalidArgument, "parameter id {} is not registered ({} parameters)", id, params_.size());
  }
  return params_[static_cast<size_t>(id)];
}

std::vector<int> ParamRegistry::trainable() const {
  std::vector<int> ids;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (params_[i].requires_grad) ids.push_back(static_cast<int>(i));
  }
  return ids;
}

std::optional<int> ParamRegistry::find(const std::string& name) const {
  const auto it = by_name_.find(name);
  if (it == by_name_.end()) return std::nullopt;
  return it->second;
}

std::vector<std::string> ParamRegistry::signature_lines() const {
  std::vector<std::string> lines;
  for (const ParamSpec& p : params_) {
    lines.push_back(fmt::format("'{}' shape {} {}{}{} group {} unit {}{}", p.name, shape_string(p.shape),
                                dtype_name(p.dtype), p.param_dtype ? fmt::format(" as {}", dtype_name(*p.param_dtype)) : "",
                                p.requires_grad ? "" : " frozen", p.group, p.unit,
                                p.tp == TpPlacement{} ? "" : " tp " + describe(p.tp)));
  }
  return lines;
}

void ParamRegistry::verify_across_ranks(comm::Communicator& comm, std::chrono::milliseconds timeout,
                                        memory::Device* device) const {
  std::vector<AgreementEntry> entries;
  const std::vector<std::string> lines = signature_lines();
  for (size_t i = 0; i < lines.size(); ++i) entries.push_back({fmt::format("parameter #{}", i), lines[i]});
  check_agreement(comm, {.what = "parameter registration", .verb = "registered"}, entries, local_error_,
                  timeout, device);
}

const std::vector<int>& ParamRegistry::params_of_unit(int unit) const {
  static const std::vector<int> none;
  const auto it = unit_params_.find(unit);
  return it == unit_params_.end() ? none : it->second;
}

}  // namespace zero
