#include "parallel/strategy/chart.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "memory/tracker.h"

namespace zero::strategy {

std::vector<const Prediction*> frontier(const std::vector<Prediction>& predictions) {
  std::vector<const Prediction*> fit;
  for (const Prediction& p : predictions) {
    if (p.unsupported.empty() && p.fits) fit.push_back(&p);
  }
  std::sort(fit.begin(), fit.end(), [](const Prediction* a, const Prediction* b) {
    return a->memory.device() != b->memory.device() ? a->memory.device() < b->memory.device()
                                                    : a->time.step() < b->time.step();
  });
  std::vector<const Prediction*> out;
  for (const Prediction* p : fit) {
    if (out.empty() || p->time.step() < out.back()->time.step()) out.push_back(p);
  }
  return out;
}

std::string frontier_svg(const std::vector<Prediction>& predictions, double device_memory, const std::string& title) {
  std::vector<const Prediction*> shown;
  for (const Prediction& p : predictions) {
    if (p.unsupported.empty() && p.estimate == Estimate::kExact) shown.push_back(&p);  // a floor is not a point
  }
  // The axis spans the layouts (and the device's memory when it is within twice their largest: a
  // device far larger would squeeze every layout against the left edge).
  double max_mem = 0, max_ms = 0, min_ms = 1e300;
  for (const Prediction* p : shown) {
    max_mem = std::max(max_mem, static_cast<double>(p->memory.device()));
    max_ms = std::max(max_ms, 1e3 * p->time.step());
    min_ms = std::min(min_ms, 1e3 * p->time.step());
  }
  if (shown.empty()) min_ms = 0, max_ms = 1, max_mem = device_memory;
  const bool device_shown = device_memory <= 2 * max_mem;
  if (device_shown) max_mem = std::max(max_mem, device_memory);
  // Log time axis: step times span orders of magnitude across layouts.
  const double lo = std::log10(std::max(min_ms, 1e-6)) - 0.05, hi = std::log10(std::max(max_ms, 1e-6)) + 0.05;
  const int left = 80, top = 50, w = 760, h = 420;
  auto x_of = [&](double bytes) { return left + w * bytes / (max_mem * 1.05); };
  auto y_of = [&](double ms) { return top + h - h * (std::log10(std::max(ms, 1e-6)) - lo) / std::max(hi - lo, 1e-9); };
  std::string s = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" font-family=\"sans-serif\" font-size=\"11\">\n"
      "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"{}\" y=\"24\" font-size=\"14\">{}</text>\n",
      left + w + 40, top + h + 60, left, title);
  for (int k = 0; k <= 4; ++k) {
    const double ms = std::pow(10.0, lo + (hi - lo) * k / 4), y = y_of(ms);
    s += fmt::format("<line x1=\"{}\" y1=\"{:.1f}\" x2=\"{}\" y2=\"{:.1f}\" stroke=\"#ddd\"/><text x=\"{}\" y=\"{:.1f}\" "
                     "text-anchor=\"end\">{:.3g}</text>\n",
                     left, y, left + w, y, left - 6, y + 4, ms);
    const double bytes = max_mem * 1.05 * k / 4;
    s += fmt::format("<text x=\"{:.1f}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", x_of(bytes), top + h + 16,
                     memory::format_bytes(static_cast<uint64_t>(bytes)));
  }
  s += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">memory per rank</text>\n", left + w / 2, top + h + 36);
  s += fmt::format("<text x=\"16\" y=\"{}\" transform=\"rotate(-90 16 {})\" text-anchor=\"middle\">predicted step "
                   "(ms, log)</text>\n",
                   top + h / 2, top + h / 2);
  if (device_shown) {
    s += fmt::format("<line x1=\"{0:.1f}\" y1=\"{1}\" x2=\"{0:.1f}\" y2=\"{2}\" stroke=\"#e15759\" "
                     "stroke-dasharray=\"5,3\"/><text x=\"{3:.1f}\" y=\"{4}\" fill=\"#e15759\">device memory</text>\n",
                     x_of(device_memory), top, top + h, x_of(device_memory) + 4, top + 12);
  } else {
    s += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"end\" fill=\"#e15759\">device memory {} (off the chart)</text>\n",
                     left + w, top + 12, memory::format_bytes(static_cast<uint64_t>(device_memory)));
  }
  for (const Prediction* p : shown) {
    s += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3.5\" fill=\"{}\" stroke=\"#4e79a7\"><title>{}: {:.3f} ms, "
                     "{}</title></circle>\n",
                     x_of(static_cast<double>(p->memory.device())), y_of(1e3 * p->time.step()),
                     p->fits ? "#4e79a7" : "none", describe(p->layout), 1e3 * p->time.step(),
                     memory::format_bytes(p->memory.device()));
  }
  const std::vector<const Prediction*> f = frontier(predictions);
  std::string points;
  for (const Prediction* p : f) {
    points += fmt::format("{:.1f},{:.1f} ", x_of(static_cast<double>(p->memory.device())), y_of(1e3 * p->time.step()));
  }
  s += fmt::format("<polyline points=\"{}\" fill=\"none\" stroke=\"#f28e2b\" stroke-width=\"2\"/>\n", points);
  // Labels from the fastest up, each at least a line below the one before (the rest are titles).
  double last_y = -1e9;
  for (size_t k = f.size(); k-- > 0;) {
    const Prediction* p = f[k];
    const double y = y_of(1e3 * p->time.step()) - 6;
    if (k + 1 != f.size() && last_y - y < 12) continue;
    last_y = y;
    s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" fill=\"#b05a00\" font-size=\"10\">{}{}</text>\n",
                     x_of(static_cast<double>(p->memory.device())) + 6, y, k + 1 == f.size() ? "fastest: " : "",
                     describe(p->layout));
  }
  s += fmt::format("<text x=\"{}\" y=\"{}\">solid: fits; hollow: does not; orange: the frontier</text>\n</svg>\n", left,
                   top - 10);
  return s;
}

}  // namespace zero::strategy
