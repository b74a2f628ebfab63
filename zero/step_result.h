#pragma once
#include <cstdint>

namespace zero {

// What one Engine::step() did.
struct StepResult {
  int64_t step = 0;           // optimizer steps taken so far (skipped ones excluded)
  bool skipped = false;       // inf/NaN gradients: no update on any rank
  double grad_norm = 0.0;     // global L2 norm of the averaged, unscaled gradient (before clipping)
  float clip_coefficient = 1.0f;
  float loss_scale = 1.0f;    // the scale used for this step's gradients
  int micro_steps = 0;
};

}  // namespace zero
