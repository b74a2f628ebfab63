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
  uint16_t port = 0;  // of the store node 0's zerorun hosts
};

// What one attempt of the job tells its ranks (--max-restarts, --heartbeat-s).
struct RankAttempt {
  // Several nodes with restarts: the attempt's plan (comm/launch/launch_elastic.h) numbers the ranks;
  // -1 / 0: from the options (node_rank x nproc_per_node, nnodes x nproc_per_node).
  int first_rank = -1, world = 0, group_rank = -1;
  std::string store_prefix;  // ZERO_STORE_PREFIX: the attempt's keys in the launcher's store
  int first_world = 0;    // the world the job was launched at; 0: this attempt's
  int restart_count = 0;  // 0: the first attempt
  double failed_at = 0;   // when the failure that ended the last attempt was seen (seconds since the epoch)
  std::string reason;     // what it was
  int heartbeat_interval_ms = 0;
};

// The environment ("NAME=value" entries) of the rank with index local_rank on this node: the parent
// entries (zerorun's environment) minus the variables zerorun sets, then this rank's values of them:
// MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK,
// ZERO_JOB_TOKEN, ZERO_STORE_IN_LAUNCHER=1, ZERO_STORE_PREFIX (when the attempt has one),
// ZERO_FIRST_WORLD_SIZE, ZERO_RESTART_COUNT; ZERO_RESTART_FAILED_AT and
// ZERO_RESTART_REASON from the second attempt on; ZERO_HEARTBEAT_FD (heartbeat_fd, when >= 0) and
// ZERO_HEARTBEAT_INTERVAL_MS. Removed first so that each name appears once: an inherited value (say
// zerorun started from inside another job's rank) cannot shadow the rank's own.
std::vector<std::string> rank_environment(const LaunchOptions& options, const RankRendezvous& rendezvous,
                                          const RankAttempt& attempt, const std::vector<std::string>& parent,
                                          int local_rank, int heartbeat_fd);

// Global rank of the rank with index local_rank on this node: after the attempt's plan where one
// numbered the ranks, else node_rank x nproc_per_node + local_rank.
int global_rank(const LaunchOptions& options, const RankAttempt& attempt, int local_rank);

}  // namespace zero::comm
