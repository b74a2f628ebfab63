// Scalar path: the reference arithmetic every vector path reproduces bit for bit.
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "base/dtype.h"
#include "optim/kernels.h"
#include "optim/step_coeffs.h"

#include "optim/scalar_ops.inc"
#include "optim/step_kernels.inc"
#include "optim/grad_kernels.inc"

namespace zero::optim::detail {
namespace {

template <class G>
double sum_of_squares_scalar(const void* grad, size_t n, float scale) {
  double lanes[kSumLanes] = {};
  sum_of_squares_tail(static_cast<const G*>(grad), 0, n, scale, lanes);
  return reduce_lanes(lanes);
}

template <class G>
bool has_inf_or_nan_scalar(const void* grad, size_t n) {
  return has_inf_or_nan_tail(static_cast<const G*>(grad), 0, n);
}

void scale_scalar(float* x, size_t n, float s) { scale_tail(x, 0, n, s); }

KernelTable make_scalar_table() {
  KernelTable t;
  fill_step_kernels<ScalarOps>(t);
  t.sum_of_squares[0] = &sum_of_squares_scalar<float>;
  t.sum_of_squares[1] = &sum_of_squares_scalar<Half>;
  t.sum_of_squares[2] = &sum_of_squares_scalar<BFloat16>;
  t.has_inf_or_nan[0] = &has_inf_or_nan_scalar<float>;
  t.has_inf_or_nan[1] = &has_inf_or_nan_scalar<Half>;
  t.has_inf_or_nan[2] = &has_inf_or_nan_scalar<BFloat16>;
  t.scale = &scale_scalar;
  return t;
}

}  // namespace

const KernelTable& kernels_scalar() {
  static const KernelTable table = make_scalar_table();
  return table;
}

}  // namespace zero::optim::detail
