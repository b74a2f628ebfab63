#include "optim/grad_utils.h"

#include "base/check.h"
#include "optim/kernels.h"

namespace zero::optim {

namespace {

int checked_grad_index(DType dtype, const char* fn) {
  const int i = detail::grad_type_index(dtype);
  if (i < 0) {
    ZERO_THROW(InvalidArgument, "{}: dtype must be fp32, fp16 or bf16 (got {})", fn, dtype_name(dtype));
  }
  return i;
}

void check_data(const void* p, size_t n, const char* fn) {
  if (p == nullptr && n > 0) ZERO_THROW(InvalidArgument, "{}: null data with n = {}", fn, n);
}

}  // namespace

double sum_of_squares(const void* grad, DType dtype, size_t n, float scale, SimdPath path) {
  const int i = checked_grad_index(dtype, "sum_of_squares");
  check_data(grad, n, "sum_of_squares");
  return detail::kernel_table(path).sum_of_squares[i](grad, n, scale);
}

double sum_of_squares(const void* grad, DType dtype, size_t n, float scale) {
  return sum_of_squares(grad, dtype, n, scale, best_simd_path());
}

bool has_inf_or_nan(const void* grad, DType dtype, size_t n, SimdPath path) {
  const int i = checked_grad_index(dtype, "has_inf_or_nan");
  check_data(grad, n, "has_inf_or_nan");
  return detail::kernel_table(path).has_inf_or_nan[i](grad, n);
}

bool has_inf_or_nan(const void* grad, DType dtype, size_t n) {
  return has_inf_or_nan(grad, dtype, n, best_simd_path());
}

void scale_in_place(float* x, size_t n, float s, SimdPath path) {
  check_data(x, n, "scale_in_place");
  detail::kernel_table(path).scale(x, n, s);
}

void scale_in_place(float* x, size_t n, float s) { scale_in_place(x, n, s, best_simd_path()); }

float clip_coefficient(double total_norm, double max_norm) {
  if (!(max_norm > 0.0)) return 1.0f;
  // max_norm / (total_norm + 1e-6), clamped to 1, in double and rounded once: the engine's
  // coefficient, whose bits deterministic runs depend on (PyTorch forms it in the gradients'
  // float32, which can differ in the last bit). An infinite norm gives 0 and a NaN norm gives NaN.
  const double coef = max_norm / (total_norm + 1e-6);
  return coef > 1.0 ? 1.0f : static_cast<float>(coef);
}

}  // namespace zero::optim
