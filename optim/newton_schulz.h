#pragma once
// Newton-Schulz orthogonalization, Muon's core (Jordan et al. 2024; Moonlight, arXiv 2502.16982):
// the matrix nearest to G with all singular values near 1, by five steps of a quintic iteration
// instead of an SVD:
//
//   X = G / (||G||_F + eps)                 (transposed first when rows > cols, so X X^T is small)
//   repeat steps:  A = X X^T;  X = a X + (b A + c A A) X
//
// with (a, b, c) = (3.4445, -4.7750, 2.0315), which pushes singular values in (0, 1] towards [0.7, 1.2]
// fast rather than exactly to 1. In fp32 on the host (Eigen's matrix products, single-threaded), so
// the result is a pure function of the input's bits: every rank that computes a matrix's update gets
// the same bits, which is what lets the engine hand each matrix to one rank (zero/matrix_exchange.h).
#include <cstddef>

namespace zero::optim {

struct NewtonSchulzOptions {
  int steps = 5;
  float a = 3.4445f, b = -4.7750f, c = 2.0315f;
  float eps = 1e-7f;  // added to the Frobenius norm (a zero matrix stays zero)
  // In bf16, as GPU recipes run it (X = G.bfloat16()): the input, the norm, and the result of every
  // operation rounded to bf16 (to nearest even), products accumulated in fp32, as bf16 matrix units
  // compute them:  A = bf(X X^T);  B = bf(bf(b A) + bf(c bf(A A)));  X = bf(bf(a X) + bf(B X)).
  // The result is bf16 values in fp32. Emulated here (no faster than fp32 on a CPU): for parity
  // with a bf16 run elsewhere, not for speed.
  bool bf16 = false;
};

// out = NS(g) for a rows x cols row-major matrix; out may equal g. Throws InvalidArgument for a zero
// dimension or steps < 0.
void newton_schulz(const float* g, size_t rows, size_t cols, float* out, const NewtonSchulzOptions& options = {});

// The multiply-add count of newton_schulz on a rows x cols matrix, times two (FLOPs): what the
// engine balances when it hands matrices to ranks.
double newton_schulz_flops(size_t rows, size_t cols, int steps);

}  // namespace zero::optim
