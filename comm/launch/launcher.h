#pragma once
// The zerorun launcher (docs/launcher.md): starts nproc_per_node copies of a program on this node
// with the torchrun-style variables that read_dist_env() reads, prefixes their output lines with
// "[rank R] ", forwards SIGINT/SIGTERM, and tears the job down when one rank fails.
#include "comm/launch/launch_args.h"  // LaunchOptions, parse_launch_args, launch_usage

namespace zero::comm {

// Runs the job and returns zerorun's exit status: 0 when every rank exits 0; otherwise the status of
// the first rank that failed (128 + signal when it was killed by one); 124 after timeout_s;
// 128 + signal when zerorun itself was interrupted. Throws InvalidArgument for an unusable setup
// (say a multi-node job without ZERO_JOB_TOKEN) and Error when the system refuses (fork, pipes).
int run_launch(const LaunchOptions& options);

}  // namespace zero::comm
