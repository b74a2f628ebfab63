#pragma once
// What a measured step says (the runner's spans from every pipeline rank): each rank's busy time,
// the step time and the bubble as the simulator defines them, the mean cost of each action kind per
// virtual stage (the simulator's inputs, so a measured step can be set beside its prediction), and
// the spans as JSON for --timeline files.
#include <string>
#include <vector>

#include "parallel/pipeline/schedule.h"
#include "parallel/pipeline/schedule_sim.h"

namespace zero::parallel {

struct MeasuredStep {
  double step_time = 0;             // the latest end over the ranks (spans start at each rank's step start)
  std::vector<double> busy, idle;   // per rank
  double bubble_fraction = 0;       // all idle time / (ranks x step time)
  double worst_bubble = 0;          // the largest rank's idle / step time
};

// `spans[r]`: rank r's compute actions.
MeasuredStep measure(const std::vector<std::vector<Span>>& spans);

// The mean measured cost of F, B and W per virtual stage (BW spans count as B, with W 0, so that a
// schedule that does not split simulates its BW at the measured cost). Kinds never measured on a
// stage take the mean over the stages that have them.
ActionCosts measured_costs(const Schedule& schedule, const std::vector<std::vector<Span>>& spans);

// {"schedule": ..., "ranks": p, "chunks": v, "microbatches": m, "spans": [[{"op": "F", "mb": 0,
// "chunk": 0, "start": s, "end": e}, ...] per rank]} (seconds).
std::string spans_json(const Schedule& schedule, const std::vector<std::vector<Span>>& spans);

// The spans as floats (op, mb, chunk, start, end per span) for a collective's buffer, and back.
std::vector<double> pack_spans(const std::vector<Span>& spans);
std::vector<Span> unpack_spans(const double* data, size_t count);

}  // namespace zero::parallel
