#pragma once
// The simulator of pipeline schedules: what a (checked) schedule costs, given how long each action
// takes. Every rank runs its actions in order; a compute action takes its cost on its virtual stage
// (so uneven stages can be modelled), a send is posted at once and its data arrives `transfer`
// later, a receive waits until then. Out come the step time (the last rank's end), each rank's busy
// and idle time, the bubble fraction (all idle time / (ranks x step time)), the peak number of
// micro-batches in flight per rank (forwarded, input gradient not yet computed: the activations it
// holds), each rank's peak held activations from per-virtual-stage sizes (held_activations.h), and
// the timeline, which timeline_svg.h draws.
//
// Shared cores (ranks that are processes on a CPU with fewer cores than ranks): given `cores`, the
// compute actions running at one moment progress at min(1, cores / running) of their speed each
// (processor sharing), so a rank waiting in the bubble frees its share for the others. A compute
// action's cost is then its time alone on a core; its span is the wall time it took.
#include <vector>

#include "parallel/pipeline/held_activations.h"
#include "parallel/pipeline/schedule.h"

namespace zero::parallel {

struct ActionCosts {
  // Per virtual stage, or one value for all; BW costs B + W.
  std::vector<double> forward{1.0}, backward{1.0}, weight{1.0};
  double transfer = 0.0;  // from a send's post to its receive's data
  HeldBytes held;         // what a micro-batch holds (SimResult::peak_held), a unit each by default

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
  std::vector<double> peak_held;       // per rank, in costs.held's unit
  std::vector<std::vector<Span>> timeline;  // per rank, the compute actions (Record::kTimeline)
};

// InvalidArgument naming the field: a list of costs or sizes with neither 1 nor `virtual_stages`
// values, a negative transfer.
void check_costs(const ActionCosts& costs, int virtual_stages);

// The schedule must pass check_schedule (a deadlocking one is refused the same way). `cores`: the
// cores the ranks share (may be fractional: a pipeline among others on the same cores); 0, or at
// least one per rank: each rank has its own.
SimResult simulate(const Schedule& schedule, const ActionCosts& costs, double cores = 0);
// What a simulation keeps besides the times: the timeline (to draw or measure), or not (a search
// that simulates thousands of schedules wants only the step, the busy times and the peaks).
enum class Record { kTimeline, kTimes };

// The same for a schedule that already passed check_schedule, which is not run again: for a caller
// that simulates one schedule under many costs (the strategy planner, where checking every time
// took a third of a search). The costs are still checked.
SimResult simulate_checked(const Schedule& checked_schedule, const ActionCosts& costs, double cores = 0,
                           Record record = Record::kTimeline);

}  // namespace zero::parallel
