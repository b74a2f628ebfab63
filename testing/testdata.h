#pragma once
// Paths of the PyTorch reference results in tests/data/pytorch (see its README.md). Tests list
// "//testing:pytorch_data" in their data, so the files sit in the test's runfiles; the path is
// relative to the runfiles root Bazel starts the test in. ZERO_TESTDATA overrides the folder.
#include <cstdlib>
#include <filesystem>
#include <string>

#include "base/check.h"

namespace zero::testing {

inline std::filesystem::path testdata_path(const std::string& relative) {
  namespace fs = std::filesystem;
  fs::path dir = "tests/data/pytorch";
  if (const char* env = std::getenv("ZERO_TESTDATA")) dir = env;
  const fs::path p = dir / relative;
  std::error_code ec;
  if (!fs::exists(p, ec)) {
    ZERO_THROW(IoError, "test data file '{}' not found (cwd {}); set ZERO_TESTDATA", p.string(),
               fs::current_path().string());
  }
  return p;
}

}  // namespace zero::testing
