#pragma once
// Learning-rate schedules: optional linear warm-up, then constant, cosine or linear decay to min_lr.
//
// `step` is the 0-based index of the step about to be taken (Optimizer::step_count() before it):
//   step < warmup_steps:  base_lr * (step + 1) / warmup_steps   (the first step is not wasted at 0)
//   "constant":           base_lr
//   "warmup_cosine":      min_lr + (base_lr - min_lr) * (1 + cos(pi * progress)) / 2
//   "warmup_linear":      min_lr + (base_lr - min_lr) * (1 - progress)
// with progress = (step - warmup_steps) / (total_steps - warmup_steps), clamped to [0, 1] (so min_lr
// from total_steps on). Evaluated in double.
#include <cstdint>
#include <string>

namespace zero::optim {

struct LrScheduleOptions {
  std::string kind = "constant";  // constant, warmup_cosine, warmup_linear
  float base_lr = 1e-3f;
  int64_t warmup_steps = 0;
  int64_t total_steps = 0;  // decaying kinds: the step at which min_lr is reached (> warmup_steps)
  float min_lr = 0.f;
};

// InvalidArgument naming the field: unknown kind, base_lr < 0 or not finite, warmup_steps < 0,
// min_lr outside [0, base_lr] (decaying kinds), total_steps <= warmup_steps (decaying kinds).
void validate_lr_schedule(const LrScheduleOptions& options);

// Validates the options and step (>= 0), then returns the learning rate.
float lr_at(const LrScheduleOptions& options, int64_t step);

}  // namespace zero::optim
