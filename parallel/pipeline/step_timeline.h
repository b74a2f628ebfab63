#pragma once
// A pipeline step's timeline as files (train_gpt --timeline FILE): every pipeline rank's measured
// actions of one step, gathered over the pp group, written as JSON (FILE) and drawn (FILE.svg) above
// the simulator's timeline of the same schedule at the measured mean costs, so a run shows where its
// bubble differs from the model's.
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "parallel/pipeline/schedule.h"
#include "parallel/pipeline/schedule_sim.h"

namespace zero::parallel {

struct StepTimeline {
  double measured_bubble = 0, simulated_bubble = 0;  // fractions of the step
};

// Collective over `pp` (each rank gives its spans of the same step); the rank where `writes` is true
// writes the files (one rank of the whole mesh should) and gets the bubbles, the others zeros.
// IoError naming the file when it cannot be written.
StepTimeline write_step_timeline(const std::string& path, const Schedule& schedule, comm::Communicator& pp,
                                 const std::vector<Span>& spans, bool writes);

}  // namespace zero::parallel
