#pragma once
// Dynamic loss scaling for fp16 training, with DeepSpeed's semantics (deepspeed.runtime.fp16.
// loss_scaler.DynamicLossScaler):
//  - every step whose gradients hold an Inf/NaN is skipped;
//  - an overflow first consumes hysteresis (the scale is kept while more than one unit is left); once
//    one unit is left, each overflow multiplies the scale by backoff_factor (not below min_scale);
//  - growth_interval good steps in a row (counted since the last overflow or growth) multiply the
//    scale by growth_factor and restore the hysteresis;
//  - with consecutive_hysteresis, every good step restores the hysteresis, so only overflows in a row
//    consume it (DeepSpeed's option of that name; off by default there and here).
#include <cstdint>

namespace zero::optim {

struct LossScalerOptions {
  float initial_scale = 65536.f;  // 2^16
  float growth_factor = 2.f;
  float backoff_factor = 0.5f;
  int growth_interval = 2000;
  int hysteresis = 2;
  float min_scale = 1.f;
  bool consecutive_hysteresis = false;
};

// Everything a checkpoint needs to resume the scaler exactly.
struct LossScalerState {
  float scale = 65536.f;
  int64_t good_steps_since_growth = 0;
  int hysteresis_left = 2;
  int64_t skipped_steps = 0;
  int64_t steps = 0;
};

class DynamicLossScaler {
 public:
  // Validates the options (initial_scale > 0 and finite, growth_factor >= 1, backoff_factor in (0, 1],
  // growth_interval >= 1, hysteresis >= 1, 0 < min_scale <= initial_scale); InvalidArgument names the
  // field.
  explicit DynamicLossScaler(LossScalerOptions options = {});

  float scale() const { return state_.scale; }
  float inv_scale() const { return 1.0f / state_.scale; }

  // Records the outcome of one step (found_inf: the gradients, summed over ranks, held an Inf/NaN).
  // Returns true when the step must be skipped (exactly when found_inf).
  bool update(bool found_inf);

  int64_t skipped_steps() const { return state_.skipped_steps; }
  int64_t good_steps_since_growth() const { return state_.good_steps_since_growth; }
  int hysteresis_left() const { return state_.hysteresis_left; }
  int64_t steps() const { return state_.steps; }  // update() calls

  const LossScalerOptions& options() const { return options_; }
  const LossScalerState& state() const { return state_; }
  void set_state(const LossScalerState& state);  // validated like the options

 private:
  LossScalerOptions options_;
  LossScalerState state_;
};

}  // namespace zero::optim
