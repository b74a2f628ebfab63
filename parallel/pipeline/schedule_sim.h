#pragma once
// The simulator of pipeline schedules: what a (checked) schedule costs, given how long each action
// takes. Every rank runs its actions in order; a compute action takes its cost on its virtual stage
// (so uneven stages can be modelled), a send is posted at once and its data arrives `transfer`
// later, a receive waits until then. Out come the step time (the last rank's end), each rank's busy
// and idle time, the bubble fraction (all idle time / (ranks x step time)), the peak number of
// micro-batches in flight per rank (forwarded, input gradient not yet computed: the activations it
// holds), and the timeline, which timeline_svg.h draws.
#include <vector>

#include "parallel/pipeline/schedule.h"

namespace zero::parallel {

struct ActionCosts {
  // Per virtual stage, or one value for all; BW costs B + W.
  std::vector<double> forward{1.0}, backward{1.0}, weight{1.0};
  double transfer = 0.0;  // from a send's post to its receive's data

  double of(Op op, int virtual_stage) const;
};

struct Span {
  Action action;
  double start = 0, end = 0;
};

struct SimResult {
  double step_time = 0;
  std::vector<double> busy, idle;  // per rank
  double bubble_fraction = 0;
  std::vector<int> peak_in_flight;     // per rank
  std::vector<std::vector<Span>> timeline;  // per rank, the compute actions
};

// The schedule must pass check_schedule (a deadlocking one is refused the same way).
SimResult simulate(const Schedule& schedule, const ActionCosts& costs);

}  // namespace zero::parallel
