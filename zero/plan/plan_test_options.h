#pragma once
// The engine options the planner's tests plan with (zero/plan and parallel/tensor): AdamW, clipping,
// 64 Ki-element buckets.
#include <chrono>
#include <cstddef>

#include "zero/engine_options.h"

namespace zero::plan {

inline EngineOptions plan_test_options(int stage) {
  EngineOptions o;
  o.stage = stage;
  o.optimizer.kind = optim::OptimizerKind::kAdamW;
  o.optimizer.groups = {optim::Hyper{.lr = 1e-3f}};
  o.max_grad_norm = 1.0f;
  o.layout.bucket_numel = size_t{1} << 16;
  o.timeout = std::chrono::seconds(60);
  return o;
}

}  // namespace zero::plan
