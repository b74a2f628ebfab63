#include "optim/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "base/check.h"

namespace zero::optim {

namespace {
enum class Kind { kConstant, kCosine, kLinear };

Kind parse_kind(const std::string& kind) {
  if (kind == "constant") return Kind::kConstant;
  if (kind == "warmup_cosine") return Kind::kCosine;
  if (kind == "warmup_linear") return Kind::kLinear;
  ZERO_THROW(InvalidArgument, "kind: unknown LR schedule '{}' (expected constant, warmup_cosine or "
             "warmup_linear)", kind);
}
}  // namespace

void validate_lr_schedule(const LrScheduleOptions& o) {
  const Kind kind = parse_kind(o.kind);
  if (!(std::isfinite(o.base_lr) && o.base_lr >= 0.0f)) {
    ZERO_THROW(InvalidArgument, "base_lr must be finite and >= 0 (got {})", o.base_lr);
  }
  if (o.warmup_steps < 0) {
    ZERO_THROW(InvalidArgument, "warmup_steps must be >= 0 (got {})", o.warmup_steps);
  }
  if (kind == Kind::kConstant) return;
  if (!(std::isfinite(o.min_lr) && o.min_lr >= 0.0f && o.min_lr <= o.base_lr)) {
    ZERO_THROW(InvalidArgument, "min_lr must be in [0, base_lr = {}] (got {})", o.base_lr, o.min_lr);
  }
  if (o.total_steps <= o.warmup_steps) {
    ZERO_THROW(InvalidArgument, "total_steps ({}) must be > warmup_steps ({}) for '{}'",
               o.total_steps, o.warmup_steps, o.kind);
  }
}

float lr_at(const LrScheduleOptions& o, int64_t step) {
  validate_lr_schedule(o);
  if (step < 0) ZERO_THROW(InvalidArgument, "step must be >= 0 (got {})", step);
  const Kind kind = parse_kind(o.kind);
  const double base = o.base_lr;
  if (step < o.warmup_steps) {
    return static_cast<float>(base * static_cast<double>(step + 1) /
                              static_cast<double>(o.warmup_steps));
  }
  if (kind == Kind::kConstant) return o.base_lr;
  const double progress =
      std::clamp(static_cast<double>(step - o.warmup_steps) /
                     static_cast<double>(o.total_steps - o.warmup_steps),
                 0.0, 1.0);
  const double lo = o.min_lr;
  const double factor = kind == Kind::kCosine ? 0.5 * (1.0 + std::cos(std::numbers::pi * progress))
                                              : 1.0 - progress;
  return static_cast<float>(lo + (base - lo) * factor);
}

}  // namespace zero::optim
