#pragma once
// The memory report's rows grouped as the bench tables show them (zero_bench, zero_plan).
#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "zero/memory_report.h"

namespace zero::plan {

inline const std::vector<std::pair<std::string, std::vector<std::string>>>& report_columns() {
  static const std::vector<std::pair<std::string, std::vector<std::string>>> columns = {
      {"params", {"params (user)", "params (shard)"}},
      {"grads", {"grads"}},
      {"master", {"master_params"}},
      {"optim", {"optimizer_state"}},
      {"buckets", {"comm_buffer"}},
      {"window", {"gather_window", "secondary_shard"}},
      {"host", {"offload params", "offload master", "offload state", "offload staging"}},
      {"scratch", {"comm (process)"}},
  };
  return columns;
}

// Peak bytes per column.
inline std::vector<uint64_t> report_column_peaks(const MemoryReport& r) {
  std::vector<uint64_t> out;
  for (const auto& [column, rows] : report_columns()) {
    uint64_t sum = 0;
    for (const MemoryReport::Row& row : r.rows) {
      if (std::find(rows.begin(), rows.end(), row.category) != rows.end()) sum += row.peak;
    }
    out.push_back(sum);
  }
  return out;
}

inline uint64_t sum_of(const std::vector<uint64_t>& v) {
  uint64_t t = 0;
  for (uint64_t x : v) t += x;
  return t;
}

}  // namespace zero::plan
