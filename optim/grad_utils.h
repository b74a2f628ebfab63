#pragma once
// Gradient helpers the engine combines with communication: the local sum of squares of a gradient
// shard (for a global norm: all-reduce the sums, then sqrt), Inf/NaN detection (for the loss scaler),
// and an in-place scale. Vectorized with the path chosen at run time; results do not depend on it.
#include <cstddef>

#include "base/cpu.h"
#include "base/dtype.h"

namespace zero::optim {

// Sum over i of (grad[i] * scale)^2: each product is formed in fp32 (as the optimizer step sees it),
// squared and accumulated in double in 16 lanes reduced by a fixed tree, so every SIMD path returns
// the same value. dtype: fp32, fp16 or bf16 (else InvalidArgument). Inf/NaN propagate.
double sum_of_squares(const void* grad, DType dtype, size_t n, float scale = 1.0f);
double sum_of_squares(const void* grad, DType dtype, size_t n, float scale, SimdPath path);

// True if any element is +-Inf or NaN.
bool has_inf_or_nan(const void* grad, DType dtype, size_t n);
bool has_inf_or_nan(const void* grad, DType dtype, size_t n, SimdPath path);

// x[i] *= s (fp32 multiply, the same bits on every path).
void scale_in_place(float* x, size_t n, float s);
void scale_in_place(float* x, size_t n, float s, SimdPath path);

// The clip coefficient of torch.nn.utils.clip_grad_norm_: min(1, max_norm / (total_norm + 1e-6)),
// computed in double and rounded to float once (an infinite norm gives 0, NaN gives NaN), or 1 when
// max_norm <= 0 (clipping off). The engine's (zero/sharded_update). Multiply it into
// StepInput::grad_scale.
float clip_coefficient(double total_norm, double max_norm);

}  // namespace zero::optim
