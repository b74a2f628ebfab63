// zerorun: launches a data-parallel job on this node (comm/launch/launcher.h, docs/launcher.md).
#include <cstdio>
#include <string>
#include <vector>

#include "base/error.h"
#include "comm/launch/launcher.h"

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  zero::comm::LaunchOptions options;
  try {
    options = zero::comm::parse_launch_args(args);
  } catch (const zero::InvalidArgument& e) {
    std::fprintf(stderr, "zerorun: %s\n%s", e.what(), zero::comm::launch_usage());
    return 2;
  }
  if (options.help) {
    std::fputs(zero::comm::launch_usage(), stdout);
    return 0;
  }
  try {
    return zero::comm::run_launch(options);
  } catch (const zero::InvalidArgument& e) {
    std::fprintf(stderr, "zerorun: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zerorun: %s\n", e.what());
    return 1;
  }
}
