#include "optim/newton_schulz.h"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>

#include "base/check.h"
#include "base/float16.h"

namespace zero::optim {

namespace {
using Matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

float bf16(float v) { return bf16_bits_to_fp32(fp32_to_bf16_bits(v)); }

// Every element rounded to bf16 (to nearest even).
void round_bf16(Matrix& m) {
  for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = bf16(m.data()[i]);
}

// The bf16 iteration (NewtonSchulzOptions::bf16): each operation's result rounded.
void iterate_bf16(Matrix& x, const NewtonSchulzOptions& o) {
  Matrix a, aa, b, bx;
  for (int k = 0; k < o.steps; ++k) {
    a.noalias() = x * x.transpose();
    round_bf16(a);
    aa.noalias() = a * a;
    round_bf16(aa);
    b.resize(a.rows(), a.cols());
    for (Eigen::Index i = 0; i < a.size(); ++i) {
      b.data()[i] = bf16(bf16(o.b * a.data()[i]) + bf16(o.c * aa.data()[i]));
    }
    bx.noalias() = b * x;
    round_bf16(bx);
    for (Eigen::Index i = 0; i < x.size(); ++i) x.data()[i] = bf16(bf16(o.a * x.data()[i]) + bx.data()[i]);
  }
}
}  // namespace

void newton_schulz(const float* g, size_t rows, size_t cols, float* out, const NewtonSchulzOptions& o) {
  if (rows == 0 || cols == 0) ZERO_THROW(InvalidArgument, "newton_schulz: a {} x {} matrix has no elements", rows, cols);
  if (o.steps < 0) ZERO_THROW(InvalidArgument, "newton_schulz: steps must be >= 0 (got {})", o.steps);
  const auto r = static_cast<Eigen::Index>(rows), c = static_cast<Eigen::Index>(cols);
  Eigen::Map<const Matrix> in(g, r, c);
  const bool tall = rows > cols;
  Matrix x = tall ? Matrix(in.transpose()) : Matrix(in);
  if (o.bf16) round_bf16(x);
  // The norm in double (the sum of squares of a large matrix loses digits in fp32), rounded once.
  double sum = 0.0;
  for (Eigen::Index i = 0; i < x.size(); ++i) sum += static_cast<double>(x.data()[i]) * x.data()[i];
  const float norm = static_cast<float>(std::sqrt(sum));
  if (o.bf16) {
    const float d = bf16(bf16(norm) + o.eps);
    for (Eigen::Index i = 0; i < x.size(); ++i) x.data()[i] = bf16(x.data()[i] / d);
    iterate_bf16(x, o);
  } else {
    x /= norm + o.eps;
  }
  Matrix a, b;
  for (int k = 0; k < (o.bf16 ? 0 : o.steps); ++k) {
    a.noalias() = x * x.transpose();
    b.noalias() = o.c * (a * a);
    b += o.b * a;
    Matrix next = o.a * x;
    next.noalias() += b * x;
    x.swap(next);
  }
  Eigen::Map<Matrix> result(out, r, c);
  if (tall) {
    result = x.transpose();
  } else {
    result = x;
  }
}

double newton_schulz_flops(size_t rows, size_t cols, int steps) {
  const double m = static_cast<double>(std::min(rows, cols)), n = static_cast<double>(std::max(rows, cols));
  // Per step: X X^T (m x n x m), A A (m^3), B X (m x m x n); two FLOPs per multiply-add.
  return 2.0 * steps * (2.0 * m * m * n + m * m * m);
}

}  // namespace zero::optim
