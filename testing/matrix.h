#pragma once
// Test matrices (layouts x stages x schedules) run whole only on request: the suite runs a subset in
// which every value of every axis still appears, and
//   ZERO_FULL_MATRIX=1 bazel test --test_env=ZERO_FULL_MATRIX ...      (scripts/full_matrix.sh)
// runs every combination. The result of the whole matrix goes in the issue note of the change.
#include <cstdlib>
#include <string_view>

namespace zero::testing {

inline bool full_matrix() {
  const char* v = std::getenv("ZERO_FULL_MATRIX");
  return v != nullptr && std::string_view(v) == "1";
}

}  // namespace zero::testing
