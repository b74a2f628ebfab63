#pragma once
// The zerorun launcher (docs/launcher.md): starts nproc_per_node copies of a program on this node
// with the torchrun-style variables that read_dist_env() reads, prefixes their output lines with
// "[rank R] ", forwards SIGINT/SIGTERM, and tears the job down when one rank fails.
#include <string>
#include <vector>

namespace zero::comm {

struct LaunchOptions {
  int nproc_per_node = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  bool master_addr_given = false;
  // 0: pick a free port (single node only). The launcher binds it and hands the listening socket
  // to rank 0 (ZERO_STORE_LISTEN_FD), so no other process can take it in between.
  int master_port = 0;
  // Wall-clock limit of the whole job; 0 = none. Past it the ranks are stopped and zerorun exits 124.
  double timeout_s = 0;
  // Between SIGTERM and SIGKILL when tearing the job down.
  double grace_s = 3;
  // After a rank fails, how long the others may take to exit on their own before SIGTERM: a
  // surviving rank's collective fails at once when its peer dies, and this lets it say so (which
  // operation, which ranks never reached it) instead of being killed mid-sentence.
  double report_s = 5;
  bool help = false;
  std::vector<std::string> command;  // program and its arguments
};

// Parses `zerorun [flags] [--] program args...` (argv without argv[0]); flags also take the
// --flag=value form. Throws InvalidArgument naming the flag.
LaunchOptions parse_launch_args(const std::vector<std::string>& args);

const char* launch_usage();

// Runs the job and returns zerorun's exit status: 0 when every rank exits 0; otherwise the status of
// the first rank that failed (128 + signal when it was killed by one); 124 after timeout_s;
// 128 + signal when zerorun itself was interrupted. Throws InvalidArgument for an unusable setup
// (say a multi-node job without ZERO_JOB_TOKEN) and Error when the system refuses (fork, pipes).
int run_launch(const LaunchOptions& options);

}  // namespace zero::comm
