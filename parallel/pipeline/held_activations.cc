#include "parallel/pipeline/held_activations.h"

#include <algorithm>
#include <cmath>

#include "base/check.h"

namespace zero::parallel {

void check_held_bytes(const HeldBytes& held, int virtual_stages) {
  const std::pair<const char*, const std::vector<double>*> fields[] = {
      {"forward", &held.forward}, {"weight", &held.weight}, {"rebuilt", &held.rebuilt},
      {"input_peak", &held.input_peak}};
  for (const auto& [name, v] : fields) {
    if (v->size() != 1 && v->size() != static_cast<size_t>(virtual_stages)) {
      ZERO_THROW(InvalidArgument, "held activations: {} values of HeldBytes.{} for {} virtual stages (give 1 or {})",
                 v->size(), name, virtual_stages, virtual_stages);
    }
    for (double x : *v) {
      if (!(x >= 0) || !std::isfinite(x)) ZERO_THROW(InvalidArgument, "held activations: HeldBytes.{} has {}", name, x);
    }
  }
}

HeldTracker::HeldTracker(const Schedule& schedule, const HeldBytes& held, int rank)
    : s_(schedule), held_(held), rank_(rank) {}

double HeldTracker::high_water(const Action& a) const {
  const int k = s_.virtual_stage(rank_, a.chunk);
  switch (a.op) {
    case Op::kF: return now_ + held_.forward_of(k);
    case Op::kB: return std::max(now_ + held_.input_peak_of(k), now_ - held_.forward_of(k) + held_.weight_of(k));
    case Op::kBW: return now_ + held_.rebuilt_of(k);
    default: return now_;
  }
}

void HeldTracker::apply(const Action& a) {
  const int k = s_.virtual_stage(rank_, a.chunk);
  peak_ = std::max(peak_, high_water(a));
  switch (a.op) {
    case Op::kF: now_ += held_.forward_of(k); break;
    case Op::kB: now_ += held_.weight_of(k) - held_.forward_of(k); break;
    case Op::kW: now_ -= held_.weight_of(k); break;
    case Op::kBW: now_ -= held_.forward_of(k); break;
    default: break;
  }
}

std::vector<double> peak_held(const Schedule& s, const HeldBytes& held) {
  check_held_bytes(held, s.virtual_stages());
  std::vector<double> out;
  for (int r = 0; r < s.ranks; ++r) {
    HeldTracker t(s, held, r);
    for (const Action& a : s.actions[static_cast<size_t>(r)]) t.apply(a);
    out.push_back(t.peak());
  }
  return out;
}

}  // namespace zero::parallel
