// calibrate_cluster: measures this machine for the planner and writes its cluster description
// (parallel/strategy/cluster.h) without any model's kernels, so that zero_plan --auto prices a
// model's compute from its FLOPs at the measured GEMM rate and its communication from the measured
// link. Launched on the ranks a run would use:
//
//   zerorun --nproc-per-node 2 -- calibrate_cluster --out cluster.json [--repeats 5]
//
// What it measures is parallel/strategy/calibrate.h's list. A model with a calibration program of its
// own (examples/gpt/calibrate_gpt) writes the same fields and its kernels besides.
#include <cstdio>
#include <string>

#include "base/check.h"
#include "comm/launch/process_group.h"
#include "parallel/strategy/calibrate.h"
#include "tools/cli/flags.h"

namespace zero {
namespace {

int run(int argc, char** argv) {
  cli::Flags flags(argc, argv);
  const std::string out_path = flags.get("out", "cluster.json");
  const int repeats = flags.get_int("repeats", 5);
  flags.check_all_used();
  if (out_path.empty()) ZERO_THROW(InvalidArgument, "--out is empty");
  if (repeats < 1) ZERO_THROW(InvalidArgument, "--repeats {} is not positive", repeats);
  comm::ProcessGroup pg = comm::init_process_group();
  comm::Communicator& world = *pg.host;
  const auto t0 = std::chrono::steady_clock::now();
  const strategy::MachineCalibration machine = strategy::calibrate_machine(world, repeats);
  if (world.rank() == 0) {
    strategy::write_cluster(out_path, machine.cluster, "--out");
    std::printf("wrote %s: %s (no model's kernels: compute is priced from FLOPs)\n%s", out_path.c_str(),
                machine.cluster.name.c_str(), machine.summary.c_str());
    std::printf("  took            %.1f s\n", strategy::seconds_since(t0));
    std::fflush(stdout);
  }
  world.barrier()->wait();
  return 0;
}

}  // namespace
}  // namespace zero

int main(int argc, char** argv) { return zero::cli::run_program("calibrate_cluster", zero::run, argc, argv); }
