#include "parallel/pipeline/step_timeline.h"

#include <fmt/format.h>

#include <cstdio>

#include "base/check.h"
#include "base/error.h"
#include "parallel/pipeline/measured.h"
#include "parallel/pipeline/timeline_svg.h"

namespace zero::parallel {
namespace {

void write_file(const std::string& path, const std::string& text) {
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) ZERO_THROW(IoError, "step timeline: cannot write '{}'", path);
  const bool ok = std::fputs(text.c_str(), f) >= 0;
  if (std::fclose(f) != 0 || !ok) ZERO_THROW(IoError, "step timeline: cannot write '{}'", path);
}

}  // namespace

StepTimeline write_step_timeline(const std::string& path, const Schedule& s, comm::Communicator& pp,
                                 const std::vector<Span>& spans, bool writes) {
  const std::vector<double> mine = pack_spans(spans);
  std::vector<double> all(mine.size() * static_cast<size_t>(s.ranks));
  pp.all_gather(mine.data(), all.data(), mine.size(), DType::kFloat64)->wait();
  if (!writes) return {};
  std::vector<std::vector<Span>> ranks;
  for (int r = 0; r < s.ranks; ++r) ranks.push_back(unpack_spans(all.data() + r * mine.size(), spans.size()));
  const MeasuredStep m = measure(ranks);
  const SimResult sim = simulate(s, measured_costs(s, ranks));
  write_file(path, spans_json(s, ranks));
  write_file(path + ".svg",
             timeline_svg({{fmt::format("{} measured: step {:.1f} ms, bubble {:.1f}%", s.name, 1e3 * m.step_time,
                                        100 * m.bubble_fraction),
                            s.chunks, ranks},
                           {fmt::format("{} simulated from the measured costs: step {:.1f} ms, bubble {:.1f}%", s.name,
                                        1e3 * sim.step_time, 100 * sim.bubble_fraction),
                            s.chunks, sim.timeline}}));
  return {m.bubble_fraction, sim.bubble_fraction};
}

}  // namespace zero::parallel
