#pragma once
// Internal: the table of vectorized kernels of one SIMD path (scalar, AVX2, AVX-512).
//
// Each path is compiled in its own translation unit (kernels_<path>.cc) from the same templates
// (updates.inc through step_kernels.inc, and grad_kernels.inc) with a different vector type, so the
// arithmetic is the same sequence of IEEE operations on every path: fp32 results are bitwise equal.
// Those files are built with -ffp-contract=off so that no multiply-add is fused behind our back (the
// fused ones PyTorch uses are explicit Ops::fma calls).
#include <cstddef>
#include <cstdint>

#include "base/cpu.h"
#include "base/dtype.h"
#include "optim/optimizer.h"
#include "optim/step_coeffs.h"

namespace zero::optim::detail {

// One contiguous range of one group: pointers already point at the range's first element.
struct StepArgs {
  float* master = nullptr;
  const void* grad = nullptr;
  void* state0 = nullptr;  // first state array (exp_avg, momentum_buffer, sum), if any
  void* state1 = nullptr;  // second state array (exp_avg_sq), if any
  void* model_out = nullptr;
  size_t n = 0;
  const StepCoeffs* coeffs = nullptr;
};

using StepFn = void (*)(const StepArgs&);
// Sum over i of double(float(g[i]) * scale)^2, in 16 lanes (lane i % 16) reduced by a fixed tree, so
// every path returns the same double.
using SumOfSquaresFn = double (*)(const void* grad, size_t n, float scale);
using HasInfOrNanFn = bool (*)(const void* grad, size_t n);
using ScaleFn = void (*)(float* x, size_t n, float s);

inline constexpr int kNumGradTypes = 3;   // fp32, fp16, bf16
inline constexpr int kNumStateTypes = 2;  // fp32, bf16
inline constexpr int kNumOutTypes = 4;    // none, fp32, fp16, bf16

struct KernelTable {
  StepFn step[kNumElementwiseKinds][kNumGradTypes][kNumStateTypes][kNumOutTypes] = {};
  SumOfSquaresFn sum_of_squares[kNumGradTypes] = {};
  HasInfOrNanFn has_inf_or_nan[kNumGradTypes] = {};
  ScaleFn scale = nullptr;
};

// Index of a 16/32-bit float type in the tables, or -1 when the table has no entry for it.
inline int grad_type_index(DType t) {
  switch (t) {
    case DType::kFloat32: return 0;
    case DType::kFloat16: return 1;
    case DType::kBFloat16: return 2;
    default: return -1;
  }
}
inline int state_type_index(DType t) {
  return t == DType::kFloat32 ? 0 : t == DType::kBFloat16 ? 1 : -1;
}
// `has_out` false gives 0 (no copy-out).
inline int out_type_index(bool has_out, DType t) {
  if (!has_out) return 0;
  const int g = grad_type_index(t);
  return g < 0 ? -1 : g + 1;
}

// The table of `path`; throws InvalidArgument if this CPU cannot run it.
const KernelTable& kernel_table(SimdPath path);

// One per translation unit.
const KernelTable& kernels_scalar();
const KernelTable& kernels_avx2();
const KernelTable& kernels_avx512();

}  // namespace zero::optim::detail
