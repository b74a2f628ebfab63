#pragma once
// Runs a program (alone, or under the zerorun launcher) from a test, with the paths resolved in the test's
// runfiles (Bazel starts tests in the runfiles root).
#include <string>
#include <vector>

namespace zero::testing {

struct LaunchResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr, rank-prefixed by zerorun
};

// program args..., with a wall-clock limit in seconds.
LaunchResult run(const std::string& program, const std::vector<std::string>& args, int timeout_s = 120);
// zerorun --nproc-per-node nproc -- program args..., with a wall-clock limit in seconds.
LaunchResult launch(int nproc, const std::string& program, const std::vector<std::string>& args,
                    int timeout_s = 120);

}  // namespace zero::testing
