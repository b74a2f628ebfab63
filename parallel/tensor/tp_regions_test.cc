#include "parallel/tensor/tp_regions.h"

#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "base/error.h"
#include "testing/thread_ranks.h"

namespace zero::parallel {
namespace {

// Small integers: every sum below is exact in float, so the split computation must equal the
// single-rank one bit for bit.
float value(size_t i, size_t salt) { return static_cast<float>(static_cast<int>((i * 7 + salt * 3) % 9) - 4); }

// y[n, o] = sum_i x[n, i] w[o, i] (a linear layer, PyTorch's [out, in] weight).
std::vector<float> linear(const std::vector<float>& x, const std::vector<float>& w, size_t n, size_t in, size_t out) {
  std::vector<float> y(n * out, 0.0f);
  for (size_t a = 0; a < n; ++a)
    for (size_t o = 0; o < out; ++o)
      for (size_t i = 0; i < in; ++i) y[a * out + o] += x[a * in + i] * w[o * in + i];
  return y;
}

// dx[n, i] = sum_o dy[n, o] w[o, i].
std::vector<float> linear_dx(const std::vector<float>& dy, const std::vector<float>& w, size_t n, size_t in, size_t out) {
  std::vector<float> dx(n * in, 0.0f);
  for (size_t a = 0; a < n; ++a)
    for (size_t o = 0; o < out; ++o)
      for (size_t i = 0; i < in; ++i) dx[a * in + i] += dy[a * out + o] * w[o * in + i];
  return dx;
}

TEST_CASE("f and g around a column- then row-parallel pair equal the unsplit layers, forward and backward") {
  constexpr size_t N = 3, C = 4, H = 12;
  std::vector<float> x(N * C), w1(H * C), w2(C * H), dy(N * C);
  for (size_t i = 0; i < x.size(); ++i) x[i] = value(i, 1);
  for (size_t i = 0; i < w1.size(); ++i) w1[i] = value(i, 2);
  for (size_t i = 0; i < w2.size(); ++i) w2[i] = value(i, 3);
  for (size_t i = 0; i < dy.size(); ++i) dy[i] = value(i, 4);
  const std::vector<float> h = linear(x, w1, N, C, H);
  const std::vector<float> y = linear(h, w2, N, H, C);
  const std::vector<float> dh = linear_dx(dy, w2, N, H, C);
  const std::vector<float> dx = linear_dx(dh, w1, N, C, H);
  for (int tp : {2, 3, 4}) {
    CAPTURE(tp);
    testing::run_thread_ranks(tp, [&](comm::Communicator& comm) {
      const size_t hl = H / static_cast<size_t>(tp), r = static_cast<size_t>(comm.rank());
      // Rank r's rows of w1 (column-parallel) and columns of w2 (row-parallel).
      std::vector<float> w1_local(w1.begin() + static_cast<long>(r * hl * C), w1.begin() + static_cast<long>((r + 1) * hl * C));
      std::vector<float> w2_local(C * hl);
      for (size_t o = 0; o < C; ++o)
        for (size_t j = 0; j < hl; ++j) w2_local[o * hl + j] = w2[o * H + r * hl + j];
      std::vector<float> xin = x;
      CopyToTp::forward(comm, xin.data(), xin.size());
      const std::vector<float> h_local = linear(xin, w1_local, N, C, hl);
      std::vector<float> out = linear(h_local, w2_local, N, hl, C);
      ReduceFromTp::forward(comm, out.data(), out.size());
      CHECK(out == y);
      std::vector<float> g = dy;
      ReduceFromTp::backward(comm, g.data(), g.size());
      const std::vector<float> dh_local = linear_dx(g, w2_local, N, hl, C);
      std::vector<float> dx_local = linear_dx(dh_local, w1_local, N, C, hl);
      CopyToTp::backward(comm, dx_local.data(), dx_local.size());
      CHECK(dx_local == dx);
    });
  }
}

TEST_CASE("sequence-parallel gather and reduce-scatter move each rank's rows of every batch") {
  for (int tp : {1, 2, 3, 4}) {
    CAPTURE(tp);
    const SequenceShape s{3, 2 * static_cast<size_t>(tp), 5};  // [B, T, C]
    const size_t part = s.seq / static_cast<size_t>(tp);
    testing::run_thread_ranks(tp, [&](comm::Communicator& comm) {
      const size_t r = static_cast<size_t>(comm.rank());
      // Element (b, t, c) of the full tensor is 100 b + 10 t + c.
      auto at = [](size_t b, size_t t, size_t c) { return static_cast<float>(100 * b + 10 * t + c); };
      std::vector<float> local(s.local_count(tp)), full(s.full_count(), -1.0f);
      for (size_t b = 0; b < s.outer; ++b)
        for (size_t t = 0; t < part; ++t)
          for (size_t c = 0; c < s.inner; ++c) local[(b * part + t) * s.inner + c] = at(b, r * part + t, c);
      GatherFromSequence::forward(comm, local.data(), full.data(), s);
      bool whole = true;
      for (size_t b = 0; b < s.outer; ++b)
        for (size_t t = 0; t < s.seq; ++t)
          for (size_t c = 0; c < s.inner; ++c) whole &= full[(b * s.seq + t) * s.inner + c] == at(b, t, c);
      CHECK(whole);
      // Every rank contributes the full tensor times (rank + 1): each gets its rows times the sum.
      const float k = static_cast<float>(tp * (tp + 1) / 2);
      std::vector<float> mine(full.size());
      for (size_t i = 0; i < full.size(); ++i) mine[i] = full[i] * static_cast<float>(r + 1);
      std::vector<float> reduced(s.local_count(tp), 0.0f);
      ReduceScatterToSequence::forward(comm, mine.data(), reduced.data(), s);
      std::vector<float> want(local.size());
      for (size_t i = 0; i < local.size(); ++i) want[i] = local[i] * k;
      CHECK(reduced == want);
      // The backward forms are the same collectives the other way round.
      std::vector<float> grad_local(s.local_count(tp), 0.0f);
      GatherFromSequence::backward(comm, mine.data(), grad_local.data(), s);
      CHECK(grad_local == want);
      std::vector<float> grad_full(s.full_count(), 0.0f);
      ReduceScatterToSequence::backward(comm, local.data(), grad_full.data(), s);
      CHECK(grad_full == full);
    });
  }
}

TEST_CASE("a sequence that tp does not divide is an error naming both") {
  const SequenceShape s{2, 7, 4};
  CHECK_THROWS_WITH_AS(s.local_count(2), doctest::Contains("the sequence length 7 does not divide by tp 2"),
                       InvalidArgument);
  CHECK(s.local_count(7) == 8);
}

}  // namespace
}  // namespace zero::parallel
