#include "parallel/pipeline/schedule_sim.h"

#include <algorithm>
#include <limits>
#include <map>
#include <set>
#include <vector>
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

namespace {

using Channel = std::tuple<int, int, bool>;  // (from, to, gradients?)

SimResult empty_result(size_t ranks) {
  SimResult r;
  r.busy.assign(ranks, 0.0);
  r.idle.assign(ranks, 0.0);
  r.peak_in_flight.assign(ranks, 0);
  r.timeline.resize(ranks);
  return r;
}

// Step time, idle times and the bubble fraction from the busy times and each rank's end.
void finish_result(SimResult& r, const std::vector<double>& end) {
  const size_t p = end.size();
  for (size_t rank = 0; rank < p; ++rank) r.step_time = std::max(r.step_time, end[rank]);
  double idle = 0;
  for (size_t rank = 0; rank < p; ++rank) {
    r.idle[rank] = r.step_time - r.busy[rank];
    idle += r.idle[rank];
  }
  r.bubble_fraction = r.step_time > 0 ? idle / (static_cast<double>(p) * r.step_time) : 0.0;
}

// Processor sharing (the header): one clock for all ranks, advanced from event to event (a compute
// action's end, a message's arrival), every running compute action progressing at the shared rate.
SimResult simulate_shared(const Schedule& s, const ActionCosts& costs, double cores) {
  const auto p = static_cast<size_t>(s.ranks);
  SimResult r = empty_result(p);
  struct Running {
    bool on = false;
    Action action;
    double left = 0, cost = 0, start = 0;  // work left (in time alone on a core)
  };
  std::vector<Running> running(p);
  std::vector<size_t> pc(p, 0);
  std::vector<double> end(p, 0.0);
  std::vector<std::set<std::pair<int, int>>> in_flight(p);
  std::map<Channel, std::vector<double>> arrivals;
  std::map<Channel, size_t> taken;
  double t = 0;
  while (true) {
    // Every rank not computing goes through what takes no time: sends, receives whose data is here,
    // and the start of its next compute action. A receive whose send is not posted, or whose data
    // arrives later, waits.
    double next_arrival = std::numeric_limits<double>::infinity();
    for (bool progress = true; progress;) {
      progress = false;
      next_arrival = std::numeric_limits<double>::infinity();
      for (size_t rank = 0; rank < p; ++rank) {
        const int rk = static_cast<int>(rank);
        const auto& actions = s.actions[rank];
        while (!running[rank].on && pc[rank] < actions.size()) {
          const Action& a = actions[pc[rank]];
          if (is_compute(a.op)) {
            const double cost = costs.of(a.op, s.virtual_stage(rk, a.chunk));
            running[rank] = {true, a, cost, cost, t};
            if (a.op == Op::kF) in_flight[rank].insert({a.mb, a.chunk});
            if (a.op == Op::kB || a.op == Op::kBW) in_flight[rank].erase({a.mb, a.chunk});
            r.peak_in_flight[rank] = std::max(r.peak_in_flight[rank], static_cast<int>(in_flight[rank].size()));
            ++pc[rank];
            progress = true;
            break;
          }
          const bool grads = a.op == Op::kSendB || a.op == Op::kRecvB;
          const int peer = s.peer(rk, a);
          if (a.op == Op::kSendF || a.op == Op::kSendB) {
            arrivals[{rk, peer, grads}].push_back(t + costs.transfer);
            ++pc[rank];
            progress = true;
            continue;
          }
          const Channel channel{peer, rk, grads};
          const std::vector<double>& posted = arrivals[channel];
          size_t& n = taken[channel];
          if (n == posted.size()) break;  // not posted yet
          if (posted[n] > t) {
            next_arrival = std::min(next_arrival, posted[n]);
            break;
          }
          ++n;
          ++pc[rank];
          progress = true;
          end[rank] = t;
        }
      }
    }
    size_t active = 0;
    double soonest = std::numeric_limits<double>::infinity();  // work left of the shortest running
    for (const Running& run : running) {
      if (!run.on) continue;
      ++active;
      soonest = std::min(soonest, run.left);
    }
    if (active == 0 && next_arrival == std::numeric_limits<double>::infinity()) break;  // every rank done
    const double rate = std::min(1.0, cores / static_cast<double>(active));
    const double dt = active == 0 ? next_arrival - t : std::min(soonest / rate, next_arrival - t);
    t += dt;
    for (size_t rank = 0; rank < p; ++rank) {
      Running& run = running[rank];
      if (!run.on) continue;
      run.left -= rate * dt;
      if (run.left > 1e-12 * std::max(1.0, run.cost)) continue;
      r.timeline[rank].push_back({run.action, run.start, t});
      r.busy[rank] += t - run.start;
      end[rank] = t;
      run.on = false;
    }
  }
  finish_result(r, end);
  return r;
}

}  // namespace

SimResult simulate(const Schedule& s, const ActionCosts& costs, double cores) {
  check_schedule(s);
  return simulate_checked(s, costs, cores, Record::kTimeline);
}

void check_costs(const ActionCosts& costs, int virtual_stages) {
  for (const auto* v : {&costs.forward, &costs.backward, &costs.weight}) {
    if (v->size() != 1 && v->size() != static_cast<size_t>(virtual_stages)) {
      ZERO_THROW(InvalidArgument, "pipeline simulation: {} costs given for {} virtual stages (give 1 or {})", v->size(),
                 virtual_stages, virtual_stages);
    }
  }
  if (!(costs.transfer >= 0)) ZERO_THROW(InvalidArgument, "pipeline simulation: transfer time {}", costs.transfer);
  check_held_bytes(costs.held, virtual_stages);
}

SimResult simulate_checked(const Schedule& s, const ActionCosts& costs, double cores, Record record) {
  check_costs(costs, s.virtual_stages());
  if (cores < 0) ZERO_THROW(InvalidArgument, "pipeline simulation: {} cores", cores);
  if (cores > 0 && cores < static_cast<double>(s.ranks)) {
    SimResult shared = simulate_shared(s, costs, cores);
    shared.peak_held = peak_held(s, costs.held);
    if (record == Record::kTimes) shared.timeline.clear();
    return shared;
  }
  // A planner's search simulates thousands of schedules of up to millions of actions: the costs are
  // looked up once per virtual stage, the in-flight micro-batches counted (a rank's forward of a
  // (micro-batch, chunk) precedes its backward in a checked schedule), and each channel's queue
  // found from a table per (rank, chunk) built once.
  const auto p = static_cast<size_t>(s.ranks);
  const auto v = static_cast<size_t>(s.chunks);
  SimResult r = empty_result(p);
  if (record == Record::kTimes) r.timeline.clear();
  std::vector<double> cost_of[4];  // by Op (F, B, W, BW), per virtual stage
  for (Op op : {Op::kF, Op::kB, Op::kW, Op::kBW}) {
    for (int k = 0; k < s.virtual_stages(); ++k) cost_of[static_cast<int>(op)].push_back(costs.of(op, k));
  }
  // Channels (from, to, gradients?), numbered; per (rank, chunk) and transfer op, its channel.
  std::map<Channel, size_t> number;
  std::vector<size_t> channel_of(p * v * 4);  // [rank][chunk][SendF, RecvF, SendB, RecvB]
  for (size_t rank = 0; rank < p; ++rank) {
    for (size_t c = 0; c < v; ++c) {
      const Op ops[] = {Op::kSendF, Op::kRecvF, Op::kSendB, Op::kRecvB};
      for (size_t i = 0; i < 4; ++i) {
        const Action a{ops[i], 0, static_cast<int>(c)};
        const int rk = static_cast<int>(rank), peer = s.peer(rk, a);
        const bool grads = i >= 2, sends = i % 2 == 0;
        const Channel ch = sends ? Channel{rk, peer, grads} : Channel{peer, rk, grads};
        channel_of[(rank * v + c) * 4 + i] = number.emplace(ch, number.size()).first->second;
      }
    }
  }
  auto transfer_index = [](Op op) { return op == Op::kSendF ? 0 : op == Op::kRecvF ? 1 : op == Op::kSendB ? 2 : 3; };
  // Per channel: when each posted send's data arrives, in order; how many receives took theirs.
  std::vector<std::vector<double>> arrivals(number.size());
  std::vector<size_t> taken(number.size(), 0);
  std::vector<double> now(p, 0.0);
  std::vector<size_t> pc(p, 0);
  std::vector<int> in_flight(p, 0);
  std::vector<HeldTracker> held;  // (check_costs checked the sizes)
  for (size_t rank = 0; rank < p; ++rank) held.emplace_back(s, costs.held, static_cast<int>(rank));
  for (bool progress = true; progress;) {
    progress = false;
    for (size_t rank = 0; rank < p; ++rank) {
      const int rk = static_cast<int>(rank);
      const auto& actions = s.actions[rank];
      for (; pc[rank] < actions.size(); ++pc[rank], progress = true) {
        const Action& a = actions[pc[rank]];
        if (is_compute(a.op)) {
          const double start = now[rank];
          const double end = start + cost_of[static_cast<int>(a.op)][static_cast<size_t>(s.virtual_stage(rk, a.chunk))];
          if (record == Record::kTimeline) r.timeline[rank].push_back({a, start, end});
          r.busy[rank] += end - start;
          now[rank] = end;
          held[rank].apply(a);
          if (a.op == Op::kF) r.peak_in_flight[rank] = std::max(r.peak_in_flight[rank], ++in_flight[rank]);
          if (a.op == Op::kB || a.op == Op::kBW) --in_flight[rank];
          continue;
        }
        const size_t channel = channel_of[(rank * v + static_cast<size_t>(a.chunk)) * 4 + transfer_index(a.op)];
        if (a.op == Op::kSendF || a.op == Op::kSendB) {
          arrivals[channel].push_back(now[rank] + costs.transfer);
          continue;
        }
        const std::vector<double>& posted = arrivals[channel];
        size_t& n = taken[channel];
        if (n == posted.size()) break;  // its send is not posted yet: the other ranks go on first
        now[rank] = std::max(now[rank], posted[n++]);
      }
    }
  }
  finish_result(r, now);
  for (const HeldTracker& t : held) r.peak_held.push_back(t.peak());
  return r;
}

}  // namespace zero::parallel
