#include "parallel/pipeline/measured.h"

#include <algorithm>

#include <fmt/format.h>

#include "base/check.h"

namespace zero::parallel {

MeasuredStep measure(const std::vector<std::vector<Span>>& spans) {
  MeasuredStep m;
  for (const auto& rank : spans) {
    double busy = 0;
    for (const Span& s : rank) {
      busy += s.end - s.start;
      m.step_time = std::max(m.step_time, s.end);
    }
    m.busy.push_back(busy);
  }
  double idle_sum = 0;
  for (double b : m.busy) {
    m.idle.push_back(m.step_time - b);
    idle_sum += m.step_time - b;
    if (m.step_time > 0) m.worst_bubble = std::max(m.worst_bubble, (m.step_time - b) / m.step_time);
  }
  if (m.step_time > 0 && !spans.empty()) m.bubble_fraction = idle_sum / (static_cast<double>(spans.size()) * m.step_time);
  return m;
}

ActionCosts measured_costs(const Schedule& schedule, const std::vector<std::vector<Span>>& spans) {
  const int V = schedule.virtual_stages();
  // kind (0 F, 1 B, 2 W) -> per virtual stage (sum, count)
  std::vector<std::vector<std::pair<double, int>>> acc(3, std::vector<std::pair<double, int>>(static_cast<size_t>(V)));
  for (size_t r = 0; r < spans.size(); ++r) {
    for (const Span& s : spans[r]) {
      const int kind = s.action.op == Op::kF ? 0 : s.action.op == Op::kW ? 2 : 1;
      auto& cell = acc[static_cast<size_t>(kind)][static_cast<size_t>(schedule.virtual_stage(static_cast<int>(r), s.action.chunk))];
      cell.first += s.end - s.start;
      cell.second += 1;
    }
  }
  std::vector<std::vector<double>> means(3, std::vector<double>(static_cast<size_t>(V), 0.0));
  for (size_t kind = 0; kind < 3; ++kind) {
    double sum = 0;
    int n = 0;
    for (const auto& [s, c] : acc[kind]) {
      sum += s;
      n += c;
    }
    const double overall = n > 0 ? sum / n : 0.0;
    for (size_t k = 0; k < static_cast<size_t>(V); ++k) {
      const auto& [s, c] = acc[kind][k];
      means[kind][k] = c > 0 ? s / c : overall;
    }
  }
  ActionCosts costs;
  costs.forward = means[0];
  costs.backward = means[1];
  costs.weight = means[2];
  return costs;
}

std::string spans_json(const Schedule& schedule, const std::vector<std::vector<Span>>& spans) {
  std::string out = fmt::format(R"({{"schedule": "{}", "ranks": {}, "chunks": {}, "microbatches": {}, "spans": [)",
                                schedule.name, schedule.ranks, schedule.chunks, schedule.microbatches);
  for (size_t r = 0; r < spans.size(); ++r) {
    out += r == 0 ? "\n  [" : ",\n  [";
    for (size_t i = 0; i < spans[r].size(); ++i) {
      const Span& s = spans[r][i];
      out += fmt::format(R"({}{{"op": "{}", "mb": {}, "chunk": {}, "start": {:.9f}, "end": {:.9f}}})", i == 0 ? "" : ", ",
                         op_name(s.action.op), s.action.mb, s.action.chunk, s.start, s.end);
    }
    out += "]";
  }
  out += "\n]}\n";
  return out;
}

std::vector<double> pack_spans(const std::vector<Span>& spans) {
  std::vector<double> out;
  for (const Span& s : spans) {
    out.insert(out.end(), {static_cast<double>(s.action.op), static_cast<double>(s.action.mb),
                           static_cast<double>(s.action.chunk), s.start, s.end});
  }
  return out;
}

std::vector<Span> unpack_spans(const double* data, size_t count) {
  std::vector<Span> out;
  for (size_t i = 0; i < count; ++i) {
    const double* d = data + 5 * i;
    out.push_back({{static_cast<Op>(static_cast<int>(d[0])), static_cast<int>(d[1]), static_cast<int>(d[2])}, d[3], d[4]});
  }
  return out;
}

}  // namespace zero::parallel
