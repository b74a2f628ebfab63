// pipeline_schedules: the named pipeline schedules (parallel/pipeline/schedules.h) generated, checked
// and simulated for p ranks and m micro-batches: a table of step time, bubble fraction (with the
// closed form for uniform stages beside it), peak micro-batches in flight per rank, the largest
// rank's peak of held activations over 1F1B's (a micro-batch's forward a unit of a rank's stage, a
// deferred W keeping --weight-keeps of it), and the timelines drawn into one SVG.
//
//   bazel-bin/examples/bench/pipeline_schedules --p 4 --m 8 [--v 2] [--schedules gpipe,1f1b,interleaved,zb-h1,zb-v]
//       [--weight-keeps 1]
//       [--forward 1 --backward 1 --weight 1 --transfer 0] [--svg FILE]
//
// Costs are per virtual stage when given as lists ("1,1,2,1": an uneven pipeline), else one value
// for a rank's whole stage: interleaved schedules cut it into v chunks of 1/v each (zb-v into 2), so
// that every row compares the same model. A full backward (BW) costs backward + weight.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "base/check.h"
#include "tools/cli/flags.h"
#include "parallel/pipeline/schedule_sim.h"
#include "parallel/pipeline/schedules.h"
#include "parallel/pipeline/timeline_svg.h"

namespace zero {
namespace {

std::vector<double> costs(cli::Flags& flags, const char* name) {
  std::vector<double> v;
  for (const std::string& s : flags.get_list(name, "1")) v.push_back(std::stod(s));
  return v;
}

// The bubble fraction of the step for uniform stages and the given costs.
double closed_form(const std::string& name, int p, int m, int v, double f, double b, double w) {
  const double full = f + b + w;
  if (name == "interleaved") return (p - 1.0) / (v * m + p - 1.0);
  if (name == "zb-h1") return (p - 1) * (f + b - w) / (m * full + (p - 1) * (f + b - w));
  return (p - 1.0) / (m + p - 1.0);
}

int run(int argc, char** argv) {
  cli::Flags flags(argc, argv);
  const int p = flags.get_int("p", 4), m = flags.get_int("m", 8), v = flags.get_int("v", 2);
  const std::vector<std::string> names = flags.get_list("schedules", "gpipe,1f1b,interleaved,zb-h1,zb-v");
  const double keeps = flags.get_double("weight-keeps", 1.0);
  parallel::ActionCosts c;
  c.forward = costs(flags, "forward");
  c.backward = costs(flags, "backward");
  c.weight = costs(flags, "weight");
  c.transfer = flags.get_double("transfer", 0.0);
  const std::string svg = flags.get("svg", "");
  flags.check_all_used();

  std::printf("p = %d ranks, m = %d micro-batches; costs F %s, B %s, W %s, transfer %g\n\n", p, m,
              fmt::format("{}", fmt::join(c.forward, ",")).c_str(), fmt::format("{}", fmt::join(c.backward, ",")).c_str(),
              fmt::format("{}", fmt::join(c.weight, ",")).c_str(), c.transfer);
  std::printf("%-12s %3s %9s %9s %13s %7s  %s\n", "schedule", "v", "step", "bubble", "closed form", "/1F1B",
              "peak in flight by rank");
  std::vector<parallel::TimelinePanel> panels;
  for (const std::string& name : names) {
    const int chunks = name == "interleaved" ? v : name == "zb-v" ? 2 : 1;
    parallel::ActionCosts chunk_costs = c;
    for (auto* v : {&chunk_costs.forward, &chunk_costs.backward, &chunk_costs.weight}) {
      if (v->size() == 1) (*v)[0] /= chunks;
    }
    chunk_costs.held.forward = {1.0 / chunks};
    chunk_costs.held.weight = {keeps / chunks};
    const parallel::Schedule s = parallel::make_schedule(name, p, m, chunks, 0, chunk_costs);
    const parallel::SimResult r = parallel::simulate(s, chunk_costs);  // checks it first
    const double closed = name == "zb-v" ? 0.0 : closed_form(name, p, m, chunks, c.forward[0], c.backward[0], c.weight[0]);
    const double held = *std::max_element(r.peak_held.begin(), r.peak_held.end()) /
                        parallel::one_f_one_b_peak(chunk_costs.held, p, chunks, m);
    std::printf("%-12s %3d %9.2f %8.1f%% %12s %7.3f  %s\n", name.c_str(), chunks, r.step_time, 100 * r.bubble_fraction,
                name == "zb-v" ? "-" : fmt::format("{:.1f}%", 100 * closed).c_str(), held,
                fmt::format("{}", fmt::join(r.peak_in_flight, " ")).c_str());
    panels.push_back({fmt::format("{} (p {}, m {}{}): step {:.4g}, bubble {:.1f}%", name, p, m,
                                  chunks > 1 ? fmt::format(", v {}", chunks) : "", r.step_time, 100 * r.bubble_fraction),
                      chunks, r.timeline});
  }
  if (!svg.empty()) {
    std::ofstream out(svg);
    if (!out) ZERO_THROW(IoError, "cannot write '{}'", svg);
    out << parallel::timeline_svg(panels);
    std::printf("\ntimelines: %s\n", svg.c_str());
  }
  return 0;
}

}  // namespace
}  // namespace zero

int main(int argc, char** argv) { return zero::cli::run_program("pipeline_schedules", zero::run, argc, argv); }
