#pragma once
// A pipeline timeline as SVG: one row per rank, each compute action a box from its start to its end
// (F blue, B green, W orange, BW teal; later chunks of an interleaved schedule darker) labelled with
// its micro-batch, idle time left blank over a grey band, a time axis below. The same drawing serves
// simulated timelines (schedule_sim.h) and, later, measured ones (the runner's spans).
#include <string>
#include <vector>

#include "parallel/pipeline/schedule_sim.h"

namespace zero::parallel {

struct TimelinePanel {
  std::string title;  // "1F1B: step 33, bubble 27.3%"
  int chunks = 1;
  std::vector<std::vector<Span>> ranks;  // per rank
};

// Panels stacked vertically on one time scale (the longest panel's end), `width` pixels wide.
std::string timeline_svg(const std::vector<TimelinePanel>& panels, int width = 1000);

}  // namespace zero::parallel
