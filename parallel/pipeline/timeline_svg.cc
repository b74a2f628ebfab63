#include "parallel/pipeline/timeline_svg.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

namespace zero::parallel {
namespace {

constexpr int kRowHeight = 22;
constexpr int kRowGap = 4;
constexpr int kLabelWidth = 60;
constexpr int kTitleHeight = 22;
constexpr int kAxisHeight = 22;
constexpr int kPanelGap = 14;

// Fill colour of a compute action: a hue per kind, darker for later chunks.
std::string colour(Op op, int chunk, int chunks) {
  int r = 0, g = 0, b = 0;
  switch (op) {
    case Op::kF: r = 66, g = 133, b = 244; break;
    case Op::kB: r = 52, g = 168, b = 83; break;
    case Op::kW: r = 251, g = 140, b = 0; break;
    default: r = 0, g = 150, b = 136; break;  // BW
  }
  const double shade = chunks > 1 ? 1.0 - 0.45 * chunk / (chunks - 1) : 1.0;
  return fmt::format("rgb({},{},{})", static_cast<int>(r * shade), static_cast<int>(g * shade),
                     static_cast<int>(b * shade));
}

std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '&') out += "&amp;";
    else if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else out += c;
  }
  return out;
}

}  // namespace

std::string timeline_svg(const std::vector<TimelinePanel>& panels, int width) {
  double end = 0;
  int height = 0;
  for (const TimelinePanel& p : panels) {
    for (const auto& row : p.ranks) {
      for (const Span& s : row) end = std::max(end, s.end);
    }
    height += kTitleHeight + static_cast<int>(p.ranks.size()) * (kRowHeight + kRowGap) + kAxisHeight + kPanelGap;
  }
  if (end <= 0) end = 1;
  const double scale = (width - kLabelWidth - 10) / end;
  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" font-family=\"sans-serif\" "
      "font-size=\"11\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
      width, height);
  int y = 0;
  for (const TimelinePanel& p : panels) {
    svg += fmt::format("<text x=\"4\" y=\"{}\" font-size=\"13\" font-weight=\"bold\">{}</text>\n", y + 16,
                       escape(p.title));
    y += kTitleHeight;
    for (size_t r = 0; r < p.ranks.size(); ++r) {
      const int top = y + static_cast<int>(r) * (kRowHeight + kRowGap);
      svg += fmt::format("<text x=\"4\" y=\"{}\">rank {}</text>\n", top + 15, r);
      // The grey band shows through where the rank is idle.
      svg += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{:.1f}\" height=\"{}\" fill=\"#e6e6e6\"/>\n", kLabelWidth, top,
                         end * scale, kRowHeight);
      for (const Span& s : p.ranks[r]) {
        const double x = kLabelWidth + s.start * scale, w = std::max(0.5, (s.end - s.start) * scale);
        svg += fmt::format(
            "<rect x=\"{:.1f}\" y=\"{}\" width=\"{:.1f}\" height=\"{}\" fill=\"{}\" stroke=\"white\" "
            "stroke-width=\"0.5\"><title>{} {:.2f}-{:.2f}</title></rect>\n",
            x, top, w, kRowHeight, colour(s.action.op, s.action.chunk, p.chunks),
            escape(describe(s.action, p.chunks)), s.start, s.end);
        if (w >= 12) {
          svg += fmt::format("<text x=\"{:.1f}\" y=\"{}\" fill=\"white\" text-anchor=\"middle\">{}</text>\n", x + w / 2,
                             top + 15, s.action.mb);
        }
      }
    }
    y += static_cast<int>(p.ranks.size()) * (kRowHeight + kRowGap);
    // The time axis: ten ticks.
    svg += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{:.1f}\" y2=\"{}\" stroke=\"black\"/>\n", kLabelWidth, y + 2,
                       kLabelWidth + end * scale, y + 2);
    for (int t = 0; t <= 10; ++t) {
      const double v = end * t / 10;
      svg += fmt::format("<text x=\"{:.1f}\" y=\"{}\" text-anchor=\"middle\" fill=\"#555\">{:.4g}</text>\n",
                         kLabelWidth + v * scale, y + 16, v);
    }
    y += kAxisHeight + kPanelGap;
  }
  svg += "</svg>\n";
  return svg;
}

}  // namespace zero::parallel
