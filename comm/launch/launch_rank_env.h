#pragma once
// What one rank's process gets in its environment: zerorun's own environment with the torchrun-style
// variables that read_dist_env() reads (comm/launch/dist_env.h) replaced by this rank's values.
// A pure function of its inputs (the caller passes its environment in) so that it is tested alone.
#include <cstdint>
#include <string>
#include <vector>

#include "comm/launch/launch_args.h"

namespace zero::comm {

// The rendezvous values every rank gets (comm/launch/launch_rendezvous.h), as plain values.
struct RankRendezvous {
  std::string token;
  uint16_t port = 0;
  // The listening socket rank 0 inherits (ZERO_STORE_LISTEN_FD), or -1 when the port was given.
  int store_listen_fd = -1;
};

// The environment ("NAME=value" entries) of the rank with index local_rank on this node: the parent
// entries (zerorun's environment) minus MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE, GROUP_RANK, ZERO_JOB_TOKEN and ZERO_STORE_LISTEN_FD, then this rank's values of
// them. Removed first so that each name appears once: an inherited value (say zerorun started from
// inside another job's rank) cannot shadow the rank's own. Only global rank 0 gets
// ZERO_STORE_LISTEN_FD.
std::vector<std::string> rank_environment(const LaunchOptions& options, const RankRendezvous& rendezvous,
                                          const std::vector<std::string>& parent, int local_rank);

// Global rank of the rank with index local_rank on this node.
int global_rank(const LaunchOptions& options, int local_rank);

}  // namespace zero::comm
