#include "parallel/pipeline/schedules.h"

#include <algorithm>
#include <vector>

#include "base/check.h"

namespace zero::parallel {
namespace {

Schedule empty(const char* name, int ranks, int microbatches, int chunks, bool split) {
  if (ranks < 1) ZERO_THROW(InvalidArgument, "{}: {} pipeline ranks (p must be at least 1)", name, ranks);
  if (microbatches < 1) ZERO_THROW(InvalidArgument, "{}: {} micro-batches (m must be at least 1)", name, microbatches);
  if (chunks < 1) ZERO_THROW(InvalidArgument, "{}: {} chunks per rank (v must be at least 1)", name, chunks);
  Schedule s;
  s.name = name;
  s.ranks = ranks;
  s.chunks = chunks;
  s.microbatches = microbatches;
  s.split_backward = split;
  s.actions.resize(static_cast<size_t>(ranks));
  return s;
}

// A forward with its receive before and its send after (when the neighbouring chunk is on
// another rank).
void forward(const Schedule& s, int rank, int mb, int chunk, std::vector<Action>& out) {
  if (s.receives_forward(rank, chunk)) out.push_back({Op::kRecvF, mb, chunk});
  out.push_back({Op::kF, mb, chunk});
  if (s.sends_forward(rank, chunk)) out.push_back({Op::kSendF, mb, chunk});
}

// A backward (B or BW): the gradient comes from the next virtual stage, goes to the previous one.
void backward(const Schedule& s, int rank, int mb, int chunk, Op op, std::vector<Action>& out) {
  if (s.sends_forward(rank, chunk)) out.push_back({Op::kRecvB, mb, chunk});
  out.push_back({op, mb, chunk});
  if (s.receives_forward(rank, chunk)) out.push_back({Op::kSendB, mb, chunk});
}

}  // namespace

Schedule gpipe(int ranks, int microbatches) {
  Schedule s = empty("gpipe", ranks, microbatches, 1, false);
  for (int r = 0; r < ranks; ++r) {
    auto& out = s.actions[static_cast<size_t>(r)];
    for (int i = 0; i < microbatches; ++i) forward(s, r, i, 0, out);
    for (int i = 0; i < microbatches; ++i) backward(s, r, i, 0, Op::kBW, out);
  }
  return s;
}

Schedule one_f_one_b(int ranks, int microbatches) {
  Schedule s = empty("1f1b", ranks, microbatches, 1, false);
  for (int r = 0; r < ranks; ++r) {
    auto& out = s.actions[static_cast<size_t>(r)];
    const int warmup = std::min(ranks - r - 1, microbatches);
    for (int i = 0; i < warmup; ++i) forward(s, r, i, 0, out);
    for (int k = 0; k < microbatches - warmup; ++k) {
      forward(s, r, warmup + k, 0, out);
      backward(s, r, k, 0, Op::kBW, out);
    }
    for (int i = microbatches - warmup; i < microbatches; ++i) backward(s, r, i, 0, Op::kBW, out);
  }
  return s;
}

Schedule interleaved_1f1b(int ranks, int microbatches, int chunks, int layers) {
  Schedule s = empty("interleaved", ranks, microbatches, chunks, false);
  if (microbatches % ranks != 0) {
    ZERO_THROW(InvalidArgument,
               "interleaved 1F1B: {} micro-batches are not a multiple of the {} pipeline ranks (the forwards go "
               "in groups of p micro-batches per chunk)",
               microbatches, ranks);
  }
  if (layers > 0 && layers % (ranks * chunks) != 0) {
    ZERO_THROW(InvalidArgument, "interleaved 1F1B: {} layers do not split into {} ranks x {} chunks", layers, ranks,
               chunks);
  }
  const int total = microbatches * chunks;
  // The k-th forward (backward) of any rank: micro-batch and chunk (Megatron's order).
  auto mb_of = [&](int k) { return k / (ranks * chunks) * ranks + k % ranks; };
  auto fwd_chunk = [&](int k) { return k / ranks % chunks; };
  auto bwd_chunk = [&](int k) { return chunks - 1 - k / ranks % chunks; };
  for (int r = 0; r < ranks; ++r) {
    auto& out = s.actions[static_cast<size_t>(r)];
    // With m == p every forward comes first (the warm-up would otherwise wait on its own backward).
    const int warmup = microbatches == ranks ? total : std::min((ranks - r - 1) * 2 + (chunks - 1) * ranks, total);
    for (int k = 0; k < warmup; ++k) forward(s, r, mb_of(k), fwd_chunk(k), out);
    for (int k = 0; k < total - warmup; ++k) {
      forward(s, r, mb_of(warmup + k), fwd_chunk(warmup + k), out);
      backward(s, r, mb_of(k), bwd_chunk(k), Op::kBW, out);
    }
    for (int k = total - warmup; k < total; ++k) backward(s, r, mb_of(k), bwd_chunk(k), Op::kBW, out);
  }
  return s;
}

Schedule zb_h1(int ranks, int microbatches) {
  Schedule s = empty("zb-h1", ranks, microbatches, 1, true);
  const int p = ranks, m = microbatches;
  // List scheduling in unit time steps (F = B = W = 1, transfers free): at each step every idle rank
  // takes the first of: a B whose gradient is there; a W when it already defers p-1; a forward whose
  // input is there while fewer than p-r micro-batches are in flight; any W.
  constexpr int kNotYet = -1;
  std::vector<std::vector<int>> f_done(static_cast<size_t>(p), std::vector<int>(static_cast<size_t>(m), kNotYet));
  std::vector<std::vector<int>> b_done = f_done;
  std::vector<int> nf(static_cast<size_t>(p), 0), nb(nf), nw(nf);
  auto ready = [](int at, int t) { return at != kNotYet && at <= t; };
  for (int t = 0;; ++t) {
    bool all = true;
    for (int r = 0; r < p; ++r) {
      const auto ur = static_cast<size_t>(r);
      if (nw[ur] == m) continue;
      all = false;
      const int f = nf[ur], b = nb[ur];
      const bool can_b = b < f && (r == p - 1 || ready(b_done[ur + 1][static_cast<size_t>(b)], t));
      const bool can_f = f < m && f - b < p - r && (r == 0 || ready(f_done[ur - 1][static_cast<size_t>(f)], t));
      const int deferred = b - nw[ur];
      auto& out = s.actions[ur];
      if (can_b) {
        backward(s, r, b, 0, Op::kB, out);
        b_done[ur][static_cast<size_t>(b)] = t + 1;
        ++nb[ur];
      } else if (deferred > p - 1 || (deferred > 0 && !can_f)) {
        out.push_back({Op::kW, nw[ur]++, 0});
      } else if (can_f) {
        forward(s, r, f, 0, out);
        f_done[ur][static_cast<size_t>(f)] = t + 1;
        ++nf[ur];
      }
    }
    if (all) break;
  }
  return s;
}

Schedule make_schedule(const std::string& name, int ranks, int microbatches, int chunks, int layers) {
  if (chunks != 1 && name != "interleaved") {
    ZERO_THROW(InvalidArgument, "pipeline schedule '{}' runs one chunk per rank: {} chunks need 'interleaved'", name,
               chunks);
  }
  if (name == "gpipe") return gpipe(ranks, microbatches);
  if (name == "1f1b") return one_f_one_b(ranks, microbatches);
  if (name == "interleaved") return interleaved_1f1b(ranks, microbatches, chunks, layers);
  if (name == "zb-h1") return zb_h1(ranks, microbatches);
  ZERO_THROW(InvalidArgument, "unknown pipeline schedule '{}' (gpipe, 1f1b, interleaved, zb-h1)", name);
}

}  // namespace zero::parallel
