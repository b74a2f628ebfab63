#include "parallel/pipeline/schedules.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <queue>
#include <vector>

#include "base/check.h"
#include "parallel/pipeline/schedule_sim.h"

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

// ZB-H1's list scheduling (one chunk per rank: rank r is stage r), in the time `costs` give (each
// stage's F, B and W; a transfer between ranks), every rank's held activations (costs.held,
// held_activations.h) kept within `budget`. Events in time order: whenever a rank is free it takes,
// in 1F1B's rhythm, a forward and a B in turn (the one it did not run last, else the other), else
// its oldest deferred W:
//   - a B whose gradient is there, unless it would pass the budget and a deferred W can free room
//     first;
//   - a forward whose input is there, with fewer than p-r micro-batches in flight (1F1B's bound),
//     within the budget.
// So W's wait for what would be bubbles, as long as memory allows; with nothing to run a rank waits
// for the next action to end anywhere. Given the costs a run measured (or a model's), the order fits
// them, as the paper's scheduler takes profiled F, B and W times; unit costs give its handcrafted
// shape. (Taking B's first instead of the rhythm delays the forwards the later stages wait for: at
// p = 4 the bubble came out 0.56 of 1F1B's, not the third the paper's ZB-H1 has.)
void list_schedule(Schedule& s, const ActionCosts& costs, double budget) {
  ZERO_CHECK(s.chunks == 1 && s.placement == Placement::kLoop, "the list scheduler runs one chunk per rank");
  constexpr double kNotYet = std::numeric_limits<double>::infinity();
  const int p = s.ranks, m = s.microbatches;
  const double slack = budget * 1e-12;
  struct Progress {
    int f = 0, b = 0, w = 0;  // the next micro-batch to forward, to B, to W
  };
  // When each (stage, micro-batch)'s F and B end.
  std::vector<std::vector<double>> f_done(static_cast<size_t>(p), std::vector<double>(static_cast<size_t>(m), kNotYet));
  std::vector<std::vector<double>> b_done = f_done;
  std::vector<Progress> at(static_cast<size_t>(p));
  std::vector<HeldTracker> trackers;
  for (int r = 0; r < p; ++r) trackers.emplace_back(s, costs.held, r);
  std::vector<double> free_at(static_cast<size_t>(p), 0.0);
  std::vector<char> after_b(static_cast<size_t>(p), 0);  // whether the rank's last F or B was a B
  // The ends (and arrivals) of decided actions still ahead of the clock, soonest on top: when a rank
  // waits, the next moment anything can change for it.
  std::priority_queue<double, std::vector<double>, std::greater<>> ahead;
  // When stage `from`'s output (done at `done`) is on the next or previous rank.
  auto arrival = [&](double done) { return done == kNotYet ? kNotYet : done + costs.transfer; };
  // Rank r, free at t, takes its next action (false: nothing it can run now).
  auto decide = [&](int r, double t) {
    Progress& x = at[static_cast<size_t>(r)];
    HeldTracker& tracker = trackers[static_cast<size_t>(r)];
    const bool can_b =
        x.b < x.f && (r == p - 1 || arrival(b_done[static_cast<size_t>(r + 1)][static_cast<size_t>(x.b)]) <= t);
    const bool can_f = x.f < m && x.f - x.b < p - r &&
                       (r == 0 || arrival(f_done[static_cast<size_t>(r - 1)][static_cast<size_t>(x.f)]) <= t) &&
                       tracker.high_water({Op::kF, x.f, 0}) <= budget + slack;
    const bool can_w = x.w < x.b;
    const bool b_fits = can_b && (!can_w || tracker.high_water({Op::kB, x.b, 0}) <= budget + slack);
    Action a{};
    if (can_f && (after_b[static_cast<size_t>(r)] || !can_b)) {
      a = {Op::kF, x.f++, 0};
    } else if (b_fits) {
      a = {Op::kB, x.b++, 0};
    } else if (can_w) {
      a = {Op::kW, x.w++, 0};
    } else {
      return false;  // nothing to run
    }
    if (a.op != Op::kW) after_b[static_cast<size_t>(r)] = a.op == Op::kB;
    tracker.apply(a);
    const double end = t + costs.of(a.op, r);
    free_at[static_cast<size_t>(r)] = end;
    ahead.push(end);
    if (costs.transfer > 0) ahead.push(end + costs.transfer);
    auto& out = s.actions[static_cast<size_t>(r)];
    if (a.op == Op::kF) {
      forward(s, r, a.mb, 0, out);
      f_done[static_cast<size_t>(r)][static_cast<size_t>(a.mb)] = end;
    } else if (a.op == Op::kB) {
      backward(s, r, a.mb, 0, Op::kB, out);
      b_done[static_cast<size_t>(r)][static_cast<size_t>(a.mb)] = end;
    } else {
      out.push_back(a);
    }
    return true;
  };
  auto has_work = [&](int q) { return at[static_cast<size_t>(q)].w < m; };
  // Rounds: every rank free at the earliest time t decides (in rank order: a decision at t ends after
  // t, so it changes nothing another rank sees at t); a rank with nothing to run then waits for the
  // next end, or arrival, after t.
  for (;;) {
    double t = kNotYet;
    for (int q = 0; q < p; ++q) {
      if (has_work(q)) t = std::min(t, free_at[static_cast<size_t>(q)]);
    }
    if (t == kNotYet) break;  // every rank is done
    std::vector<int> waiting;
    for (int r = 0; r < p; ++r) {
      if (!has_work(r) || free_at[static_cast<size_t>(r)] != t) continue;
      if (!decide(r, t)) waiting.push_back(r);
    }
    if (waiting.empty()) continue;
    while (!ahead.empty() && ahead.top() <= t) ahead.pop();
    double next = ahead.empty() ? kNotYet : ahead.top();
    for (int q = 0; q < p; ++q) {
      if (has_work(q) && free_at[static_cast<size_t>(q)] > t) next = std::min(next, free_at[static_cast<size_t>(q)]);
    }
    ZERO_CHECK(next != kNotYet, "pipeline schedule '{}': the list scheduler stalls at {} (rank {} has nothing to run)",
               s.name, t, waiting.front());
    for (int r : waiting) free_at[static_cast<size_t>(r)] = next;
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

Schedule zb_h1(int ranks, int microbatches, const ActionCosts& costs) {
  Schedule s = empty("zb-h1", ranks, microbatches, 1, true);
  check_costs(costs, ranks);
  // 1F1B's bound on the forwards in flight (p - r on rank r), and its peak on the bytes.
  list_schedule(s, costs, one_f_one_b_peak(costs.held, ranks, 1, microbatches));
  return s;
}

Schedule zb_v(int ranks, int microbatches) {
  Schedule s = empty("zb-v", ranks, microbatches, 2, true);
  s.placement = Placement::kV;
  const int p = ranks, m = microbatches;
  // The paper's V order for n = max(m, 2p-1) micro-batches (fewer cannot fill the V; the missing
  // ones are left out after, which keeps every dependency's order). Rank r, chunk 0 its way down
  // the V and chunk 1 its way back:
  //   warm-up   2(p-r)-1 forwards of chunk 0; r times a forward of chunk 1 and one of chunk 0;
  //             p-r times a forward, B and W of chunk 1
  //   steady    while forwards remain: a forward of chunk 0 (while any is left), B and W of chunk 0,
  //             a forward, B and W of chunk 1
  //   cool-down r times a B of chunk 0 and one of chunk 1; p-r times a B and a W of chunk 0; the
  //             W's left, chunk 1's first
  // So rank 0 holds 2p chunk forwards at most (2p-1 of chunk 0 and the first of chunk 1): 1F1B's
  // peak on the same layers when the chunks hold alike.
  const int n = std::max(m, 2 * p - 1);
  for (int r = 0; r < p; ++r) {
    std::vector<Action> order;
    int next[3][2] = {};  // [F, B, W][chunk]: the next micro-batch
    auto add = [&](Op op, int kind, int chunk) { order.push_back({op, next[kind][chunk]++, chunk}); };
    auto F = [&](int c) { add(Op::kF, 0, c); };
    auto B = [&](int c) { add(Op::kB, 1, c); };
    auto W = [&](int c) { add(Op::kW, 2, c); };
    for (int i = 0; i < 2 * (p - r) - 1; ++i) F(0);
    for (int i = 0; i < r; ++i) {
      F(1);
      F(0);
    }
    for (int i = 0; i < p - r; ++i) {
      F(1);
      B(1);
      W(1);
    }
    while (next[0][1] < next[0][0] || next[0][0] < n) {
      if (next[0][0] < n) F(0);
      B(0);
      W(0);
      F(1);
      B(1);
      W(1);
    }
    for (int i = 0; i < r; ++i) {
      B(0);
      B(1);
    }
    for (int i = 0; i < p - r; ++i) {
      B(0);
      W(0);
    }
    while (next[2][1] < next[1][1]) W(1);
    while (next[2][0] < next[1][0]) W(0);
    auto& out = s.actions[static_cast<size_t>(r)];
    for (const Action& a : order) {
      if (a.mb >= m) continue;
      if (a.op == Op::kF) {
        forward(s, r, a.mb, a.chunk, out);
      } else if (a.op == Op::kB) {
        backward(s, r, a.mb, a.chunk, Op::kB, out);
      } else {
        out.push_back(a);
      }
    }
  }
  return s;
}

Placement placement_of(const std::string& name) { return name == "zb-v" ? Placement::kV : Placement::kLoop; }

Schedule make_schedule(const std::string& name, int ranks, int microbatches, int chunks, int layers,
                       const ActionCosts& costs) {
  if (name == "zb-v") {
    if (chunks != 2) {
      ZERO_THROW(InvalidArgument, "pipeline schedule 'zb-v' runs 2 chunks per rank in a V, not {} (chunks=2)", chunks);
    }
    return zb_v(ranks, microbatches);
  }
  if (chunks != 1 && name != "interleaved") {
    ZERO_THROW(InvalidArgument, "pipeline schedule '{}' runs one chunk per rank: {} chunks need 'interleaved' or 'zb-v'",
               name, chunks);
  }
  if (name == "gpipe") return gpipe(ranks, microbatches);
  if (name == "1f1b") return one_f_one_b(ranks, microbatches);
  if (name == "interleaved") return interleaved_1f1b(ranks, microbatches, chunks, layers);
  if (name == "zb-h1") return zb_h1(ranks, microbatches, costs);
  ZERO_THROW(InvalidArgument, "unknown pipeline schedule '{}' (gpipe, 1f1b, interleaved, zb-h1, zb-v)", name);
}

}  // namespace zero::parallel
