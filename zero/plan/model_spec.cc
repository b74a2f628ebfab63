#include "zero/plan/model_spec.h"

#include <algorithm>
#include <cctype>
#include <optional>
#include <sstream>

#include "base/check.h"
#include "zero/checkpoint/safetensors.h"
#include "zero/param_registry.h"

namespace zero::plan {
namespace {

std::optional<int> first_number(const std::string& name) {
  std::stringstream parts(name);
  std::string part;
  while (std::getline(parts, part, '.')) {
    if (!part.empty() && part.size() < 9 && std::all_of(part.begin(), part.end(), [](unsigned char c) { return std::isdigit(c); })) {
      return std::stoi(part);
    }
  }
  return std::nullopt;
}

std::vector<int64_t> parse_shape(const std::string& text, const std::string& where) {
  std::vector<int64_t> shape;
  std::stringstream dims(text);
  std::string d;
  while (std::getline(dims, d, 'x')) {
    char* end = nullptr;
    const long long v = std::strtoll(d.c_str(), &end, 10);
    if (d.empty() || *end != '\0' || v <= 0) {
      ZERO_THROW(InvalidArgument, "{}: shape '{}' must be positive dimensions joined by 'x' (e.g. 768x3072)", where, text);
    }
    shape.push_back(v);
  }
  return shape;
}

}  // namespace

uint64_t ModelSpec::numel() const {
  uint64_t n = 0;
  for (const TensorSpec& t : tensors) {
    if (t.trainable) n += shape_numel(t.shape);
  }
  return n;
}

std::vector<ScopeEvent> default_schedule(const std::vector<TensorSpec>& tensors) {
  std::vector<int> order;
  for (const TensorSpec& t : tensors) {
    if (std::find(order.begin(), order.end(), t.unit) == order.end()) order.push_back(t.unit);
  }
  std::vector<ScopeEvent> events;
  for (int u : order) {
    events.push_back({ScopeEvent::kOpen, u, false, 0});
    events.push_back({ScopeEvent::kClose, u, false, 0});
  }
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    events.push_back({ScopeEvent::kOpen, *it, true, 0});
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (tensors[i].unit == *it && tensors[i].trainable) events.push_back({ScopeEvent::kGrad, *it, true, i});
    }
    events.push_back({ScopeEvent::kClose, *it, true, 0});
  }
  return events;
}

ModelSpec model_of_count(uint64_t numel, int tensors, DType dtype) {
  if (numel == 0 || tensors < 1 || static_cast<uint64_t>(tensors) > numel) {
    ZERO_THROW(InvalidArgument, "a model of {} parameters in {} tensors: both must be positive, tensors at most the parameters",
               numel, tensors);
  }
  ModelSpec m;
  m.dtype = dtype;
  const uint64_t per = numel / static_cast<uint64_t>(tensors);
  for (int t = 0; t < tensors; ++t) {
    const uint64_t n = t + 1 == tensors ? numel - per * static_cast<uint64_t>(tensors - 1) : per;
    m.tensors.push_back({"w" + std::to_string(t), {static_cast<int64_t>(n)}, t, true});
  }
  return m;
}

void assign_units_by_name(std::vector<TensorSpec>& tensors) {
  int highest = -1;
  for (const TensorSpec& t : tensors) highest = std::max(highest, first_number(t.name).value_or(-1));
  bool numbered_seen = false;
  for (TensorSpec& t : tensors) {
    const std::optional<int> k = first_number(t.name);
    if (k) {
      numbered_seen = true;
      t.unit = *k + 1;
    } else {
      t.unit = numbered_seen ? highest + 2 : 0;
    }
  }
}

ModelSpec model_of_shapes(const std::string& text, DType dtype, const std::string& source) {
  ModelSpec m;
  m.dtype = dtype;
  std::stringstream lines(text);
  std::string line;
  bool units_given = false, units_missing = false;
  for (int no = 1; std::getline(lines, line); ++no) {
    const std::string where = source + ":" + std::to_string(no);
    std::stringstream fields(line);
    std::string name, shape, unit, extra;
    if (!(fields >> name) || name[0] == '#') continue;
    if (!(fields >> shape)) ZERO_THROW(InvalidArgument, "{}: '{}' has no shape (expected: name d0xd1... [unit])", where, name);
    TensorSpec t{name, parse_shape(shape, where), 0, true};
    if (fields >> unit) {
      char* end = nullptr;
      const long v = std::strtol(unit.c_str(), &end, 10);
      if (*end != '\0' || v < 0) ZERO_THROW(InvalidArgument, "{}: unit '{}' must be a non-negative integer", where, unit);
      t.unit = static_cast<int>(v);
      units_given = true;
    } else {
      units_missing = true;
    }
    if (fields >> extra) ZERO_THROW(InvalidArgument, "{}: unexpected '{}' after the unit", where, extra);
    m.tensors.push_back(std::move(t));
  }
  if (m.tensors.empty()) ZERO_THROW(InvalidArgument, "{}: no tensors", source);
  if (units_given && units_missing) ZERO_THROW(InvalidArgument, "{}: give a unit on every line or on none", source);
  if (!units_given) assign_units_by_name(m.tensors);
  return m;
}

ModelSpec model_of_safetensors(const std::string& path) {
  const SafetensorsLayout layout = read_safetensors_header(path);
  ModelSpec m;
  for (size_t i = 0; i < layout.tensors.size(); ++i) {
    const SafetensorsTensor& t = layout.tensors[i];
    if (!(t.dtype == DType::kFloat32 || is_float16_family(t.dtype))) {
      ZERO_THROW(InvalidArgument, "'{}': tensor '{}' is {}: a plan needs floating dtypes (F32, F16 or BF16)", path, t.name,
                 dtype_name(t.dtype));
    }
    if (i == 0) m.dtype = t.dtype;
    m.tensors.push_back({t.name, t.shape, 0, true});
    if (t.dtype != m.dtype) m.tensors.back().dtype = t.dtype;
  }
  if (m.tensors.empty()) ZERO_THROW(InvalidArgument, "'{}': no tensors", path);
  assign_units_by_name(m.tensors);
  return m;
}

}  // namespace zero::plan
