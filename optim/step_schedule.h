#pragma once
// Internal: the step bookkeeping optim::Optimizer and optim::cuda::CudaOptimizer share, so that both
// count steps, create SGD's momentum buffers lazily and compute each group's coefficients the same
// way. Implemented in step_schedule.cc. Not part of the public API.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "optim/optimizer.h"
#include "optim/step_coeffs.h"

namespace zero::optim::detail {

class StepSchedule {
 public:
  explicit StepSchedule(size_t num_groups = 0)
      : momentum_initialized_(num_groups, 0), range_first_(num_groups, 0), coeffs_(num_groups) {}

  // Validates every group's hyperparameters first (a bad group leaves every group's SGD state as it
  // was), then counts the step and settles which SGD groups take their first-step form.
  void begin_step(const OptimizerOptions& options);
  // The current step's coefficients of every group (indexed by group), for a range of the shard
  // [begin, end) of `shard_numel`; throws InvalidArgument for a range outside the shard or before
  // begin_step().
  const std::vector<StepCoeffs>& range_coeffs(const OptimizerOptions& options, size_t begin, size_t end,
                                              size_t shard_numel, float grad_scale);

  int64_t step_count() const { return step_count_; }
  // For checkpoint loading. Also tells SGD whether its momentum buffers exist (steps > 0).
  void set_step_count(int64_t steps);

 private:
  int64_t step_count_ = 0;
  std::vector<char> momentum_initialized_;  // per group (SGD): PyTorch creates the buffer lazily
  std::vector<char> range_first_;           // per group: begin_step() saw SGD's first step
  std::vector<StepCoeffs> coeffs_;          // per group, refilled by every range_coeffs()
};

// options.groups[i], or InvalidArgument naming the range.
Hyper& group_at(OptimizerOptions& options, int i);
// The index of `name` in `names` (the optimizer's state arrays), or InvalidArgument listing them.
int state_index(const std::vector<std::string>& names, const std::string& name, OptimizerKind kind);

}  // namespace zero::optim::detail
