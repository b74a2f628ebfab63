#include "optim/loss_scaler.h"

#include <cmath>

#include "base/check.h"

namespace zero::optim {

DynamicLossScaler::DynamicLossScaler(LossScalerOptions o) : options_(o) {
  if (!(std::isfinite(o.initial_scale) && o.initial_scale > 0.0f)) {
    ZERO_THROW(InvalidArgument, "initial_scale must be finite and > 0 (got {})", o.initial_scale);
  }
  if (!(std::isfinite(o.growth_factor) && o.growth_factor >= 1.0f)) {
    ZERO_THROW(InvalidArgument, "growth_factor must be finite and >= 1 (got {})", o.growth_factor);
  }
  if (!(o.backoff_factor > 0.0f && o.backoff_factor <= 1.0f)) {
    ZERO_THROW(InvalidArgument, "backoff_factor must be in (0, 1] (got {})", o.backoff_factor);
  }
  if (o.growth_interval < 1) {
    ZERO_THROW(InvalidArgument, "growth_interval must be >= 1 (got {})", o.growth_interval);
  }
  if (o.hysteresis < 1) ZERO_THROW(InvalidArgument, "hysteresis must be >= 1 (got {})", o.hysteresis);
  if (!(std::isfinite(o.min_scale) && o.min_scale > 0.0f && o.min_scale <= o.initial_scale)) {
    ZERO_THROW(InvalidArgument, "min_scale must be in (0, initial_scale = {}] (got {})",
               o.initial_scale, o.min_scale);
  }
  state_.scale = o.initial_scale;
  state_.hysteresis_left = o.hysteresis;
}

bool DynamicLossScaler::update(bool found_inf) {
  ++state_.steps;
  if (found_inf) {
    ++state_.skipped_steps;
    if (state_.hysteresis_left <= 1) {
      const float next = state_.scale * options_.backoff_factor;
      state_.scale = next < options_.min_scale ? options_.min_scale : next;
    } else {
      --state_.hysteresis_left;
    }
    state_.good_steps_since_growth = 0;
    return true;
  }
  if (options_.consecutive_hysteresis) state_.hysteresis_left = options_.hysteresis;
  if (++state_.good_steps_since_growth >= options_.growth_interval) {
    state_.good_steps_since_growth = 0;
    state_.hysteresis_left = options_.hysteresis;
    const float next = state_.scale * options_.growth_factor;
    if (std::isfinite(next)) state_.scale = next;  // stay finite: an Inf scale would make every step overflow
  }
  return false;
}

void DynamicLossScaler::set_state(const LossScalerState& s) {
  if (!(std::isfinite(s.scale) && s.scale > 0.0f)) {
    ZERO_THROW(InvalidArgument, "LossScalerState.scale must be finite and > 0 (got {})", s.scale);
  }
  if (s.good_steps_since_growth < 0 || s.skipped_steps < 0 || s.steps < 0 || s.hysteresis_left < 0) {
    ZERO_THROW(InvalidArgument,
               "LossScalerState counters must be >= 0 (good_steps_since_growth {}, skipped_steps {}, "
               "steps {}, hysteresis_left {})",
               s.good_steps_since_growth, s.skipped_steps, s.steps, s.hysteresis_left);
  }
  state_ = s;
}

}  // namespace zero::optim
