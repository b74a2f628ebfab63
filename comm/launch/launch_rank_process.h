#pragma once
// One rank's process: how it is started, signalled and reaped.
//
// Every rank is forked into its own process group, so that signalling a rank reaches its own
// children too, and so that a terminal's Ctrl-C reaches zerorun only, which forwards it once. It
// gets PR_SET_PDEATHSIG so that it dies with zerorun even if zerorun is killed with SIGKILL. Its
// stdout and stderr are pipes that zerorun reads (RankOutputStream).
#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "comm/launch/launch_output.h"

namespace zero::comm {

struct RankProcess {
  int rank = 0;        // global rank, for messages and the output prefix
  pid_t pid = -1;      // also its process group id
  bool running = false;
  RankOutputStream out, err;
  // zerorun's end of the rank's heartbeat socket (--heartbeat-s; comm/launch/heartbeat.h), -1 when
  // not watched or closed. The rank is watched from its first beat on: a program that never starts
  // a process group never beats, and is not taken as silent.
  int heartbeat_fd = -1;
  std::chrono::steady_clock::time_point last_beat{};
  bool beating = false;
};

// Forks and execs `command` (searched in PATH) as global rank `rank` with exactly `env`, keeping
// `inherit_fd` (>= 0) open across exec. A child that cannot exec prints "zerorun: cannot execute
// ..." and exits 127. Returns nullopt, after saying why, when a pipe or the fork fails.
std::optional<RankProcess> spawn_rank(int rank, const std::vector<std::string>& command,
                                      const std::vector<std::string>& env, int inherit_fd);

// Sends sig to the rank's whole process group (its own children included), or to the rank alone
// when the group is gone.
void signal_rank(const RankProcess& r, int sig);

// The rank's waitpid status if it has exited (it is then no longer running), without blocking.
std::optional<int> reap_if_exited(RankProcess& r);

}  // namespace zero::comm
