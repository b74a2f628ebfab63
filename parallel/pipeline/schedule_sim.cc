#include "parallel/pipeline/schedule_sim.h"

#include <algorithm>
#include <map>
#include <set>
#include <tuple>
#include <utility>

#include "base/check.h"
#include "parallel/pipeline/pipeline_check.h"

namespace zero::parallel {

double ActionCosts::of(Op op, int k) const {
  auto pick = [&](const std::vector<double>& v, const char* name) {
    ZERO_CHECK(!v.empty(), "ActionCosts.{} is empty", name);
    return v.size() == 1 ? v[0] : v.at(static_cast<size_t>(k));
  };
  switch (op) {
    case Op::kF: return pick(forward, "forward");
    case Op::kB: return pick(backward, "backward");
    case Op::kW: return pick(weight, "weight");
    case Op::kBW: return pick(backward, "backward") + pick(weight, "weight");
    default: return 0.0;
  }
}

SimResult simulate(const Schedule& s, const ActionCosts& costs) {
  check_schedule(s);
  for (const auto* v : {&costs.forward, &costs.backward, &costs.weight}) {
    if (v->size() != 1 && v->size() != static_cast<size_t>(s.virtual_stages())) {
      ZERO_THROW(InvalidArgument, "pipeline simulation: {} costs given for {} virtual stages (give 1 or {})", v->size(),
                 s.virtual_stages(), s.virtual_stages());
    }
  }
  const auto p = static_cast<size_t>(s.ranks);
  SimResult r;
  r.busy.assign(p, 0.0);
  r.idle.assign(p, 0.0);
  r.peak_in_flight.assign(p, 0);
  r.timeline.resize(p);
  std::vector<double> now(p, 0.0);
  std::vector<size_t> pc(p, 0);
  std::vector<std::set<std::pair<int, int>>> in_flight(p);  // (mb, chunk) forwarded, no B yet
  // Per channel (from, to, gradients?): when each posted send's data arrives, in order; how many
  // receives took theirs.
  std::map<std::tuple<int, int, bool>, std::vector<double>> arrivals;
  std::map<std::tuple<int, int, bool>, size_t> taken;
  for (bool progress = true; progress;) {
    progress = false;
    for (size_t rank = 0; rank < p; ++rank) {
      const int rk = static_cast<int>(rank);
      const auto& actions = s.actions[rank];
      for (; pc[rank] < actions.size(); ++pc[rank], progress = true) {
        const Action& a = actions[pc[rank]];
        const int k = s.virtual_stage(rk, a.chunk);
        if (is_compute(a.op)) {
          const double start = now[rank], end = start + costs.of(a.op, k);
          r.timeline[rank].push_back({a, start, end});
          r.busy[rank] += end - start;
          now[rank] = end;
          if (a.op == Op::kF) in_flight[rank].insert({a.mb, a.chunk});
          if (a.op == Op::kB || a.op == Op::kBW) in_flight[rank].erase({a.mb, a.chunk});
          r.peak_in_flight[rank] = std::max(r.peak_in_flight[rank], static_cast<int>(in_flight[rank].size()));
          continue;
        }
        const bool grads = a.op == Op::kSendB || a.op == Op::kRecvB;
        const int peer = s.peer(rk, a);
        if (a.op == Op::kSendF || a.op == Op::kSendB) {
          arrivals[{rk, peer, grads}].push_back(now[rank] + costs.transfer);
          continue;
        }
        const auto channel = std::make_tuple(peer, rk, grads);
        const std::vector<double>& posted = arrivals[channel];
        size_t& n = taken[channel];
        if (n == posted.size()) break;  // its send is not posted yet: the other ranks go on first
        now[rank] = std::max(now[rank], posted[n++]);
      }
    }
  }
  for (size_t rank = 0; rank < p; ++rank) r.step_time = std::max(r.step_time, now[rank]);
  double idle = 0;
  for (size_t rank = 0; rank < p; ++rank) {
    r.idle[rank] = r.step_time - r.busy[rank];
    idle += r.idle[rank];
  }
  r.bubble_fraction = r.step_time > 0 ? idle / (static_cast<double>(p) * r.step_time) : 0.0;
  return r;
}

}  // namespace zero::parallel
