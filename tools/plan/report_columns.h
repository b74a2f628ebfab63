#pragma once
// The memory report's columns as the bench tables name them (zero_bench, zero_plan, bench_chart).
// Which rows each column adds is the report's own (MemoryReport::Row::column, set where the rows
// are built), the same grouping the planner's search reads.
#include <cstdint>
#include <string>
#include <vector>

#include "zero/memory_report.h"

namespace zero::plan {

// "params", "grads", ..., in MemoryColumn order.
inline std::vector<std::string> report_column_names() {
  std::vector<std::string> names;
  for (int c = 0; c < kNumMemoryColumns; ++c) names.emplace_back(memory_column_name(static_cast<MemoryColumn>(c)));
  return names;
}

inline uint64_t sum_of(const std::vector<uint64_t>& v) {
  uint64_t t = 0;
  for (uint64_t x : v) t += x;
  return t;
}

}  // namespace zero::plan
