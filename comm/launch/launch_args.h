#pragma once
// zerorun's command line: the options a launch runs with, how they are parsed, and the usage text.
// Kept apart from the launch itself so that parsing is tested without starting processes
// (launcher_args_test); callers include comm/launch/launcher.h, which includes this.
#include <string>
#include <vector>

namespace zero::comm {

struct LaunchOptions {
  int nproc_per_node = 1;
  int nnodes = 1;
  // --nnodes MIN:MAX: with --max-restarts, the fewest nodes a restarted job goes on with (a node
  // whose zerorun is gone, or that has no rank left, is left out); nnodes is MAX.
  int min_nnodes = 1;
  // With several nodes and --max-restarts: how long node 0 waits for every node to join an attempt
  // before going on with those that did.
  double join_timeout_s = 30;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  bool master_addr_given = false;
  // The rendezvous store's port, which node 0's zerorun hosts; 0: a free one (single node only).
  int master_port = 0;
  // Wall-clock limit of the whole job; 0 = none. Past it the ranks are stopped and zerorun exits 124.
  double timeout_s = 0;
  // Between SIGTERM and SIGKILL when tearing the job down.
  double grace_s = 3;
  // After a rank fails, how long the others may take to exit on their own before SIGTERM: a
  // surviving rank's collective fails at once when its peer dies, and this lets it say so (which
  // operation, which ranks never reached it) instead of being killed mid-sentence.
  double report_s = 5;
  // Elastic restarts: after a rank fails, the job starts again on the others, up to max_restarts
  // times, while at least min_nproc ranks are left on this node (docs/reliability.md).
  int max_restarts = 0;
  int min_nproc = 1;
  // A rank whose heartbeat (comm/launch/heartbeat.h) stops for this long is taken as gone: killed,
  // and the job ends or restarts as for any failed rank. 0: not watched.
  double heartbeat_s = 0;
  bool help = false;
  std::vector<std::string> command;  // program and its arguments
};

// Parses `zerorun [flags] [--] program args...` (argv without argv[0]); flags also take the
// --flag=value form. Throws InvalidArgument naming the flag.
LaunchOptions parse_launch_args(const std::vector<std::string>& args);

const char* launch_usage();

}  // namespace zero::comm
