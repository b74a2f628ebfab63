#include "zero/copied_grad_check.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>

namespace zero {

CopiedGradCheck::CopiedGradCheck(memory::Device& device, comm::Communicator& group, std::string what,
                                 std::vector<Piece> pieces, std::chrono::milliseconds timeout)
    : device_(device), group_(group), what_(std::move(what)), order_(device, group, timeout), pieces_(std::move(pieces)),
      timeout_(timeout) {
  for (const Piece& p : pieces_) numel_ += p.len;
}

CopiedGradCheck::Verdict CopiedGradCheck::run(const BucketBase& bucket_base) {
  if (!device_.holds_values() || numel_ == 0) return {};
  memory::Stream& compute = device_.compute_stream();
  const size_t cap = std::min(numel_, kChunk);
  const auto cat = memory::Category::kCommBuffer;
  memory::Buffer high = device_.allocate_elements(static_cast<int64_t>(cap), DType::kFloat32, cat);
  memory::Buffer low = device_.allocate_elements(static_cast<int64_t>(cap), DType::kFloat32, cat);
  memory::Buffer host = device_.allocate_host_staging(2 * cap * sizeof(float), cat);
  std::vector<float> spread(pieces_.size(), 0.0f), magnitude(pieces_.size(), 0.0f);
  struct Span {
    size_t piece, len;  // consecutive elements of a piece in the pack
  };
  std::vector<Span> spans;
  size_t filled = 0;
  const auto flush = [&] {
    if (filled == 0) return;
    device_.copy(low.data(), high.data(), filled * sizeof(float), compute);
    for (auto [buffer, op] : {std::pair{&high, comm::ReduceOp::kMax}, std::pair{&low, comm::ReduceOp::kMin}}) {
      comm::CallLabel label(group_, "replicated gradients' check");
      order_.before_issue(compute);
      order_.after(*group_.all_reduce(buffer->data(), filled, DType::kFloat32, op), compute);
    }
    const float* hi = host.as<float>();
    const float* lo = hi + cap;
    device_.copy(host.as<float>(), high.data(), filled * sizeof(float), compute);
    device_.copy(host.as<float>() + cap, low.data(), filled * sizeof(float), compute);
    device_.synchronize(compute, timeout_);
    size_t at = 0;
    for (const Span& s : spans) {
      for (size_t e = at; e < at + s.len; ++e) {
        spread[s.piece] = std::max(spread[s.piece], hi[e] - lo[e]);
        magnitude[s.piece] = std::max({magnitude[s.piece], std::fabs(hi[e]), std::fabs(lo[e])});
      }
      at += s.len;
    }
    spans.clear();
    filled = 0;
  };
  for (size_t i = 0; i < pieces_.size(); ++i) {
    const Piece& p = pieces_[i];
    const auto* src = static_cast<const uint8_t*>(bucket_base(p.bucket)) + p.offset * dtype_size(p.dtype);
    for (size_t done = 0; done < p.len;) {
      const size_t n = std::min(p.len - done, cap - filled);
      device_.convert(src + done * dtype_size(p.dtype), p.dtype, high.as<float>() + filled, DType::kFloat32, n, compute);
      spans.push_back({i, n});
      filled += n;
      done += n;
      if (filled == cap) flush();
    }
  }
  flush();
  Verdict worst;
  for (size_t i = 0; i < pieces_.size(); ++i) {
    // NaN and infinity (an overflowing step) compare false and are left out.
    const float difference = magnitude[i] > 0.0f ? spread[i] / magnitude[i] : 0.0f;
    if (difference > worst.difference) worst = {difference, pieces_[i].name};
  }
  return worst;
}

}  // namespace zero
