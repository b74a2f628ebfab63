#include "parallel/pipeline/schedules.h"

#include <algorithm>
#include <functional>
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

namespace {

// Zero-bubble list scheduling (ZB-H1, ZB-V) in unit time steps (F = B = W = 1, transfers free) over
// the schedule's placement, every rank's held activations (held_activations.h) kept within
// `budget`. At each step every idle rank takes, in 1F1B's rhythm, a forward and a B in turn (the
// one it did not run last, else the other), else the oldest deferred W:
//   - a B whose gradient is there (the oldest micro-batch, the later virtual stage on a tie), unless
//     it would pass the budget and a deferred W can free room first;
//   - a forward whose input is there, with fewer than cap(rank) micro-batches of its chunk in
//     flight, within the budget while keeping room for one forward of a later chunk of the rank that
//     has forwards outstanding (in a V, rank 0 must always be able to run the last stage); the later
//     virtual stage first.
// So W's wait for what would be bubbles, as long as memory allows. (Taking B's first instead
// delays the forwards the later stages wait for: at p = 4 the bubble came out 0.56 of 1F1B's, not
// the third the paper's ZB-H1 has.)
void list_schedule(Schedule& s, const HeldBytes& held, double budget, const std::function<int(int rank)>& cap) {
  check_held_bytes(held, s.virtual_stages());
  constexpr int kNotYet = -1;
  const int p = s.ranks, v = s.chunks, m = s.microbatches, stages = s.virtual_stages();
  const double slack = budget * 1e-12;
  struct Progress {
    int f = 0, b = 0, w = 0;  // the next micro-batch to forward, to B, to W
  };
  std::vector<std::vector<int>> f_done(static_cast<size_t>(stages), std::vector<int>(static_cast<size_t>(m), kNotYet));
  std::vector<std::vector<int>> b_done = f_done;
  std::vector<std::vector<Progress>> at(static_cast<size_t>(p), std::vector<Progress>(static_cast<size_t>(v)));
  std::vector<HeldTracker> trackers;
  for (int r = 0; r < p; ++r) trackers.emplace_back(s, held, r);
  auto ready = [](int done, int t) { return done != kNotYet && done <= t; };
  int last_done = 0;
  std::vector<char> after_b(static_cast<size_t>(p), 0);  // whether the rank's last F or B was a B
  for (int t = 0;; ++t) {
    bool finished = true, acted = false;
    for (int r = 0; r < p; ++r) {
      auto& chunks = at[static_cast<size_t>(r)];
      HeldTracker& tracker = trackers[static_cast<size_t>(r)];
      int b = -1, f = -1, w = -1;  // the chosen chunk of each kind
      for (int c = 0; c < v; ++c) {
        const Progress& x = chunks[static_cast<size_t>(c)];
        const int k = s.virtual_stage(r, c);
        if (x.w < m) finished = false;
        if (x.b < x.f && (k == stages - 1 || ready(b_done[static_cast<size_t>(k + 1)][static_cast<size_t>(x.b)], t))) {
          if (b < 0 || x.b < chunks[static_cast<size_t>(b)].b) b = c;
          else if (x.b == chunks[static_cast<size_t>(b)].b && k > s.virtual_stage(r, b)) b = c;
        }
        if (x.f < m && x.f - x.b < cap(r) &&
            (k == 0 || ready(f_done[static_cast<size_t>(k - 1)][static_cast<size_t>(x.f)], t))) {
          double need = tracker.high_water({Op::kF, x.f, c});
          for (int later = 0; later < v; ++later) {
            const int kl = s.virtual_stage(r, later);
            if (kl > k && chunks[static_cast<size_t>(later)].f <= x.f) need += held.forward_of(kl);
          }
          if (need <= budget + slack && (f < 0 || k > s.virtual_stage(r, f))) f = c;
        }
        if (x.w < x.b && (w < 0 || x.w < chunks[static_cast<size_t>(w)].w)) w = c;
      }
      const bool b_fits =
          b >= 0 && (w < 0 || tracker.high_water({Op::kB, chunks[static_cast<size_t>(b)].b, b}) <= budget + slack);
      Action a{};
      if (f >= 0 && (after_b[static_cast<size_t>(r)] || b < 0)) {
        a = {Op::kF, chunks[static_cast<size_t>(f)].f++, f};
      } else if (b_fits) {
        a = {Op::kB, chunks[static_cast<size_t>(b)].b++, b};
      } else if (b < 0 && f >= 0) {
        a = {Op::kF, chunks[static_cast<size_t>(f)].f++, f};
      } else if (w >= 0) {
        a = {Op::kW, chunks[static_cast<size_t>(w)].w++, w};
      } else {
        continue;  // waits
      }
      acted = true;
      if (a.op != Op::kW) after_b[static_cast<size_t>(r)] = a.op == Op::kB;
      tracker.apply(a);
      const auto k = static_cast<size_t>(s.virtual_stage(r, a.chunk));
      auto& out = s.actions[static_cast<size_t>(r)];
      if (a.op == Op::kF) {
        forward(s, r, a.mb, a.chunk, out);
        f_done[k][static_cast<size_t>(a.mb)] = last_done = t + 1;
      } else if (a.op == Op::kB) {
        backward(s, r, a.mb, a.chunk, Op::kB, out);
        b_done[k][static_cast<size_t>(a.mb)] = last_done = t + 1;
      } else {
        out.push_back(a);
      }
    }
    if (finished) break;
    ZERO_CHECK(acted || t < last_done, "pipeline schedule '{}': the list scheduler stalls at step {}", s.name, t);
  }
}

}  // namespace

double one_f_one_b_peak(const HeldBytes& held, int ranks, int chunks, int microbatches) {
  check_held_bytes(held, ranks * chunks);
  HeldBytes merged;
  merged.forward.assign(static_cast<size_t>(ranks), 0.0);
  merged.rebuilt.assign(static_cast<size_t>(ranks), 0.0);
  for (int s = 0; s < ranks; ++s) {
    for (int j = 0; j < chunks; ++j) {
      const int k = s * chunks + j;
      merged.forward[static_cast<size_t>(s)] += held.forward_of(k);
      merged.rebuilt[static_cast<size_t>(s)] = std::max(merged.rebuilt[static_cast<size_t>(s)], held.rebuilt_of(k));
    }
  }
  const std::vector<double> peaks = peak_held(one_f_one_b(ranks, microbatches), merged);
  return *std::max_element(peaks.begin(), peaks.end());
}

Schedule zb_h1(int ranks, int microbatches, const HeldBytes& held) {
  Schedule s = empty("zb-h1", ranks, microbatches, 1, true);
  check_held_bytes(held, ranks);
  // 1F1B's bound on the forwards in flight (p - r on rank r), and its peak on the bytes.
  list_schedule(s, held, one_f_one_b_peak(held, ranks, 1, microbatches), [ranks](int r) { return ranks - r; });
  return s;
}

Schedule zb_v(int ranks, int microbatches, const HeldBytes& held) {
  Schedule s = empty("zb-v", ranks, microbatches, 2, true);
  s.placement = Placement::kV;
  check_held_bytes(held, 2 * ranks);
  // The forwards in flight bounded by memory alone: 1F1B's peak, or where more, what rank 0 needs to
  // fill the pipeline (2p-1 forwards of the first chunk before the first of the last arrives, then
  // that one), which a last chunk heavier than the others (a head) raises above it.
  const int fill = std::min(2 * ranks - 1, microbatches);
  const double budget = std::max(one_f_one_b_peak(held, ranks, 2, microbatches),
                                 fill * held.forward_of(0) + held.forward_of(2 * ranks - 1));
  list_schedule(s, held, budget, [microbatches](int) { return microbatches; });
  return s;
}

Placement placement_of(const std::string& name) { return name == "zb-v" ? Placement::kV : Placement::kLoop; }

Schedule make_schedule(const std::string& name, int ranks, int microbatches, int chunks, int layers,
                       const HeldBytes& held) {
  if (name == "zb-v") {
    if (chunks != 2) {
      ZERO_THROW(InvalidArgument, "pipeline schedule 'zb-v' runs 2 chunks per rank in a V, not {} (chunks=2)", chunks);
    }
    return zb_v(ranks, microbatches, held);
  }
  if (chunks != 1 && name != "interleaved") {
    ZERO_THROW(InvalidArgument, "pipeline schedule '{}' runs one chunk per rank: {} chunks need 'interleaved' or 'zb-v'",
               name, chunks);
  }
  if (name == "gpipe") return gpipe(ranks, microbatches);
  if (name == "1f1b") return one_f_one_b(ranks, microbatches);
  if (name == "interleaved") return interleaved_1f1b(ranks, microbatches, chunks, layers);
  if (name == "zb-h1") return zb_h1(ranks, microbatches, held);
  ZERO_THROW(InvalidArgument, "unknown pipeline schedule '{}' (gpipe, 1f1b, interleaved, zb-h1, zb-v)", name);
}

}  // namespace zero::parallel
