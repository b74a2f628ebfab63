#pragma once
// The optimizer kinds, on their own so that CUDA sources can name them without the rest of
// optimizer.h.

namespace zero::optim {

enum class OptimizerKind { kAdamW, kAdam, kSgd, kAdagrad, kLion };
inline constexpr int kNumOptimizerKinds = 5;

}  // namespace zero::optim
