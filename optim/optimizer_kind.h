#pragma once
// The optimizer kinds, on their own so that CUDA sources can name them without the rest of
// optimizer.h.

namespace zero::optim {

// The elementwise rules first (their kernels are tables indexed by kind), then the rules that are
// not elementwise over a flat shard: Muon, which orthogonalizes each matrix's update whole
// (zero/matrix_exchange.h gathers it where it is sharded), 8-bit AdamW, whose state is quantized
// per block of each tensor (optim/adamw8bit.h), and Adafactor, whose statistics are sums over each
// tensor's rows and columns (zero/adafactor_stats.h reduces them over the ranks).
enum class OptimizerKind { kAdamW, kAdam, kSgd, kAdagrad, kLion, kMuon, kAdamW8bit, kAdafactor };
inline constexpr int kNumElementwiseKinds = 5;
inline constexpr int kNumOptimizerKinds = 8;

constexpr bool is_elementwise(OptimizerKind kind) { return static_cast<int>(kind) < kNumElementwiseKinds; }
// The kinds whose step needs each tensor inside one bucket (the layout keeps them whole there).
constexpr bool needs_whole_matrices(OptimizerKind kind) {
  return kind == OptimizerKind::kMuon || kind == OptimizerKind::kAdafactor;
}

}  // namespace zero::optim
