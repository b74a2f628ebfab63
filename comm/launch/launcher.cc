// zerorun: a small torchrun-style launcher. run_launch is the sequence of the launch's phases; each
// phase lives in its own file:
//
//   launch_rendezvous  the job token and rank 0's store port (a socket bound here when it is 0)
//   launch_signals     the signal handlers and their self-pipe, installed before the first fork
//   launch_rank_env    each rank's environment
//   launch_rank_process  forking a rank into its own process group with its output pipes
//   launch_supervisor  the poll loop: output, signals, the first failure, the deadline, teardown
//   launch_outcome     the exit status and zerorun's messages about why the job ends
#include "comm/launch/launcher.h"

#include <signal.h>

#include <string>
#include <utility>
#include <vector>

#include "base/check.h"
#include "base/env.h"
#include "comm/launch/launch_outcome.h"
#include "comm/launch/launch_rank_env.h"
#include "comm/launch/launch_rank_process.h"
#include "comm/launch/launch_rendezvous.h"
#include "comm/launch/launch_signals.h"
#include "comm/launch/launch_supervisor.h"

extern char** environ;

namespace zero::comm {

namespace {

// zerorun's own environment, read here once so that the phases below take it as a value.
std::vector<std::string> current_environment() {
  std::vector<std::string> out;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) out.emplace_back(*e);
  return out;
}

// Starts the node's ranks in order and stops at the first that cannot be started (the spawn says
// why): the ranks started so far are in `ranks` either way, so that the supervisor can stop them.
// Returns whether every rank started.
bool start_ranks(const LaunchOptions& o, const Rendezvous& rendezvous, std::vector<RankProcess>& ranks) {
  const RankRendezvous shared{.token = rendezvous.token,
                              .port = rendezvous.port,
                              .store_listen_fd = rendezvous.listen_fd.valid() ? rendezvous.listen_fd.get() : -1};
  const std::vector<std::string> parent = current_environment();
  for (int local = 0; local < o.nproc_per_node; ++local) {
    const int rank = global_rank(o, local);
    const int inherit_fd = rank == 0 ? shared.store_listen_fd : -1;
    auto started = spawn_rank(rank, o.command, rank_environment(o, shared, parent, local), inherit_fd);
    if (!started) return false;
    ranks.push_back(std::move(*started));
  }
  return true;
}

// Every rank has exited. Their leftover children (still in the ranks' process groups) would keep
// the pipes open: stop them, then take what output is already there without waiting for EOF.
void stop_leftovers_and_flush_output(std::vector<RankProcess>& ranks) {
  for (const auto& r : ranks) {
    if (r.pid > 0) ::kill(-r.pid, SIGKILL);
  }
  for (auto& r : ranks) {
    for (RankOutputStream* s : {&r.out, &r.err}) {
      if (s->fd >= 0) s->read_available();
      if (s->fd >= 0) s->close();
    }
  }
}

}  // namespace

int run_launch(const LaunchOptions& o) {
  ZERO_CHECK(!o.command.empty(), "run_launch: no program");
  Rendezvous rendezvous = prepare_rendezvous(o, env_string("ZERO_JOB_TOKEN", ""));
  // Installed before the first fork: a signal that arrives while the ranks start is then forwarded to
  // them like any later one instead of killing zerorun halfway.
  LaunchSignals signals;
  std::vector<RankProcess> ranks;
  const bool all_started = start_ranks(o, rendezvous, ranks);
  rendezvous.listen_fd.reset();  // rank 0 holds its own copy now
  const JobOutcome outcome = supervise_ranks(ranks, signals, o, all_started);
  stop_leftovers_and_flush_output(ranks);
  return outcome.exit_code();
}

}  // namespace zero::comm
