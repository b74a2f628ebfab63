// bench_chart: zero_bench's CSV as one SVG a browser displays: per-rank peak memory by configuration
// and world size, stacked by category (the planner's total marked on each bar), and the step time.
//
//   bazel-bin/examples/bench/bench_chart --csv zero_bench.csv --svg zero_bench.svg
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "base/check.h"
#include "tools/plan/report_columns.h"
#include "tools/cli/flags.h"

namespace zero {
namespace {

struct CsvRow {
  std::map<std::string, std::string> at;
  double num(const std::string& k) const {
    auto it = at.find(k);
    if (it == at.end()) ZERO_THROW(InvalidArgument, "the CSV has no column '{}'", k);
    return std::stod(it->second);
  }
};

std::vector<std::string> split(const std::string& line) {
  std::vector<std::string> out;
  std::stringstream s(line);
  for (std::string f; std::getline(s, f, ',');) out.push_back(f);
  return out;
}

std::vector<CsvRow> read_csv(const std::string& path) {
  std::ifstream in(path);
  if (!in) ZERO_THROW(IoError, "--csv '{}': cannot open", path);
  std::string line;
  std::vector<std::string> head;
  std::vector<CsvRow> rows;
  for (int no = 1; std::getline(in, line); ++no) {
    if (line.empty()) continue;
    if (head.empty() || line.rfind("config,", 0) == 0) {
      head = split(line);  // a header (zero_bench writes one per fresh file; appended runs repeat none)
      continue;
    }
    const std::vector<std::string> f = split(line);
    if (f.size() != head.size()) ZERO_THROW(InvalidArgument, "{}:{}: {} fields, the header has {}", path, no, f.size(), head.size());
    CsvRow r;
    for (size_t i = 0; i < f.size(); ++i) r.at[head[i]] = f[i];
    rows.push_back(std::move(r));
  }
  if (rows.empty()) ZERO_THROW(InvalidArgument, "'{}': no rows", path);
  return rows;
}

const char* kColors[] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#9c755f"};

int run(int argc, char** argv) {
  cli::Flags flags(argc, argv);
  const std::string csv = flags.get("csv", "zero_bench.csv");
  const std::string svg = flags.get("svg", "zero_bench.svg");
  flags.check_all_used();
  const std::vector<CsvRow> rows = read_csv(csv);
  std::vector<std::string> configs;
  std::vector<int> worlds;
  for (const CsvRow& r : rows) {
    if (std::find(configs.begin(), configs.end(), r.at.at("config")) == configs.end()) configs.push_back(r.at.at("config"));
    const int w = static_cast<int>(r.num("world"));
    if (std::find(worlds.begin(), worlds.end(), w) == worlds.end()) worlds.push_back(w);
  }
  std::sort(worlds.begin(), worlds.end());
  auto find = [&](const std::string& c, int w) -> const CsvRow* {
    for (const CsvRow& r : rows) {
      if (r.at.at("config") == c && static_cast<int>(r.num("world")) == w) return &r;
    }
    return nullptr;
  };
  const std::vector<std::string> columns = plan::report_column_names();
  double top_mib = 0, top_ms = 0;
  for (const CsvRow& r : rows) {
    double t = 0;
    for (const std::string& col : columns) t += r.num(col + "_bytes") / (1 << 20);
    top_mib = std::max({top_mib, t, r.num("formula_bytes") / (1 << 20)});
    top_ms = std::max(top_ms, r.num("step_ms"));
  }
  const int bar = 18, gap = 28, left = 80, panel_h = 300;
  const int width = std::max(640, left + static_cast<int>(configs.size()) * (static_cast<int>(worlds.size()) * bar + gap) + 160);
  const int mem_top = 60, time_top = mem_top + panel_h + 90, height = time_top + panel_h + 70;
  std::string out = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" font-family=\"sans-serif\" font-size=\"11\">\n"
      "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
      width, height);
  const CsvRow& first = rows.front();
  out += fmt::format("<text x=\"{}\" y=\"20\" font-size=\"15\">zero_bench: GPT {} layers, n_embd {}, {:.1f}M parameters</text>\n"
                     "<text x=\"{}\" y=\"42\" font-size=\"13\">per-rank peak memory (MiB) by configuration, "
                     "stacked by category; bars N = {}</text>\n",
                     left, first.at.at("n_layer"), first.at.at("n_embd"), first.num("params") / 1e6, left,
                     fmt::join(worlds, ", "));
  auto axis = [&](int top, double max, const char* unit) {
    for (int k = 0; k <= 4; ++k) {
      const double v = max * k / 4;
      const int y = top + panel_h - static_cast<int>(panel_h * k / 4.0);
      out += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"#ddd\"/>"
                         "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{:.0f} {}</text>\n",
                         left, y, width - 150, y, left - 6, y + 4, v, unit);
    }
  };
  top_mib *= 1.05;
  top_ms *= 1.05;
  axis(mem_top, top_mib, "MiB");
  axis(time_top, top_ms, "ms");
  out += fmt::format("<text x=\"{}\" y=\"{}\" font-size=\"13\">step time (ms, median) by configuration, bars N = {}</text>\n",
                     left, time_top - 20, fmt::join(worlds, ", "));
  for (size_t c = 0; c < configs.size(); ++c) {
    const int x0 = left + 10 + static_cast<int>(c) * (static_cast<int>(worlds.size()) * bar + gap);
    for (size_t w = 0; w < worlds.size(); ++w) {
      const CsvRow* r = find(configs[c], worlds[w]);
      if (r == nullptr) continue;
      const int x = x0 + static_cast<int>(w) * bar;
      double acc = 0, planned = 0;
      for (size_t k = 0; k < columns.size(); ++k) {
        const double v = r->num(columns[k] + "_bytes") / (1 << 20);
        planned += r->num("planned_" + columns[k] + "_bytes") / (1 << 20);
        const int y1 = mem_top + panel_h - static_cast<int>(panel_h * (acc + v) / top_mib);
        const int y0 = mem_top + panel_h - static_cast<int>(panel_h * acc / top_mib);
        if (y0 > y1) {
          out += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{}\"><title>{} N={} {}: {:.1f} MiB</title></rect>\n",
                             x, y1, bar - 2, y0 - y1, kColors[k % 8], configs[c], worlds[w], columns[k], v);
        }
        acc += v;
      }
      const int yp = mem_top + panel_h - static_cast<int>(panel_h * planned / top_mib);
      out += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\" stroke-width=\"2\"><title>planned {:.1f} MiB</title></line>\n",
                         x - 1, yp, x + bar - 1, yp, planned);
      out += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" font-size=\"9\">{}</text>\n", x + bar / 2,
                         mem_top + panel_h + 12, worlds[w]);
      const double ms = r->num("step_ms");
      const int yt = time_top + panel_h - static_cast<int>(panel_h * ms / top_ms);
      out += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{}\"><title>{} N={}: {:.1f} ms</title></rect>\n",
                         x, yt, bar - 2, time_top + panel_h - yt, kColors[w % 8], configs[c], worlds[w], ms);
      out += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" font-size=\"9\">{}</text>\n", x + bar / 2,
                         time_top + panel_h + 12, worlds[w]);
    }
    const int mid = x0 + static_cast<int>(worlds.size()) * bar / 2;
    out += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", mid, mem_top + panel_h + 28, configs[c]);
    out += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", mid, time_top + panel_h + 28, configs[c]);
  }
  for (size_t k = 0; k < columns.size(); ++k) {
    const int y = mem_top + 10 + static_cast<int>(k) * 18;
    out += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"12\" height=\"12\" fill=\"{}\"/><text x=\"{}\" y=\"{}\">{}</text>\n",
                       width - 140, y, kColors[k % 8], width - 122, y + 10, columns[k]);
  }
  const int ly = mem_top + 10 + static_cast<int>(columns.size()) * 18;
  out += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\" stroke-width=\"2\"/><text x=\"{}\" y=\"{}\">planned total</text>\n",
                     width - 140, ly + 6, width - 128, ly + 6, width - 122, ly + 10);
  out += "</svg>\n";
  std::ofstream f(svg);
  if (!f) ZERO_THROW(IoError, "--svg '{}': cannot create", svg);
  f << out;
  std::printf("bench_chart: %zu rows of '%s' -> '%s'\n", rows.size(), csv.c_str(), svg.c_str());
  return 0;
}

}  // namespace
}  // namespace zero

int main(int argc, char** argv) { return zero::cli::run_program("bench_chart", zero::run, argc, argv); }
