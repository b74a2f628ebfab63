// layout_chart: scripts/layout_memory.sh's CSV as one SVG: per-rank peak memory by category, stacked,
// one bar per (dp, tp, pp) layout, grouped by ZeRO stage, the planner's total marked on each bar.
//
//   bazel-bin/examples/bench/layout_chart --csv layout_memory.csv --svg layout_memory.svg
//
// The CSV: a header, then "layout,stage,params,grads,master,optim,buffers,window,planned" per row
// (bytes; layout "dp,tp,pp" quoted as "dp/tp/pp").
#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "base/check.h"
#include "tools/cli/flags.h"

namespace zero {
namespace {

struct Row {
  std::string layout;
  int stage = 0;
  std::vector<double> kib;  // params, grads, master, optim, buffers, window
  double planned_kib = 0;
  double total() const {
    double t = 0;
    for (double v : kib) t += v;
    return t;
  }
};

const char* kCategories[] = {"params", "grads", "master", "optimizer", "buffers", "window"};
const char* kColors[] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948"};

std::vector<Row> read_rows(const std::string& path) {
  std::ifstream in(path);
  if (!in) ZERO_THROW(IoError, "--csv '{}': cannot open", path);
  std::vector<Row> rows;
  std::string line;
  std::getline(in, line);  // header
  for (int n = 2; std::getline(in, line); ++n) {
    if (line.empty()) continue;
    std::vector<std::string> f;
    std::stringstream parts(line);
    for (std::string x; std::getline(parts, x, ',');) f.push_back(x);
    if (f.size() != 9) ZERO_THROW(InvalidArgument, "'{}' line {}: {} fields, expected 9", path, n, f.size());
    Row r;
    r.layout = f[0];
    r.stage = std::stoi(f[1]);
    for (size_t k = 2; k < 8; ++k) r.kib.push_back(std::stod(f[k]) / 1024);
    r.planned_kib = std::stod(f[8]) / 1024;
    rows.push_back(std::move(r));
  }
  if (rows.empty()) ZERO_THROW(InvalidArgument, "'{}': no rows", path);
  return rows;
}

int run(int argc, char** argv) {
  cli::Flags flags(argc, argv);
  const std::string csv = flags.get("csv", "layout_memory.csv");
  const std::string svg = flags.get("svg", "layout_memory.svg");
  const std::string title = flags.get("title", "per-rank peak memory (KiB) by (dp/tp/pp) layout and ZeRO stage");
  flags.check_all_used();
  const std::vector<Row> rows = read_rows(csv);
  std::vector<int> stages;
  for (const Row& r : rows) {
    if (std::find(stages.begin(), stages.end(), r.stage) == stages.end()) stages.push_back(r.stage);
  }
  double top = 0;
  for (const Row& r : rows) top = std::max({top, r.total(), r.planned_kib});
  top *= 1.08;
  const int bar = 34, gap = 40, left = 80, top_y = 60, panel_h = 320;
  int bars = 0;
  for (int s : stages) bars += static_cast<int>(std::count_if(rows.begin(), rows.end(), [&](const Row& r) { return r.stage == s; }));
  const int width = left + bars * bar + static_cast<int>(stages.size()) * gap + 170;
  const int height = top_y + panel_h + 70;
  std::string out = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" font-family=\"sans-serif\" font-size=\"11\">\n"
      "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"{}\" y=\"24\" font-size=\"14\">{}</text>\n",
      width, height, left, title);
  for (int k = 0; k <= 4; ++k) {
    const int y = top_y + panel_h - panel_h * k / 4;
    out += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"#ddd\"/><text x=\"{}\" y=\"{}\" "
                       "text-anchor=\"end\">{:.0f}</text>\n",
                       left, y, width - 160, y, left - 6, y + 4, top * k / 4);
  }
  int x = left + 10;
  for (int s : stages) {
    const int group_x = x;
    for (const Row& r : rows) {
      if (r.stage != s) continue;
      double acc = 0;
      for (size_t k = 0; k < r.kib.size(); ++k) {
        const int y1 = top_y + panel_h - static_cast<int>(panel_h * (acc + r.kib[k]) / top);
        const int y0 = top_y + panel_h - static_cast<int>(panel_h * acc / top);
        if (y0 > y1) {
          out += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{}\"><title>{} stage {} {}: {:.0f} "
                             "KiB</title></rect>\n",
                             x, y1, bar - 4, y0 - y1, kColors[k], r.layout, s, kCategories[k], r.kib[k]);
        }
        acc += r.kib[k];
      }
      const int yp = top_y + panel_h - static_cast<int>(panel_h * r.planned_kib / top);
      out += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\" stroke-width=\"2\"><title>planned "
                         "{:.0f} KiB</title></line>\n<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" font-size=\"9\">{}</text>\n",
                         x - 1, yp, x + bar - 3, yp, r.planned_kib, x + bar / 2 - 2, top_y + panel_h + 13, r.layout);
      x += bar;
    }
    out += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" font-size=\"12\">ZeRO stage {}</text>\n",
                       (group_x + x) / 2, top_y + panel_h + 32, s);
    x += gap;
  }
  for (size_t k = 0; k < 6; ++k) {
    const int y = top_y + 10 + static_cast<int>(k) * 18;
    out += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"12\" height=\"12\" fill=\"{}\"/><text x=\"{}\" y=\"{}\">{}</text>\n",
                       width - 150, y, kColors[k], width - 132, y + 10, kCategories[k]);
  }
  out += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\" stroke-width=\"2\"/><text x=\"{}\" "
                     "y=\"{}\">planned total</text>\n</svg>\n",
                     width - 150, top_y + 126, width - 138, top_y + 126, width - 132, top_y + 130);
  std::ofstream(svg) << out;
  return 0;
}

}  // namespace
}  // namespace zero

int main(int argc, char** argv) { return zero::cli::run_program("layout_chart", zero::run, argc, argv); }
