#include "parallel/tensor/vocab_parallel.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "base/check.h"

namespace zero::parallel {
namespace {

using zero::DType;
using comm::ReduceOp;

void check_tokens(const char* what, const VocabRange& range, const int* tokens, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (tokens[i] < 0 || tokens[i] >= range.vocab) {
      ZERO_THROW(InvalidArgument, "{}: token {} at position {} is outside the vocabulary [0, {})", what,
                 tokens[i], i, range.vocab);
    }
  }
}

}  // namespace

int64_t VocabRange::real_rows() const { return std::clamp<int64_t>(vocab - begin, 0, rows()); }

int64_t padded_vocab(int64_t vocab, int tp, int64_t multiple) {
  const int64_t unit = static_cast<int64_t>(tp) * multiple;
  return (vocab + unit - 1) / unit * unit;
}

VocabRange vocab_range(int64_t vocab, int tp_rank, int tp, int64_t multiple) {
  if (vocab < 1) ZERO_THROW(InvalidArgument, "vocabulary parallelism: vocabulary size {} is not positive", vocab);
  if (tp < 1 || multiple < 1) {
    ZERO_THROW(InvalidArgument, "vocabulary parallelism: tp {} and multiple {} must be positive", tp, multiple);
  }
  if (tp_rank < 0 || tp_rank >= tp) {
    ZERO_THROW(InvalidArgument, "vocabulary parallelism: tp rank {} is outside [0, {})", tp_rank, tp);
  }
  VocabRange r;
  r.vocab = vocab;
  r.padded = padded_vocab(vocab, tp, multiple);
  const int64_t rows = r.padded / tp;
  r.begin = rows * tp_rank;
  r.end = r.begin + rows;
  return r;
}

void vocab_embedding_forward(const VocabRange& range, const float* table, int64_t dim, const int* tokens,
                             size_t n, float* out) {
  check_tokens("vocab-parallel embedding", range, tokens, n);
  const auto d = static_cast<size_t>(dim);
  for (size_t i = 0; i < n; ++i) {
    float* row = out + i * d;
    if (tokens[i] >= range.begin && tokens[i] < range.end) {
      std::copy_n(table + static_cast<size_t>(tokens[i] - range.begin) * d, d, row);
    } else {
      std::fill_n(row, d, 0.0f);
    }
  }
}

void vocab_embedding_backward(const VocabRange& range, const int* tokens, size_t n, int64_t dim,
                              const float* grad_out, float* grad_table) {
  const auto d = static_cast<size_t>(dim);
  for (size_t i = 0; i < n; ++i) {
    if (tokens[i] < range.begin || tokens[i] >= range.end) continue;
    float* g = grad_table + static_cast<size_t>(tokens[i] - range.begin) * d;
    const float* src = grad_out + i * d;
    for (size_t j = 0; j < d; ++j) g[j] += src[j];
  }
}

float VocabParallelCrossEntropy::forward(comm::Communicator& tp, const VocabRange& range, const float* logits,
                                         const int* targets, size_t n) {
  check_tokens("vocab-parallel cross-entropy: target", range, targets, n);
  range_ = range;
  targets_.assign(targets, targets + n);
  const auto rows = static_cast<size_t>(range.rows());
  const auto real = static_cast<size_t>(range.real_rows());
  // 1. The row maximum over the real columns, for a stable exponent.
  std::vector<float> row_max(n, -std::numeric_limits<float>::infinity());
  for (size_t i = 0; i < n; ++i) {
    const float* z = logits + i * rows;
    for (size_t v = 0; v < real; ++v) row_max[i] = std::max(row_max[i], z[v]);
  }
  tp.all_reduce(row_max.data(), n, DType::kFloat32, ReduceOp::kMax)->wait();
  // 2. The sum of exponentials, and 3. the target's logit (from the rank that owns it).
  probs_.assign(n * rows, 0.0f);
  std::vector<float> sums(2 * n, 0.0f);  // [exp sums | target logits]: one all-reduce for both
  for (size_t i = 0; i < n; ++i) {
    const float* z = logits + i * rows;
    float* p = probs_.data() + i * rows;
    float sum = 0.0f;
    for (size_t v = 0; v < real; ++v) {
      p[v] = std::exp(z[v] - row_max[i]);
      sum += p[v];
    }
    sums[i] = sum;
    const int64_t t = targets[i];
    if (t >= range.begin && t < range.end) sums[n + i] = z[t - range.begin] - row_max[i];
  }
  tp.all_reduce(sums.data(), 2 * n, DType::kFloat32, ReduceOp::kSum)->wait();
  double loss = 0.0;
  for (size_t i = 0; i < n; ++i) {
    const float inv = 1.0f / sums[i];
    float* p = probs_.data() + i * rows;
    for (size_t v = 0; v < real; ++v) p[v] *= inv;
    loss += std::log(sums[i]) - sums[n + i];
  }
  return n == 0 ? 0.0f : static_cast<float>(loss / static_cast<double>(n));
}

void VocabParallelCrossEntropy::backward(float scale, float* grad_logits) const {
  const size_t n = targets_.size();
  const auto rows = static_cast<size_t>(range_.rows());
  const float k = n == 0 ? 0.0f : scale / static_cast<float>(n);
  for (size_t i = 0; i < n; ++i) {
    const float* p = probs_.data() + i * rows;
    float* g = grad_logits + i * rows;
    for (size_t v = 0; v < rows; ++v) g[v] = p[v] * k;  // padding: p = 0
    const int64_t t = targets_[i];
    if (t >= range_.begin && t < range_.end) g[t - range_.begin] -= k;
  }
}

}  // namespace zero::parallel
