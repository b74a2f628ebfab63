// zerorun: a small torchrun-style launcher. run_launch is the sequence of the launch's phases, run
// once, or once per attempt with --max-restarts; each phase lives in its own file:
//
//   launch_rendezvous  the job token, and the rendezvous store node 0 hosts for the whole job
//   launch_elastic     several nodes with restarts: the launchers' joins, plans and failure claims
//   launch_signals     the signal handlers and their self-pipe, installed before the first fork
//   launch_rank_env    each rank's environment
//   launch_rank_process  forking a rank into its own process group with its output pipes
//   launch_supervisor  the poll loop: output, heartbeats, signals, the first failure, the deadline,
//                      teardown
//   launch_outcome     the exit status, the lost ranks, and zerorun's messages about why the job ends
#include "comm/launch/launcher.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <chrono>
#include <memory>
#include <numeric>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "base/check.h"
#include "base/env.h"
#include "comm/launch/launch_elastic.h"
#include "comm/launch/launch_outcome.h"
#include "comm/launch/launch_output.h"
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

// The interval ranks beat at under --heartbeat-s: a tenth of it (so that a busy machine's late beat
// is not silence), between 10 ms and one second.
int heartbeat_interval_ms(double heartbeat_s) {
  return static_cast<int>(std::clamp(heartbeat_s * 100.0, 10.0, 1000.0));
}

// Starts the node's ranks in order and stops at the first that cannot be started (the spawn says
// why): the ranks started so far are in `ranks` either way, so that the supervisor can stop them.
// Under --heartbeat-s each rank gets one end of a socket pair (ZERO_HEARTBEAT_FD) and zerorun keeps
// the other. Returns whether every rank started.
bool start_ranks(const LaunchOptions& o, const RankRendezvous& rendezvous, const RankAttempt& attempt,
                 std::vector<RankProcess>& ranks) {
  const std::vector<std::string> parent = current_environment();
  for (int local = 0; local < o.nproc_per_node; ++local) {
    int beat[2] = {-1, -1};
    if (o.heartbeat_s > 0 && ::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, beat) != 0) {
      say(fmt::format("socketpair: {}", std::strerror(errno)));
      return false;
    }
    auto started = spawn_rank(global_rank(o, attempt, local), o.command,
                              rank_environment(o, rendezvous, attempt, parent, local, beat[1]), beat[1]);
    if (beat[1] >= 0) ::close(beat[1]);  // the rank's end, which it holds now
    if (!started) {
      if (beat[0] >= 0) ::close(beat[0]);
      return false;
    }
    if (beat[0] >= 0) ::fcntl(beat[0], F_SETFL, ::fcntl(beat[0], F_GETFL) | O_NONBLOCK);
    started->heartbeat_fd = beat[0];
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
    if (r.heartbeat_fd >= 0) ::close(r.heartbeat_fd);
    r.heartbeat_fd = -1;
  }
}

std::string rank_list(const std::vector<int>& ranks) {
  return fmt::format("{}", fmt::join(ranks, ", "));
}

}  // namespace

int run_launch(const LaunchOptions& options) {
  ZERO_CHECK(!options.command.empty(), "run_launch: no program");
  const std::string token = job_token(options, env_string("ZERO_JOB_TOKEN", ""));
  // Installed before the first fork: a signal that arrives while the ranks start is then forwarded to
  // them like any later one instead of killing zerorun halfway.
  LaunchSignals signals;
  // Node 0 hosts the store for the whole job. Attempt a's ranks use its keys under "attempt<a>/", so
  // that no key of a failed attempt (a dead rank's address, a half-done barrier) is read again.
  std::unique_ptr<TcpStoreServer> server;
  if (options.node_rank == 0) server = host_rendezvous_store(options, token);
  const uint16_t port = server ? server->port() : static_cast<uint16_t>(options.master_port);
  const auto join_timeout = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::duration<double>(options.join_timeout_s));
  // Several nodes with restarts: the launchers meet on the board (comm/launch/launch_elastic.h).
  std::unique_ptr<JobBoard> board;
  if (options.nnodes > 1 && options.max_restarts > 0) {
    board = std::make_unique<JobBoard>(
        std::make_shared<TcpStore>(TcpStoreOptions{.host = options.master_addr, .port = port, .token = token,
                                                   .timeout = join_timeout + std::chrono::seconds(60)}),
        options.node_rank, join_timeout);
  }
  LaunchOptions o = options;  // o.nproc_per_node: this node's ranks in this attempt
  RankAttempt attempt{.first_world = options.nnodes * options.nproc_per_node,
                      .heartbeat_interval_ms = heartbeat_interval_ms(options.heartbeat_s)};
  // The nodes node 0 waits for at the next join: all at first, then the last attempt's less the lost.
  std::vector<int> awaited(static_cast<size_t>(options.nnodes));
  std::iota(awaited.begin(), awaited.end(), 0);
  // A node that starts while the job runs (a replacement) joins the next attempt.
  bool newcomer = board && options.node_rank != 0 && board->current_attempt() >= 0;
  // Node 0 tells a newcomer still waiting that the job is over, however it ends.
  struct JobEnd {
    JobBoard* board;
    ~JobEnd() {
      try {
        if (board != nullptr) board->end_job();
      } catch (const std::exception&) {
      }
    }
  } const job_end{options.node_rank == 0 ? board.get() : nullptr};
  while (true) {
    std::optional<JobBoard::Plan> plan;
    if (newcomer) {
      say(fmt::format("the job is at attempt {}; this node joins the next, which node 0 starts with it",
                      board->current_attempt()));
      plan = board->join_running(o.nproc_per_node);
      if (!plan) {
        say("the job ended before this node could join it");
        return 0;
      }
      attempt.restart_count = plan->attempt;
      if (const std::optional<std::string> why = board->failure(plan->attempt - 1)) attempt.reason = *why;
      newcomer = false;
    }
    const int a = attempt.restart_count;
    attempt.store_prefix = fmt::format("attempt{}", a);
    if (board) {
      if (!plan) plan = board->join(a, o.nproc_per_node, awaited, options.min_nnodes, options.nnodes);
      if (!plan) {
        say(fmt::format("this node has no place in attempt {} of the job; leaving it", a));
        return 1;
      }
      attempt.first_rank = plan->first_rank;
      attempt.world = plan->world;
      attempt.group_rank = plan->node_index;
      if (a > 0) say(fmt::format("attempt {} runs on {} ({} ranks)", a, plan->text(), plan->world));
    }
    const RankRendezvous rendezvous{.token = token, .port = port};
    // A node is silent after 1 s without a beat (they come every 200 ms).
    FailureBoard failures{.claim = [&](const std::string& what) { return board->claim_failure(a, what); },
                          .elsewhere = [&] { return board->failure(a); },
                          .beat = [&] { board->beat(a, *plan); },
                          .silent_node = [&]() -> std::optional<int> {
                            const std::vector<int> silent = board->silent_nodes(*plan, std::chrono::seconds(1));
                            for (int node : silent) board->mark_lost(a, node);
                            if (silent.empty()) return std::nullopt;
                            return silent.front();
                          },
                          .newcomer = [&] { return options.node_rank == 0 && board->newcomer(a); }};
    std::vector<RankProcess> ranks;
    const bool all_started = start_ranks(o, rendezvous, attempt, ranks);
    const SupervisedJob job = supervise_ranks(ranks, signals, o, all_started, board ? &failures : nullptr);
    stop_leftovers_and_flush_output(ranks);
    const JobOutcome& outcome = job.outcome;
    if (outcome.exit_code() == 0) {
      if (board) {
        board->done(a);
        // Node 0's store serves the others until they are done too.
        if (options.node_rank == 0) board->wait_for_nodes(a, *plan, join_timeout + std::chrono::seconds(60));
      }
      return 0;
    }
    const bool failed = outcome.reason() == StopReason::kRankFailed || outcome.reason() == StopReason::kPeerFailed;
    // A node lost whole will not join the next attempt: node 0 waits for the others alone.
    if (board) {
      try {
        awaited = board->kept_nodes(a, *plan);
      } catch (const std::exception&) {
      }
    }
    if (!failed || options.max_restarts == 0) return outcome.exit_code();
    if (const int sig = signals.take_new_signal(); sig != 0) {
      say(fmt::format("got signal {} while the job was stopping; not restarting", sig));
      return 128 + sig;
    }
    if (attempt.restart_count == options.max_restarts) {
      say(fmt::format("no restart left (--max-restarts={})", options.max_restarts));
      return outcome.exit_code();
    }
    const int left = o.nproc_per_node - static_cast<int>(outcome.lost_ranks().size());
    if (left < options.min_nproc) {
      say(fmt::format("{} rank(s) left after losing rank(s) {}: fewer than --min-nproc={}; not restarting", left,
                      rank_list(outcome.lost_ranks()), options.min_nproc));
      // A node that leaves says so at the next attempt, so that node 0 need not wait for it.
      if (board && options.node_rank != 0) board->join(a + 1, 0, awaited, 0, options.nnodes);
      return outcome.exit_code();
    }
    ++attempt.restart_count;
    attempt.failed_at = job.failed_at;
    // Under several nodes, the failure every node's ranks are told of is the one claimed first.
    std::optional<std::string> claimed;
    if (board) {
      try {
        claimed = board->failure(a);
      } catch (const std::exception&) {
      }
    }
    attempt.reason = claimed.value_or(outcome.failure());
    say(outcome.lost_ranks().empty()
            ? fmt::format("restart {} of {}: the job failed elsewhere; starting this node's {} rank(s) again",
                          attempt.restart_count, options.max_restarts, left)
        : board ? fmt::format("restart {} of {}: lost rank(s) {} of this node's {}; starting its {} rank(s) again",
                              attempt.restart_count, options.max_restarts, rank_list(outcome.lost_ranks()),
                              o.nproc_per_node, left)
                : fmt::format("restart {} of {}: lost rank(s) {} of {}; starting the job again on {} rank(s)",
                              attempt.restart_count, options.max_restarts, rank_list(outcome.lost_ranks()),
                              o.nproc_per_node, left));
    o.nproc_per_node = left;
  }
}

}  // namespace zero::comm
