#pragma once
// What a pipeline schedule holds in activations, from what one micro-batch holds on each virtual
// stage (in bytes, or any unit). Per (micro-batch, chunk): a forward adds `forward` (what its
// backward reads); a split backward's input part (B) replaces that by `weight` (what the weight part
// reads: each layer's input and output gradient, not the whole micro-batch); the weight part (W)
// frees it; a whole backward (BW) frees `forward`. While a backward runs it may hold more for a
// moment (activation recompute rebuilds what the forward dropped): `rebuilt` on top of what was held
// when a whole backward began, `input_peak` when an input part began (both 0 where only the ends of
// actions count). A rank's peak is the most it holds after any action or at such a moment, over all
// its chunks.
//
// One replay for everyone who needs it: the simulator reports each rank's peak (SimResult), ZB-H1's
// generator keeps it under 1F1B's (schedules.h), the planner prices it.
#include <vector>

#include "parallel/pipeline/schedule.h"

namespace zero::parallel {

struct HeldBytes {
  // Per virtual stage, or one value for all. The defaults: a forward and a weight part's keep are a
  // unit each (the zero-bubble paper's schedules), nothing rebuilt.
  std::vector<double> forward{1.0}, weight{1.0}, rebuilt{0.0}, input_peak{0.0};

  double forward_of(int virtual_stage) const { return pick(forward, virtual_stage); }
  double weight_of(int virtual_stage) const { return pick(weight, virtual_stage); }
  double rebuilt_of(int virtual_stage) const { return pick(rebuilt, virtual_stage); }
  double input_peak_of(int virtual_stage) const { return pick(input_peak, virtual_stage); }

 private:
  static double pick(const std::vector<double>& v, int k) {
    return v.size() == 1 ? v[0] : v[static_cast<size_t>(k)];
  }
};

// InvalidArgument naming the field: a list with neither 1 nor `virtual_stages` values, a negative
// or non-finite value.
void check_held_bytes(const HeldBytes& held, int virtual_stages);

// The held activations as a schedule's actions change them, one rank at a time.
class HeldTracker {
 public:
  HeldTracker(const Schedule& schedule, const HeldBytes& held, int rank);
  void apply(const Action& action);  // a compute action of this rank, in its order
  // The most held while `action` runs and after it, were it applied now (the peak so far aside).
  double high_water(const Action& action) const;
  double now() const { return now_; }
  double peak() const { return peak_; }

 private:
  const Schedule& s_;
  const HeldBytes held_;  // a copy: a tracker may outlive the sizes it was given
  const int rank_;
  double now_ = 0, peak_ = 0;
};

// Per rank, the most it holds at once over the schedule's step (check_held_bytes first).
std::vector<double> peak_held(const Schedule& schedule, const HeldBytes& held);

}  // namespace zero::parallel
