#pragma once
// The optimizer kinds, on their own so that CUDA sources can name them without the rest of
// optimizer.h.

namespace zero::optim {

// The elementwise rules first (their kernels are tables indexed by kind), then Muon, which
// orthogonalizes each matrix's update whole (zero/matrix_exchange.h gathers it where it is sharded).
enum class OptimizerKind { kAdamW, kAdam, kSgd, kAdagrad, kLion, kMuon };
inline constexpr int kNumElementwiseKinds = 5;
inline constexpr int kNumOptimizerKinds = 6;

constexpr bool is_elementwise(OptimizerKind kind) { return static_cast<int>(kind) < kNumElementwiseKinds; }

}  // namespace zero::optim
