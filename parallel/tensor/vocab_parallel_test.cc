#include "parallel/tensor/vocab_parallel.h"

#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "base/error.h"
#include "testing/thread_ranks.h"

namespace zero::parallel {
namespace {

TEST_CASE("the vocabulary is padded to a multiple of tp and cut into equal row ranges") {
  CHECK(padded_vocab(10, 4) == 12);
  CHECK(padded_vocab(12, 4) == 12);
  CHECK(padded_vocab(50257, 2, 64) == 50304);
  const VocabRange r3 = vocab_range(10, 3, 4);
  CHECK(r3.begin == 9);
  CHECK(r3.end == 12);
  CHECK(r3.real_rows() == 1);
  CHECK(vocab_range(5, 3, 4).real_rows() == 0);  // V = 5 padded to 8: rank 3 holds padding only
  CHECK(vocab_range(10, 0, 4).real_rows() == 3);
  CHECK_THROWS_WITH_AS(vocab_range(10, 4, 4), doctest::Contains("tp rank 4 is outside [0, 4)"), InvalidArgument);
  CHECK_THROWS_WITH_AS(vocab_range(0, 0, 2), doctest::Contains("vocabulary size 0"), InvalidArgument);
}

constexpr int64_t kVocab = 10, kDim = 3;
constexpr float kPoison = 1e30f;  // in every padding row: must reach nothing

// Rank `range`'s rows of the table whose row v is (v, v + 0.5, -v); padding rows poisoned.
std::vector<float> local_table(const VocabRange& range) {
  std::vector<float> t(static_cast<size_t>(range.rows() * kDim));
  for (int64_t v = range.begin; v < range.end; ++v) {
    float* row = t.data() + (v - range.begin) * kDim;
    const bool pad = v >= kVocab;
    row[0] = pad ? kPoison : static_cast<float>(v);
    row[1] = pad ? kPoison : static_cast<float>(v) + 0.5f;
    row[2] = pad ? kPoison : -static_cast<float>(v);
  }
  return t;
}

TEST_CASE("the vocab-parallel embedding summed over tp equals the whole table's lookup") {
  const std::vector<int> tokens = {0, 9, 3, 3, 7, 1, 8};
  for (int tp : {1, 2, 3, 4}) {
    CAPTURE(tp);
    testing::run_thread_ranks(tp, [&](comm::Communicator& comm) {
      const VocabRange range = vocab_range(kVocab, comm.rank(), tp);
      const std::vector<float> table = local_table(range);
      std::vector<float> out(tokens.size() * kDim, -1.0f);
      vocab_embedding_forward(range, table.data(), kDim, tokens.data(), tokens.size(), out.data());
      comm.all_reduce(out.data(), out.size(), DType::kFloat32, comm::ReduceOp::kSum)->wait();
      for (size_t i = 0; i < tokens.size(); ++i) {
        CHECK(out[i * kDim] == static_cast<float>(tokens[i]));
        CHECK(out[i * kDim + 1] == static_cast<float>(tokens[i]) + 0.5f);
      }
      // Backward: each owned row gets the sum of its positions' gradients; the rest stays 0.
      std::vector<float> grad_out(tokens.size() * kDim);
      for (size_t i = 0; i < grad_out.size(); ++i) grad_out[i] = static_cast<float>(i + 1);
      std::vector<float> grad(table.size(), 0.0f);
      vocab_embedding_backward(range, tokens.data(), tokens.size(), kDim, grad_out.data(), grad.data());
      for (int64_t v = range.begin; v < range.end; ++v) {
        float want = 0.0f;
        for (size_t i = 0; i < tokens.size(); ++i) {
          if (tokens[i] == v) want += grad_out[i * kDim + 2];
        }
        CHECK(grad[static_cast<size_t>((v - range.begin) * kDim + 2)] == want);
      }
      const std::vector<int> bad = {2, 10};
      CHECK_THROWS_WITH_AS(vocab_embedding_forward(range, table.data(), kDim, bad.data(), 2, out.data()),
                           doctest::Contains("token 10 at position 1 is outside the vocabulary [0, 10)"),
                           InvalidArgument);
    });
  }
}

TEST_CASE("the vocab-parallel cross-entropy equals the single-rank loss and gradient, padding untouched") {
  constexpr size_t N = 6;
  const std::vector<int> targets = {0, 9, 4, 4, 7, 2};
  // Logits of the whole vocabulary, with a large spread to exercise the maximum.
  std::vector<double> z(N * kVocab);
  for (size_t i = 0; i < z.size(); ++i) z[i] = std::sin(static_cast<double>(i) * 1.7) * 8.0;
  // The reference in double: mean of log-sum-exp minus the target's logit; (softmax - onehot) / N.
  double loss = 0.0;
  std::vector<double> grad(z.size());
  for (size_t n = 0; n < N; ++n) {
    double m = -1e300, s = 0.0;
    for (int64_t v = 0; v < kVocab; ++v) m = std::max(m, z[n * kVocab + v]);
    for (int64_t v = 0; v < kVocab; ++v) s += std::exp(z[n * kVocab + v] - m);
    loss += std::log(s) + m - z[n * kVocab + targets[n]];
    for (int64_t v = 0; v < kVocab; ++v) {
      grad[n * kVocab + v] = (std::exp(z[n * kVocab + v] - m) / s - (v == targets[n] ? 1.0 : 0.0)) / N;
    }
  }
  loss /= N;
  for (int tp : {1, 2, 3, 4}) {
    CAPTURE(tp);
    testing::run_thread_ranks(tp, [&](comm::Communicator& comm) {
      const VocabRange range = vocab_range(kVocab, comm.rank(), tp);
      const auto rows = static_cast<size_t>(range.rows());
      std::vector<float> local(N * rows);
      for (size_t n = 0; n < N; ++n) {
        for (size_t j = 0; j < rows; ++j) {
          const int64_t v = range.begin + static_cast<int64_t>(j);
          local[n * rows + j] = v < kVocab ? static_cast<float>(z[n * kVocab + v]) : kPoison;
        }
      }
      VocabParallelCrossEntropy ce;
      const float l = ce.forward(comm, range, local.data(), targets.data(), N);
      CHECK(std::abs(l - loss) <= 1e-6 * std::abs(loss));
      std::vector<float> g(local.size(), -1.0f);
      ce.backward(1.0f, g.data());
      double worst = 0.0;
      bool padding_zero = true;
      for (size_t n = 0; n < N; ++n) {
        for (size_t j = 0; j < rows; ++j) {
          const int64_t v = range.begin + static_cast<int64_t>(j);
          if (v >= kVocab) {
            padding_zero &= g[n * rows + j] == 0.0f;
            continue;
          }
          worst = std::max(worst, std::abs(g[n * rows + j] - grad[n * kVocab + v]));
        }
      }
      CHECK(worst <= 1e-7);
      CHECK(padding_zero);
      const std::vector<int> bad = {0, 0, 0, -1, 0, 0};
      CHECK_THROWS_WITH_AS(ce.forward(comm, range, local.data(), bad.data(), N),
                           doctest::Contains("target: token -1 at position 3 is outside the vocabulary"),
                           InvalidArgument);
    });
  }
}

}  // namespace
}  // namespace zero::parallel
