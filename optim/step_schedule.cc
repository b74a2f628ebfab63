#include "optim/step_schedule.h"

#include <algorithm>

#include "base/check.h"

namespace zero::optim::detail {

void StepSchedule::begin_step(const OptimizerOptions& options) {
  for (size_t g = 0; g < options.groups.size(); ++g) {
    validate_hyper(options.kind, options.groups[g], static_cast<int>(g));
  }
  for (size_t g = 0; g < options.groups.size(); ++g) {
    // SGD's first step copies the gradient into the momentum buffer (no dampening).
    range_first_[g] = options.kind == OptimizerKind::kSgd && !momentum_initialized_[g];
    if (options.kind == OptimizerKind::kSgd && options.groups[g].momentum != 0.0f) momentum_initialized_[g] = 1;
  }
  ++step_count_;
}

const std::vector<StepCoeffs>& StepSchedule::range_coeffs(const OptimizerOptions& options, size_t begin, size_t end,
                                                          size_t shard_numel, float grad_scale) {
  if (begin > end || end > shard_numel) {
    ZERO_THROW(InvalidArgument, "step_range [{}, {}) is not inside the shard of {} elements", begin, end,
               shard_numel);
  }
  if (step_count_ == 0) ZERO_THROW(InvalidArgument, "step_range() before begin_step()");
  for (size_t g = 0; g < options.groups.size(); ++g) {
    coeffs_[g] = compute_step_coeffs(options.kind, options.groups[g], step_count_, grad_scale, range_first_[g] != 0);
  }
  return coeffs_;
}

void StepSchedule::set_step_count(int64_t steps) {
  if (steps < 0) ZERO_THROW(InvalidArgument, "step_count must be >= 0 (got {})", steps);
  step_count_ = steps;
  std::fill(momentum_initialized_.begin(), momentum_initialized_.end(), static_cast<char>(steps > 0));
}

Hyper& group_at(OptimizerOptions& options, int i) {
  const int n = static_cast<int>(options.groups.size());
  if (i < 0 || i >= n) ZERO_THROW(InvalidArgument, "group index {} out of range [0, {})", i, n);
  return options.groups[static_cast<size_t>(i)];
}

int state_index(const std::vector<std::string>& names, const std::string& name, OptimizerKind kind) {
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i] == name) return static_cast<int>(i);
  }
  std::string known;
  for (const std::string& s : names) known += (known.empty() ? "" : ", ") + s;
  ZERO_THROW(InvalidArgument, "unknown optimizer state '{}' ({} has: {})", name, optimizer_name(kind), known);
}

}  // namespace zero::optim::detail
