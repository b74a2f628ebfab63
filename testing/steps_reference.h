#pragma once
// The part every per-step training reference of scripts/*_reference.py shares (LAMB's, Muon's): the
// initial tensors, each step's gradient of each data-parallel rank and the tensors after each step,
// all by name, flattened row-major, as written by those scripts.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace zero::testing {

using Tensors = std::map<std::string, std::vector<float>>;

struct StepsReference {
  Tensors initial;
  std::vector<std::vector<Tensors>> grads;  // [step][rank]
  std::vector<Tensors> after;               // [step]
};

// The largest |got[e] - want[e]| over the elements, relative to the largest |want[e]|.
inline double relative_error(const float* got, const std::vector<float>& want) {
  double diff = 0.0, largest = 0.0;
  for (size_t e = 0; e < want.size(); ++e) {
    diff = std::max(diff, std::fabs(static_cast<double>(got[e]) - want[e]));
    largest = std::max(largest, std::fabs(static_cast<double>(want[e])));
  }
  return largest == 0.0 ? diff : diff / largest;
}

// The inputs of the references that generate them (adamw8bit_reference.py, adafactor_reference.py):
// multiples of 1/1000 in [-1, 1] times scale, in float, from a seed.
inline std::vector<float> pattern(int64_t seed, size_t n, float scale) {
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t k = (static_cast<int64_t>(i) * 2654435761LL + seed * 40503) % 2003 - 1001;
    out[i] = static_cast<float>(k) / 1000.0f * scale;
  }
  return out;
}

inline Tensors tensors_of(const nlohmann::json& j) {
  Tensors out;
  for (const auto& [name, values] : j.items()) out[name] = values.get<std::vector<float>>();
  return out;
}

// The scripts' tensors in four units: "emb" alone, "h0.*", "h1.*", and the rest together.
inline int reference_unit_of(const std::string& name) {
  if (name == "emb") return 0;
  if (name.rfind("h0.", 0) == 0) return 1;
  if (name.rfind("h1.", 0) == 0) return 2;
  return 3;
}

// `j`'s "initial_params", "grads_per_step_per_rank" and "params_after_step".
inline StepsReference steps_reference(const nlohmann::json& j) {
  StepsReference r;
  r.initial = tensors_of(j.at("initial_params"));
  for (const auto& step : j.at("grads_per_step_per_rank")) {
    r.grads.emplace_back();
    for (const auto& rank : step) r.grads.back().push_back(tensors_of(rank));
  }
  for (const auto& step : j.at("params_after_step")) r.after.push_back(tensors_of(step));
  return r;
}

}  // namespace zero::testing
